// Package catalog indexes a device's MCP tool catalog (the JSON array of
// tools a devicehub lists) and validates tool arguments against each tool's
// inputSchema before a call reaches the device.
//
// Catalogs come from devices, so they are untrusted: a schema never loads
// anything from outside (no file or network $ref), and a schema that does not
// compile disables validation for that tool only (the device still checks its
// own arguments).
package catalog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// Catalog is one node's tool catalog. It is parsed on first use, so holding
// thousands of catalogs that are never called costs only their bytes.
type Catalog struct {
	raw     json.RawMessage
	schemas *Schemas

	once  sync.Once
	tools map[string]*Tool
	names []string
	err   error
}

// Tool is one tool of a catalog.
type Tool struct {
	Name      string
	schemaRaw json.RawMessage
	schemas   *Schemas

	once     sync.Once
	compiled *compiled
}

// compiled is a tool's input schema, ready to check arguments.
type compiled struct {
	schema *jsonschema.Schema // nil: the schema does not compile
	flat   *flatSchema        // nil: the schema is not flat
}

// New returns the catalog held in raw (a JSON array of MCP tools; empty means
// no tools). Schemas are compiled through schemas and shared with every other
// catalog that carries a byte-identical schema.
func New(raw json.RawMessage, schemas *Schemas) *Catalog {
	return &Catalog{raw: raw, schemas: schemas}
}

type toolJSON struct {
	Name        string          `json:"name"`
	InputSchema json.RawMessage `json:"inputSchema"`
}

func (c *Catalog) parse() {
	c.tools = map[string]*Tool{}
	if len(bytes.TrimSpace(c.raw)) == 0 {
		return
	}
	var list []toolJSON
	if err := json.Unmarshal(c.raw, &list); err != nil {
		c.err = fmt.Errorf("tool catalog is not a JSON array of tools: %w", err)
		return
	}
	for _, t := range list {
		if t.Name == "" {
			continue
		}
		if _, dup := c.tools[t.Name]; dup {
			continue // the first listing wins, as a device pages tools in order
		}
		c.tools[t.Name] = &Tool{Name: t.Name, schemaRaw: t.InputSchema, schemas: c.schemas}
		c.names = append(c.names, t.Name)
	}
	slices.Sort(c.names)
}

// Err reports a catalog that could not be parsed (it then has no tools).
func (c *Catalog) Err() error {
	c.once.Do(c.parse)
	return c.err
}

// Tool returns the named tool.
func (c *Catalog) Tool(name string) (*Tool, bool) {
	c.once.Do(c.parse)
	t, ok := c.tools[name]
	return t, ok
}

// Names returns the tool names, sorted. The slice is shared: do not modify it.
func (c *Catalog) Names() []string {
	c.once.Do(c.parse)
	return c.names
}

// Len is the number of tools.
func (c *Catalog) Len() int {
	c.once.Do(c.parse)
	return len(c.names)
}

// ArgumentError explains why arguments do not match a tool's inputSchema. Its
// message names the offending argument and the violated rule.
type ArgumentError struct {
	Tool    string
	Problem string
}

func (e *ArgumentError) Error() string {
	return "invalid arguments for " + e.Tool + ": " + e.Problem
}

// Validate checks args (a JSON object; empty means {}) against the tool's
// inputSchema and returns an *ArgumentError when they do not match. A tool
// without a usable schema accepts any arguments.
func (t *Tool) Validate(args json.RawMessage) error {
	t.once.Do(func() { t.compiled = t.schemas.compile(t.schemaRaw) })
	c := t.compiled
	if c == nil || c.schema == nil {
		return nil
	}
	if c.flat != nil && c.flat.plainlyValid(args) {
		return nil
	}
	var inst any = map[string]any{}
	if len(args) > 0 {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
		if err != nil {
			return &ArgumentError{Tool: t.Name, Problem: "arguments are not valid JSON"}
		}
		inst = v
	}
	err := c.schema.Validate(inst)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return &ArgumentError{Tool: t.Name, Problem: err.Error()}
	}
	return &ArgumentError{Tool: t.Name, Problem: t.schemas.describe(ve)}
}

// Schemas compiles tool input schemas and keeps them by their exact bytes, so
// a fleet of devices with one firmware compiles each schema once. Safe for
// concurrent use.
type Schemas struct {
	mu       sync.Mutex
	compiled map[string]*compiled
	max      int
	printer  *message.Printer
}

// NewSchemas returns a cache holding at most max distinct schemas (0 means
// 4096); beyond that, schemas are compiled per tool and not shared.
func NewSchemas(max int) *Schemas {
	if max <= 0 {
		max = 4096
	}
	return &Schemas{compiled: map[string]*compiled{}, max: max, printer: message.NewPrinter(language.English)}
}

// maxSchemaBytes bounds what the shim compiles; bigger schemas are left to
// the device to enforce.
const maxSchemaBytes = 64 << 10

func (s *Schemas) compile(raw json.RawMessage) *compiled {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) || len(raw) > maxSchemaBytes {
		return nil
	}
	key := string(raw)
	s.mu.Lock()
	sch, ok := s.compiled[key]
	s.mu.Unlock()
	if ok {
		return sch
	}
	sch = compileSchema(raw)
	s.mu.Lock()
	if len(s.compiled) < s.max {
		s.compiled[key] = sch
	}
	s.mu.Unlock()
	return sch
}

// schemaURL names the in-memory schema document; relative $refs resolve
// against it and are then refused by the loader.
const schemaURL = "https://xiaoclaw.invalid/tool-input-schema.json"

func compileSchema(raw []byte) *compiled {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return &compiled{}
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(refuseLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return &compiled{}
	}
	sch, err := c.Compile(schemaURL)
	if err != nil {
		return &compiled{}
	}
	return &compiled{schema: sch, flat: newFlatSchema(doc)}
}

// refuseLoader keeps device-supplied schemas from reading files or URLs.
type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("external schema %q not allowed", url)
}

// describe turns a validation error into one line naming the arguments and
// the rules they break (at most three problems).
func (s *Schemas) describe(ve *jsonschema.ValidationError) string {
	var leaves []*jsonschema.ValidationError
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			leaves = append(leaves, e)
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	// The validator reports object properties in map order: sort by
	// argument so the same call always gets the same message.
	slices.SortStableFunc(leaves, func(a, b *jsonschema.ValidationError) int {
		return strings.Compare(strings.Join(a.InstanceLocation, "."), strings.Join(b.InstanceLocation, "."))
	})
	var b strings.Builder
	for i, l := range leaves {
		if i == 3 {
			fmt.Fprintf(&b, " (and %d more)", len(leaves)-3)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(s.describeLeaf(l))
	}
	return b.String()
}

func (s *Schemas) describeLeaf(e *jsonschema.ValidationError) string {
	s.mu.Lock() // message.Printer is not documented as safe for concurrent use
	defer s.mu.Unlock()
	path := strings.Join(e.InstanceLocation, ".")
	switch k := e.ErrorKind.(type) {
	case *kind.Required:
		names := make([]string, len(k.Missing))
		for i, m := range k.Missing {
			names[i] = join(path, m)
		}
		if len(names) == 1 {
			return fmt.Sprintf("missing argument %q", names[0])
		}
		return "missing arguments " + quoteAll(names)
	case *kind.AdditionalProperties:
		names := make([]string, len(k.Properties))
		for i, p := range k.Properties {
			names[i] = join(path, p)
		}
		return "unexpected argument(s) " + quoteAll(names)
	}
	msg := e.ErrorKind.LocalizedString(s.printer)
	if path == "" {
		return "arguments: " + msg
	}
	return fmt.Sprintf("argument %q: %s", path, msg)
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}
