package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Defaults and bounds of the configuration file.
const (
	DefaultTimeout        = 5 * time.Second  // timeout_ms of a config tool
	DefaultServerTimeout  = 30 * time.Second // timeout_ms of a call to a stdio server
	DefaultMaxOutputBytes = 1 << 20          // max_output_bytes of a config tool
	maxTimeout            = 24 * time.Hour
	maxConfigBytes        = 4 << 20
	maxToolNameLen        = 128
	namespaceSeparator    = "."
	notifyDisabled        = "disabled"
	toolTypeSubprocess    = "subprocess"
	toolTypeHTTP          = "http"
	toolTypeTCP           = "tcp"
	modeSync              = "sync"
	modeBackground        = "background"
	completedNotification = "notifications/tools/completed"
	defaultHTTPMethod     = "POST"
)

// File is the agent's configuration file as written: the "mcp" section of
// a XiaoZhi Linux client's xiaozhi_config.json plus the "mcpServers"
// section of the common MCP client configuration. Other top-level keys are
// ignored, so one file can serve both programs.
type File struct {
	MCP struct {
		Enabled *bool        `json:"enabled"`
		Tools   []ToolConfig `json:"tools"`
	} `json:"mcp"`
	MCPServers map[string]ServerConfig `json:"mcpServers"`
}

// ToolConfig is one tool the agent runs itself.
type ToolConfig struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
	Type        string          `json:"type"` // subprocess, http or tcp
	Mode        string          `json:"mode"` // sync (default) or background
	TimeoutMs   int64           `json:"timeout_ms"`
	Notify      *NotifyConfig   `json:"notify"`
	Enable      *bool           `json:"enable"`
	// subprocess
	Executable string   `json:"executable"`
	Args       []string `json:"args"`
	// http
	URL    string `json:"url"`
	Method string `json:"method"`
	// tcp
	Address string `json:"address"`
	// MaxOutputBytes bounds what the tool may answer (stdout, HTTP body,
	// TCP reply); default 1 MiB.
	MaxOutputBytes int `json:"max_output_bytes"`
}

// NotifyConfig says how a background tool reports its completion.
type NotifyConfig struct {
	Type string `json:"type"` // "mcp" (default) or "disabled"
}

// ServerConfig is one stdio MCP server the agent starts and relays.
type ServerConfig struct {
	Command string            `json:"command"`
	Args    []string          `json:"args"`
	Env     map[string]string `json:"env"`
	Enable  *bool             `json:"enable"`
	// TimeoutMs bounds one call to the server; default 30000.
	TimeoutMs int64 `json:"timeout_ms"`
	// Tools declares the server's tools ahead of it ("fast connect"): they
	// are listed at once and calls wait for the server. An entry with
	// "enable": false hides that tool of the server.
	Tools []DeclaredTool `json:"tools"`
}

// DeclaredTool is a tool of a stdio server known before the server runs.
type DeclaredTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
	// input_schema is accepted too, as in the mcp section.
	InputSchemaAlt json.RawMessage `json:"input_schema"`
	Enable         *bool           `json:"enable"`
}

// Config is a parsed and checked configuration.
type Config struct {
	Tools   []*LocalTool    // enabled config tools
	Servers []*ServerConfig // enabled stdio servers, sorted by name
	names   []string        // of Servers, same order
}

// ServerName returns the name of Servers[i].
func (c *Config) ServerName(i int) string { return c.names[i] }

// LocalTool is a checked config tool ready to run.
type LocalTool struct {
	ToolConfig
	schema     json.RawMessage // the input schema sent in tools/list
	validator  *jsonschema.Schema
	timeout    time.Duration
	background bool
	notify     bool
	argv       []string // subprocess: executable and arguments
}

// Timeout returns the tool's time limit.
func (t *LocalTool) Timeout() time.Duration { return t.timeout }

// LoadConfig reads and parses the configuration file at path.
func LoadConfig(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxConfigBytes)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig parses and checks a configuration. Every error names the
// tool or server it is about; nothing is started.
func ParseConfig(data []byte) (*Config, error) {
	var f File
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("not a JSON configuration: %w", err)
	}
	if dec.More() {
		return nil, errors.New("trailing data after the JSON configuration")
	}
	c := &Config{}
	seen := map[string]bool{}
	if f.MCP.Enabled == nil || *f.MCP.Enabled {
		for i := range f.MCP.Tools {
			tc := f.MCP.Tools[i]
			if tc.Enable != nil && !*tc.Enable {
				continue
			}
			t, err := checkTool(tc)
			if err != nil {
				return nil, fmt.Errorf("mcp.tools[%d] %q: %w", i, tc.Name, err)
			}
			if seen[t.Name] {
				return nil, fmt.Errorf("mcp.tools[%d]: tool %q is defined twice", i, t.Name)
			}
			seen[t.Name] = true
			c.Tools = append(c.Tools, t)
		}
	}
	names := make([]string, 0, len(f.MCPServers))
	for name := range f.MCPServers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		s := f.MCPServers[name]
		if s.Enable != nil && !*s.Enable {
			continue
		}
		if err := checkServer(name, &s); err != nil {
			return nil, fmt.Errorf("mcpServers %q: %w", name, err)
		}
		for _, d := range s.Tools {
			if d.Enable != nil && !*d.Enable {
				continue
			}
			full := name + namespaceSeparator + d.Name
			if seen[full] {
				return nil, fmt.Errorf("mcpServers %q: tool %q clashes with another tool", name, full)
			}
			seen[full] = true
		}
		c.Servers = append(c.Servers, &s)
		c.names = append(c.names, name)
	}
	return c, nil
}

func checkTool(tc ToolConfig) (*LocalTool, error) {
	if err := checkToolName(tc.Name); err != nil {
		return nil, err
	}
	t := &LocalTool{ToolConfig: tc}
	var err error
	if t.schema, t.validator, err = compileSchema(tc.InputSchema); err != nil {
		return nil, err
	}
	if t.timeout, err = checkTimeout(tc.TimeoutMs, DefaultTimeout); err != nil {
		return nil, err
	}
	if t.MaxOutputBytes < 0 {
		return nil, errors.New("max_output_bytes must not be negative")
	}
	if t.MaxOutputBytes == 0 {
		t.MaxOutputBytes = DefaultMaxOutputBytes
	}
	switch strings.ToLower(tc.Mode) {
	case "", modeSync, "async": // "async" (awaited without blocking) is sync for the caller
	case modeBackground:
		t.background = true
	default:
		return nil, fmt.Errorf("mode %q is neither sync nor background", tc.Mode)
	}
	t.notify = t.background
	if tc.Notify != nil && strings.EqualFold(tc.Notify.Type, notifyDisabled) {
		t.notify = false
	}
	switch strings.ToLower(tc.Type) {
	case toolTypeSubprocess:
		if tc.Executable == "" {
			return nil, errors.New("a subprocess tool needs executable")
		}
		t.argv = append([]string{tc.Executable}, tc.Args...)
		// "executable": "python3 calc.py" as some configurations write it:
		// split on white space (no shell) unless a file has that name.
		if len(tc.Args) == 0 && strings.ContainsAny(tc.Executable, " \t") {
			if _, err := os.Stat(tc.Executable); err != nil {
				t.argv = strings.Fields(tc.Executable)
			}
		}
	case toolTypeHTTP:
		u, err := url.Parse(tc.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("url %q is not an http:// or https:// URL", tc.URL)
		}
		switch strings.ToUpper(tc.Method) {
		case "":
			t.Method = defaultHTTPMethod
		case "GET", "POST":
			t.Method = strings.ToUpper(tc.Method)
		default:
			return nil, fmt.Errorf("method %q is neither GET nor POST", tc.Method)
		}
	case toolTypeTCP:
		if _, port, err := net.SplitHostPort(tc.Address); err != nil || port == "" {
			return nil, fmt.Errorf("address %q is not host:port", tc.Address)
		}
	default:
		return nil, fmt.Errorf("type %q is not subprocess, http or tcp", tc.Type)
	}
	t.Type = strings.ToLower(tc.Type)
	return t, nil
}

func checkServer(name string, s *ServerConfig) error {
	if err := checkToolName(name); err != nil {
		return fmt.Errorf("server name: %w", err)
	}
	if strings.Contains(name, namespaceSeparator) {
		return fmt.Errorf("server name must not contain %q", namespaceSeparator)
	}
	if s.Command == "" {
		return errors.New("command is required")
	}
	var err error
	if _, err = checkTimeout(s.TimeoutMs, DefaultServerTimeout); err != nil {
		return err
	}
	for i, d := range s.Tools {
		if err := checkToolName(d.Name); err != nil {
			return fmt.Errorf("tools[%d]: %w", i, err)
		}
		if len(name)+1+len(d.Name) > maxToolNameLen {
			return fmt.Errorf("tools[%d]: %q is too long with the server prefix", i, d.Name)
		}
		raw := d.InputSchema
		if len(raw) == 0 {
			raw = d.InputSchemaAlt
		}
		if _, _, err := compileSchema(raw); err != nil {
			return fmt.Errorf("tools[%d] %q: %w", i, d.Name, err)
		}
	}
	return nil
}

// checkToolName applies MCP's tool name rule: 1-128 of A-Z a-z 0-9 _ - .
func checkToolName(name string) error {
	if name == "" {
		return errors.New("name is required")
	}
	if len(name) > maxToolNameLen {
		return fmt.Errorf("name is longer than %d characters", maxToolNameLen)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return fmt.Errorf("name %q may hold only letters, digits, \"_\", \"-\" and \".\" characters", name)
		}
	}
	return nil
}

func checkTimeout(ms int64, def time.Duration) (time.Duration, error) {
	switch {
	case ms < 0:
		return 0, errors.New("timeout_ms must not be negative")
	case ms == 0:
		return def, nil
	case time.Duration(ms)*time.Millisecond > maxTimeout:
		return 0, fmt.Errorf("timeout_ms is above %d", maxTimeout.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// compileSchema checks an input schema and returns it as sent in
// tools/list. A missing or empty schema, or one without "type", accepts any
// object (MCP requires type "object"); any other type is an error.
func compileSchema(raw json.RawMessage) (json.RawMessage, *jsonschema.Schema, error) {
	var m map[string]any
	if t := bytes.TrimSpace(raw); len(t) == 0 || bytes.Equal(t, []byte("null")) {
		m = map[string]any{}
	} else {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(t))
		if err != nil {
			return nil, nil, fmt.Errorf("input_schema is not JSON: %w", err)
		}
		var ok bool
		if m, ok = v.(map[string]any); !ok {
			return nil, nil, errors.New("input_schema is not a JSON object")
		}
	}
	switch typ := m["type"]; typ {
	case nil:
		m["type"] = "object"
	case "object":
	default:
		return nil, nil, fmt.Errorf(`input_schema must have type "object", not %v`, typ)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("input_schema.json", m); err != nil {
		return nil, nil, fmt.Errorf("input_schema: %w", err)
	}
	s, err := c.Compile("input_schema.json")
	if err != nil {
		return nil, nil, fmt.Errorf("input_schema does not compile: %w", err)
	}
	out, err := json.Marshal(m)
	if err != nil {
		return nil, nil, fmt.Errorf("input_schema: %w", err)
	}
	return out, s, nil
}

// validateArgs checks call arguments against a compiled schema; nil or
// absent arguments are the empty object.
func validateArgs(s *jsonschema.Schema, args json.RawMessage) (json.RawMessage, error) {
	t := bytes.TrimSpace(args)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		t = []byte("{}")
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(t))
	if err != nil {
		return nil, fmt.Errorf("arguments are not JSON: %w", err)
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, errors.New("arguments are not a JSON object")
	}
	if err := s.Validate(v); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("invalid arguments: %s", strings.ReplaceAll(ve.Error(), "\n", "; "))
		}
		return nil, fmt.Errorf("invalid arguments: %w", err)
	}
	return t, nil
}
