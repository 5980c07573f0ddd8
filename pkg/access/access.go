// Package access defines who calls the gateway and what the gateway asks
// about them: an Authenticator turns an operator token into a Principal, an
// Authorizer decides whether that principal may run a command on a node.
// The gateway consumes these interfaces; the tenancy store and the policy
// engine implement them, and the static versions here serve tests and a
// store-less setup.
package access

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
)

// Roles an operator token can carry.
const (
	RoleAdmin    = "admin"
	RoleOperator = "operator"
	RoleViewer   = "viewer"
)

// Principal is an authenticated caller within one tenant.
type Principal struct {
	Tenant string // tenant id
	ID     string // stable principal id, e.g. a token id "tok_…"
	Name   string // human-readable name, for logs
	Role   string // RoleAdmin, RoleOperator or RoleViewer
}

// ErrUnauthenticated is returned when a credential is missing, unknown,
// expired or revoked; callers must not reveal which.
var ErrUnauthenticated = errors.New("unauthenticated")

// Authenticator resolves an operator token.
type Authenticator interface {
	AuthenticateOperator(ctx context.Context, token string) (Principal, error)
}

// Request is one authorization question.
type Request struct {
	Principal Principal
	NodeID    string
	Command   string          // e.g. "mcp.tools.call", "system.which"
	Tool      string          // MCP tool name for tool calls, else ""
	Args      json.RawMessage // tool arguments for tool calls, else nil
}

// Decision is the answer; RuleID names the rule that decided, if any.
type Decision struct {
	Allowed bool
	RuleID  string
	Reason  string
}

// Authorizer answers authorization questions. It must be fast: the gateway
// asks once per node.invoke and once per listed tool.
type Authorizer interface {
	Authorize(ctx context.Context, r Request) Decision
}

// AllowAll allows everything; for development without a policy store.
type AllowAll struct{}

// Authorize allows r.
func (AllowAll) Authorize(context.Context, Request) Decision {
	return Decision{Allowed: true, Reason: "no policy configured"}
}

// StaticTokens authenticates a fixed set of tokens.
type StaticTokens map[string]Principal

// AuthenticateOperator compares token against every entry in constant time.
func (s StaticTokens) AuthenticateOperator(_ context.Context, token string) (Principal, error) {
	var found Principal
	ok := false
	for t, p := range s {
		if subtle.ConstantTimeCompare([]byte(t), []byte(token)) == 1 {
			found, ok = p, true
		}
	}
	if !ok || token == "" {
		return Principal{}, ErrUnauthenticated
	}
	return found, nil
}
