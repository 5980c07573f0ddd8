package gateway_test

import (
	"encoding/json"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/gwtest"
)

// TestNodeHostToolCallsAreDecidedOnTheTool: a stock OpenClaw node host
// parses mcp.tools.call.v1 itself, so the gateway's reading is the only
// check before it acts. The policy and the audit row get the tool and the
// arguments of the v1 spelling; params a node host could read otherwise
// than the gateway (repeated keys, "name" beside "tool") never reach it.
func TestNodeHostToolCallsAreDecidedOnTheTool(t *testing.T) {
	e := newEnv(t)
	authz := &denyTools{tools: map[string]string{"self.reboot": "rule-no-reboot"}}
	audit := &recorder{}
	gw := e.gateway(func(c *gateway.Config) { c.Authorizer = authz; c.Auditor = audit })
	host, _, err := gwtest.ConnectNodeHost(ctxT(t), gw.URL(), gwtest.NodeParams(tokOperator, "mcp-host", "mcp.tools.call.v1"), nil,
		func(req gwtest.InvokeRequest) (string, string, string) { return `{"content":[]}`, "", "" })
	if err != nil {
		t.Fatal(err)
	}
	defer host.CloseNow()
	op := operator(t, gw, tokOperator, "operator.write")
	waitListed(t, op, host.NodeID, true)
	key := 0
	invoke := func(params string) gwtest.Frame {
		key++
		return call(t, op, "node.invoke", map[string]any{"nodeId": host.NodeID, "command": "mcp.tools.call.v1",
			"params": json.RawMessage(params), "idempotencyKey": "k-" + string(rune('a'+key))})
	}

	fe := failure(t, invoke(`{"server":"local","tool":" self.reboot ","arguments":{"now":true}}`))
	if fe.DetailCode() != "POLICY_DENIED" {
		t.Fatalf("v1 call of a denied tool: %+v", fe)
	}
	if a := audit.last(); a.Outcome != gateway.OutcomeDenied || a.Tool != "self.reboot" || string(a.Args) != `{"now":true}` {
		t.Fatalf("audit %+v", a)
	}
	for _, params := range []string{
		`{"server":"local","tool":"self.ok","tool":"self.reboot"}`,
		`{"server":"local","tool":"self.ok","t\u006fol":"self.reboot"}`,
		`{"server":"local","name":"self.ok","tool":"self.reboot"}`,
		`{"server":"local","tool":"self.ok","arguments":{"now":false,"now":true}}`,
		`{"server":"local","arguments":{}}`,
	} {
		fe := failure(t, invoke(params))
		if fe.Code != "INVALID_REQUEST" || fe.DetailCode() == "POLICY_DENIED" {
			t.Fatalf("%s: %+v", params, fe)
		}
		if a := audit.last(); a.Outcome != gateway.OutcomeRejected || a.Decision.Reason != "" || a.Tool != "" || string(a.Args) != params {
			t.Fatalf("%s: audit %+v", params, a)
		}
	}
	payload[map[string]any](t, invoke(`{"server":"local","tool":"self.ok","arguments":{"level":2}}`))
	if a := audit.last(); a.Outcome != gateway.OutcomeOK || a.Tool != "self.ok" || string(a.Args) != `{"level":2}` {
		t.Fatalf("audit %+v", a)
	}
	// The allowed call is the first the node host saw.
	if req := <-host.Requests; req.ParamsJSON == nil || *req.ParamsJSON != `{"server":"local","tool":"self.ok","arguments":{"level":2}}` {
		t.Fatalf("node host got %+v", req)
	}
}
