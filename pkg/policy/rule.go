package policy

import (
	"fmt"
	"strings"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/toolcall"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Command names that carry a tool call; the v1 form is the same action.
const (
	CommandToolCall   = toolcall.CommandCall
	CommandToolCallV1 = toolcall.CommandCallV1
	// ToolActionPrefix starts the action of a tool call: "mcp.tools.call:<tool>".
	ToolActionPrefix = CommandToolCall + ":"
)

// Subject forms.
const (
	SubjectAny  = "*"
	RolePrefix  = "role:"
	GroupPrefix = "group:"
	// UpstreamPrefix starts the principal id of the calls an OpenClaw
	// gateway sends to devices published to it: "upstream:<name>".
	UpstreamPrefix = "upstream:"
)

// Action is the policy action of a command: the command itself, or
// "mcp.tools.call:<tool>" for every command that calls a tool
// (toolcall.IsToolCall), whichever spelling it uses.
func Action(command, tool string) string {
	if toolcall.IsToolCall(command) {
		return ToolActionPrefix + tool
	}
	return command
}

const maxPatternLen = 256

// validPattern: printable ASCII without spaces, commas or quotes (which
// have no place in ids, commands or tool names).
func validPattern(s string) bool {
	if s == "" || len(s) > maxPatternLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == ',' || c == '"' || c == '\'' || c == '\\' {
			return false
		}
	}
	return true
}

// CheckRule validates a rule and rewrites it to canonical form; it is the
// tenancy.ManagerConfig.CheckRule of a deployment.
//
//   - Subject: "*", a role ("role:operator", or just "operator"), a
//     principal id (e.g. a token id "tok_…"), or an upstream OpenClaw
//     gateway "upstream:<name>".
//   - Object: "*", a node id glob ("xz-*", "?" is one character), or a node
//     group "group:<name>".
//   - Action: a command or a glob of commands ("system.*", "*"); tool calls
//     are "mcp.tools.call:<tool or glob>". "mcp.tools.call.v1:<tool>" and
//     a bare "mcp.tools.call" (all tools) are rewritten.
//   - When: a predicate (see ParseWhen), only on tool-call actions.
func CheckRule(r *tenancy.Rule) error {
	if err := wire.ValidTenant(r.Tenant); err != nil {
		return err
	}
	if r.Effect != tenancy.EffectAllow && r.Effect != tenancy.EffectDeny {
		return fmt.Errorf("effect must be allow or deny, not %q", r.Effect)
	}
	sub, err := canonicalSubject(r.Subject)
	if err != nil {
		return err
	}
	obj, err := canonicalObject(r.Object)
	if err != nil {
		return err
	}
	act, err := canonicalAction(r.Action)
	if err != nil {
		return err
	}
	pred, err := ParseWhen(r.When)
	if err != nil {
		return fmt.Errorf("when: %w", err)
	}
	if pred != nil && !strings.HasPrefix(act, ToolActionPrefix) {
		return fmt.Errorf("when needs a tool-call action (%s<tool>), not %q", ToolActionPrefix, act)
	}
	r.Subject, r.Object, r.Action, r.When = sub, obj, act, pred.String()
	return nil
}

func canonicalSubject(s string) (string, error) {
	switch s {
	case SubjectAny:
		return s, nil
	case access.RoleAdmin, access.RoleOperator, access.RoleViewer:
		return RolePrefix + s, nil
	}
	if role, ok := strings.CutPrefix(s, RolePrefix); ok {
		switch role {
		case access.RoleAdmin, access.RoleOperator, access.RoleViewer:
			return s, nil
		}
		return "", fmt.Errorf("subject %q: roles are admin, operator and viewer", s)
	}
	if name, ok := strings.CutPrefix(s, UpstreamPrefix); ok {
		if wire.ValidNodeID(name) != nil {
			return "", fmt.Errorf("subject %q: upstream names are [A-Za-z0-9_-]", s)
		}
		return s, nil
	}
	if err := wire.ValidNodeID(s); err != nil { // same alphabet as principal ids
		return "", fmt.Errorf("subject %q must be *, role:<role>, upstream:<name> or a principal id of [A-Za-z0-9_-]", s)
	}
	return s, nil
}

func canonicalObject(s string) (string, error) {
	if g, ok := strings.CutPrefix(s, GroupPrefix); ok {
		if !tenancy.ValidGroupName(g) {
			return "", fmt.Errorf("object %q: group names are 1-64 characters of [A-Za-z0-9_-]", s)
		}
		return s, nil
	}
	if len(s) == 0 || len(s) > 128 {
		return "", fmt.Errorf("object must be *, a node id glob or group:<name>")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '*' || c == '?') {
			return "", fmt.Errorf("object %q: node id globs hold only [A-Za-z0-9_-*?]", s)
		}
	}
	return s, nil
}

func canonicalAction(s string) (string, error) {
	if !validPattern(s) {
		return "", fmt.Errorf("action %q must be 1-%d printable characters without spaces, quotes or commas", s, maxPatternLen)
	}
	switch {
	case s == CommandToolCall || s == CommandToolCallV1:
		return ToolActionPrefix + "*", nil
	case strings.HasPrefix(s, CommandToolCallV1+":"):
		s = ToolActionPrefix + strings.TrimPrefix(s, CommandToolCallV1+":")
	}
	if s == ToolActionPrefix {
		return "", fmt.Errorf("action %q names no tool (use %s*)", s, ToolActionPrefix)
	}
	return s, nil
}

// globMatch reports whether name matches pattern, where '*' matches any
// run of characters (also empty) and '?' exactly one byte. It runs in
// O(len(name)·len(pattern)) at worst, without allocation.
func globMatch(pattern, name string) bool {
	p, n := 0, 0
	star, mark := -1, 0
	for n < len(name) {
		switch {
		case p < len(pattern) && (pattern[p] == '?' || pattern[p] == name[n]):
			p++
			n++
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, n
			p++
		case star >= 0:
			p = star + 1
			mark++
			n = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
