package devstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
)

const setVolume = "self.audio_speaker.set_volume"

// toolCallCase is one node.invoke that reaches (or tries to reach) a tool,
// and what the device, the operator and the audit trail must see.
type toolCallCase struct {
	name    string
	dev     *xzsim.Device
	command string
	params  string
	// want is "ok", "denied" (by the policy) or "invalid" (refused as
	// INVALID_REQUEST before the policy).
	want string
	// volume is the device's volume after the call.
	volume int
	// tool and args are the audit row's; args nil means the row's args
	// are not checked.
	tool string
	args string
}

// TestToolPolicyEverySpelling: every command that calls a tool is decided
// on the tool it calls, however the call is spelled: one deny rule stops
// mcp.tools.call and mcp.tools.call.v1 alike, --when predicates see the
// arguments of both, an allow rule written for the v1 spelling admits both
// in a default-deny tenant, and params the gateway and the shim could read
// differently (repeated keys, name beside tool) are refused before the
// policy. The device's volume shows what reached it; the audit row names
// the tool and its arguments.
func TestToolPolicyEverySpelling(t *testing.T) {
	st := startStack(t, Config{})
	ctx := context.Background()
	m := st.Tenancy.Manager

	acme := newTenant(t, st, "acme") // default allow
	bravo := newTenant(t, st, "bravo")
	if _, err := m.UpdateTenant(ctx, bravo.id, tenancy.TenantUpdate{DefaultEffect: ptr("deny")}); err != nil {
		t.Fatal(err)
	}
	denied, err := tenantDevice(t, st, acme.id, 0, "02:0d:00:00:00:01") // set_volume denied
	if err != nil {
		t.Fatal(err)
	}
	capped, err := tenantDevice(t, st, acme.id, 0, "02:0d:00:00:00:02") // set_volume denied above 60
	if err != nil {
		t.Fatal(err)
	}
	allowed, err := tenantDevice(t, st, bravo.id, 0, "02:0d:00:00:00:03") // only set_volume allowed
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []tenancy.Rule{
		{Tenant: acme.id, Effect: "deny", Subject: "*", Object: nodeID(denied), Action: "mcp.tools.call:" + setVolume},
		{Tenant: acme.id, Effect: "deny", Subject: "*", Object: nodeID(capped), Action: "mcp.tools.call:" + setVolume, When: "volume > 60"},
		{Tenant: bravo.id, Effect: "allow", Subject: "*", Object: "*", Action: "mcp.tools.call.v1:" + setVolume},
	} {
		if _, err := m.AddRule(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	opA := dialAs(t, st.GatewayURL(0), acme.token, nil)
	opB := dialAs(t, st.GatewayURL(0), bravo.token, nil)
	waitNodes(t, opA, true, nodeID(denied), nodeID(capped))
	waitNodes(t, opB, true, nodeID(allowed))

	v1 := func(tool, args string) string {
		return `{"server":"xiaozhi","tool":` + tool + `,"arguments":` + args + `}`
	}
	call := func(tool, args string) string { return `{"name":` + tool + `,"arguments":` + args + `}` }
	const vol, status = `"` + setVolume + `"`, `"self.get_device_status"`
	cases := []toolCallCase{
		// A deny rule stops the tool in both spellings.
		{name: "deny/mcp.tools.call", dev: denied, command: "mcp.tools.call", params: call(vol, `{"volume":90}`),
			want: "denied", volume: 70, tool: setVolume, args: `{"volume":90}`},
		{name: "deny/mcp.tools.call.v1", dev: denied, command: "mcp.tools.call.v1", params: v1(vol, `{"volume":90}`),
			want: "denied", volume: 70, tool: setVolume, args: `{"volume":90}`},
		{name: "deny/mcp.tools.call.v1 padded tool", dev: denied, command: "mcp.tools.call.v1", params: v1(`"  `+setVolume+` "`, `{"volume":91}`),
			want: "denied", volume: 70, tool: setVolume, args: `{"volume":91}`},
		{name: "deny/mcp.tools.call.v1 other tool passes", dev: denied, command: "mcp.tools.call.v1", params: v1(status, `{}`),
			want: "ok", volume: 70, tool: "self.get_device_status", args: `{}`},

		// A --when predicate sees the arguments of both spellings.
		{name: "when/mcp.tools.call.v1 above", dev: capped, command: "mcp.tools.call.v1", params: v1(vol, `{"volume":90}`),
			want: "denied", volume: 70, tool: setVolume, args: `{"volume":90}`},
		{name: "when/mcp.tools.call.v1 below", dev: capped, command: "mcp.tools.call.v1", params: v1(vol, `{"volume":40}`),
			want: "ok", volume: 40, tool: setVolume, args: `{"volume":40}`},
		{name: "when/mcp.tools.call above", dev: capped, command: "mcp.tools.call", params: call(vol, `{"volume":95}`),
			want: "denied", volume: 40, tool: setVolume, args: `{"volume":95}`},
		{name: "when/mcp.tools.call below", dev: capped, command: "mcp.tools.call", params: call(vol, `{"volume":30}`),
			want: "ok", volume: 30, tool: setVolume, args: `{"volume":30}`},

		// An allow rule written for the v1 spelling admits the tool in a
		// default-deny tenant, in both spellings, and nothing else.
		{name: "allowlist/mcp.tools.call.v1", dev: allowed, command: "mcp.tools.call.v1", params: v1(vol, `{"volume":33}`),
			want: "ok", volume: 33, tool: setVolume, args: `{"volume":33}`},
		{name: "allowlist/mcp.tools.call", dev: allowed, command: "mcp.tools.call", params: call(vol, `{"volume":34}`),
			want: "ok", volume: 34, tool: setVolume, args: `{"volume":34}`},
		{name: "allowlist/mcp.tools.call.v1 other tool", dev: allowed, command: "mcp.tools.call.v1", params: v1(status, `{}`),
			want: "denied", volume: 34, tool: "self.get_device_status", args: `{}`},

		// Params two readers could read differently are refused, whichever
		// reading the policy would have allowed.
		{name: "dup/two names", dev: denied, command: "mcp.tools.call",
			params: `{"name":` + vol + `,"name":` + status + `,"arguments":{"volume":92}}`, want: "invalid", volume: 70},
		{name: "dup/two names reversed", dev: denied, command: "mcp.tools.call",
			params: `{"name":` + status + `,"name":` + vol + `,"arguments":{"volume":92}}`, want: "invalid", volume: 70},
		{name: "dup/two tools", dev: denied, command: "mcp.tools.call.v1",
			params: `{"server":"xiaozhi","tool":` + status + `,"tool":` + vol + `,"arguments":{"volume":93}}`, want: "invalid", volume: 70},
		{name: "dup/escaped second tool", dev: denied, command: "mcp.tools.call.v1",
			params: `{"server":"xiaozhi","tool":` + status + `,"t\u006fol":` + vol + `,"arguments":{"volume":93}}`, want: "invalid", volume: 70},
		{name: "dup/name beside tool (v1)", dev: denied, command: "mcp.tools.call.v1",
			params: `{"server":"xiaozhi","name":` + status + `,"tool":` + vol + `,"arguments":{"volume":94}}`, want: "invalid", volume: 70},
		{name: "dup/tool beside name", dev: denied, command: "mcp.tools.call",
			params: `{"name":` + status + `,"tool":` + vol + `,"arguments":{"volume":94}}`, want: "invalid", volume: 70},
		{name: "dup/two arguments objects", dev: capped, command: "mcp.tools.call.v1",
			params: `{"server":"xiaozhi","tool":` + vol + `,"arguments":{"volume":20},"arguments":{"volume":96}}`, want: "invalid", volume: 30},
		{name: "dup/repeated argument (v1)", dev: capped, command: "mcp.tools.call.v1",
			params: v1(vol, `{"volume":97,"volume":20}`), want: "invalid", volume: 30},
		{name: "dup/repeated argument", dev: capped, command: "mcp.tools.call",
			params: call(vol, `{"volume":98,"volume":20}`), want: "invalid", volume: 30},
		{name: "unparseable/no tool", dev: denied, command: "mcp.tools.call.v1",
			params: `{"server":"xiaozhi","arguments":{"volume":99}}`, want: "invalid", volume: 70},
		{name: "unparseable/tool not a string", dev: capped, command: "mcp.tools.call.v1",
			params: `{"server":"xiaozhi","tool":["` + setVolume + `"],"arguments":{"volume":99}}`, want: "invalid", volume: 30},
	}
	ops := map[*xzsim.Device]*occlient.Client{denied: opA, capped: opA, allowed: opB}
	tenants := map[*xzsim.Device]string{denied: acme.id, capped: acme.id, allowed: bravo.id}
	// The cases run in order: each one's volume follows from the ones before.
	for i, tc := range cases {
		key := fmt.Sprintf("toolcall-%d", i)
		_, err := ops[tc.dev].Invoke(ctx, occlient.InvokeParams{NodeID: nodeID(tc.dev), Command: tc.command,
			Params: json.RawMessage(tc.params), TimeoutMs: 5000, IdempotencyKey: key})
		var ge *occlient.Error
		errors.As(err, &ge)
		switch tc.want {
		case "ok":
			if err != nil {
				t.Errorf("%s: want success, got %v", tc.name, err)
			}
		case "denied":
			if ge == nil || nodeErrorCode(t, err) != "POLICY_DENIED" {
				t.Errorf("%s: want a policy denial, got %v", tc.name, err)
			}
		case "invalid":
			if ge == nil || ge.Code != "INVALID_REQUEST" || nodeErrorCode(t, err) == "POLICY_DENIED" {
				t.Errorf("%s: want INVALID_REQUEST before the policy, got %v", tc.name, err)
			}
		}
		if v := tc.dev.Volume(); v != tc.volume {
			t.Errorf("%s: device volume %d, want %d", tc.name, v, tc.volume)
		}
		row := auditRow(t, st, tenants[tc.dev], nodeID(tc.dev), key)
		wantOutcome := map[string]string{"ok": "ok", "denied": "denied", "invalid": "rejected"}[tc.want]
		if row.Outcome != wantOutcome || row.Tool != tc.tool || row.Command != tc.command {
			t.Errorf("%s: audit row outcome %q tool %q command %q, want %q %q %q", tc.name, row.Outcome, row.Tool, row.Command,
				wantOutcome, tc.tool, tc.command)
		}
		if tc.want == "invalid" && (row.Decision != "" || row.ErrorCode != "INVALID_REQUEST") {
			t.Errorf("%s: refused call audited with decision %q error %q, want none and INVALID_REQUEST", tc.name, row.Decision, row.ErrorCode)
		}
		if tc.args != "" && !sameJSON(row.Args, tc.args) {
			t.Errorf("%s: audit row args %s, want %s", tc.name, row.Args, tc.args)
		}
	}
}

// auditRow polls the audit store for the node.invoke with key.
func auditRow(t *testing.T, st *Stack, tenant, node, key string) audit.Event {
	t.Helper()
	var row audit.Event
	if !eventually.Until(waitLimit, func() bool {
		page, err := st.Tenancy.AuditStore.Query(context.Background(), audit.Query{Tenant: tenant, Node: node, Kind: audit.KindInvoke, Limit: audit.MaxLimit})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Events {
			if e.IdempotencyKey == key {
				row = e
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no audit row for idempotency key %s within %s", key, waitLimit)
	}
	return row
}

func sameJSON(a []byte, b string) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func ptr[T any](v T) *T { return &v }
