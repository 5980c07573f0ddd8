package upstream

import (
	"encoding/json"
	"testing"
	"time"
)

func FuzzParseInvokeRequest(f *testing.F) {
	for _, seed := range []string{
		`{"id":"a","nodeId":"n","command":"mcp.tools.call","paramsJSON":"{\"name\":\"x\"}","timeoutMs":5000,"idempotencyKey":"k"}`,
		`{"id":"a","command":"mcp.tools.list","paramsJSON":null}`,
		`{"id":"a","command":"system.run","paramsJSON":"{}"}`,
		`{"id":"a","command":"mcp.tools.call","paramsJSON":"{not json"}`,
		`{"id":"a","command":"mcp.tools.call","timeoutMs":9223372036854775807}`,
		`{"id":"a","command":"mcp.tools.call","timeoutMs":-5}`,
		`{"command":"mcp.tools.call"}`,
		`[]`, `null`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, err := parseInvokeRequest(raw)
		if err != nil {
			return
		}
		if p.id == "" {
			t.Fatal("accepted without an id")
		}
		if p.timeout < time.Millisecond || p.timeout > maxInvokeTimeout {
			t.Fatalf("timeout %s out of bounds", p.timeout)
		}
		if p.refusal == nil {
			if !declared(p.command) {
				t.Fatalf("undeclared command %q forwarded", p.command)
			}
			if p.params != nil && !json.Valid(p.params) {
				t.Fatalf("invalid params forwarded: %q", p.params)
			}
		}
	})
}

func TestParseInvokeRequestTimeouts(t *testing.T) {
	for raw, want := range map[string]time.Duration{
		`{"id":"a","command":"mcp.tools.list"}`:                                 defaultInvokeTimeout,
		`{"id":"a","command":"mcp.tools.list","timeoutMs":0}`:                   time.Millisecond,
		`{"id":"a","command":"mcp.tools.list","timeoutMs":1500}`:                1500 * time.Millisecond,
		`{"id":"a","command":"mcp.tools.list","timeoutMs":9223372036854775807}`: maxInvokeTimeout,
	} {
		p, err := parseInvokeRequest([]byte(raw))
		if err != nil || p.timeout != want {
			t.Errorf("%s: timeout %s (%v), want %s", raw, p.timeout, err, want)
		}
	}
}
