package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/devstack"
	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
)

// TestAuditTrail: allowed and denied calls through the dev stack become
// audit rows, readable with `xiaoclaw audit`, the denial with its rule id
// and the arguments redacted.
func TestAuditTrail(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const admin = "admin-token-0123456789"
	st, err := devstack.Start(ctx, devstack.Config{DataDir: t.TempDir(), DeviceToken: "dtok", OperatorToken: "otok", AdminToken: admin})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d, _ := xzsim.NewDevice(xzsim.Config{URL: st.DeviceURL(0), Token: "dtok", MAC: "02:ad:00:00:00:01"})
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	if err := d.Connect(cctx); err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	node := "xz-02ad00000001"
	rule, err := st.Tenancy.Manager.AddRule(ctx, tenancy.Rule{Tenant: "dev", Effect: "deny", Subject: "*", Object: "*",
		Action: "mcp.tools.call:self.audio_speaker.set_volume", When: "volume>60"})
	if err != nil {
		t.Fatal(err)
	}
	op, err := occlient.Dial(cctx, occlient.Options{URL: st.GatewayURL(0), Token: "otok"})
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	call := func(args string) error {
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := op.Invoke(ctx, occlient.InvokeParams{NodeID: node, Command: "mcp.tools.call",
				Params: json.RawMessage(`{"name":"self.audio_speaker.set_volume","arguments":` + args + `}`)})
			if err == nil || !strings.Contains(err.Error(), "not connected") || time.Now().After(deadline) {
				return err
			}
			time.Sleep(20 * time.Millisecond) // the shim is still registering the device
		}
	}
	if err := call(`{"volume":30}`); err != nil {
		t.Fatal(err)
	}
	if err := call(`{"volume":90}`); err == nil {
		t.Fatal("volume 90 must be denied")
	}

	env := func(k string) string {
		return map[string]string{"XIAOCLAW_SERVER": "http://" + st.Gateways[0].Addr(), "XIAOCLAW_TOKEN": admin}[k]
	}
	type row struct {
		Kind     string `json:"kind"`
		Outcome  string `json:"outcome"`
		RuleID   string `json:"ruleId"`
		Tool     string `json:"tool"`
		Decision string `json:"decision"`
	}
	var rows []row
	deadline := time.Now().Add(10 * time.Second)
	for {
		var out, errb bytes.Buffer
		code := run(ctx, []string{"audit", "--tenant", "dev", "--node", node, "--json"}, env, &out, &errb)
		if code != exitOK {
			t.Fatalf("xiaoclaw audit: exit %d: %s", code, errb.String())
		}
		rows = rows[:0]
		dec := json.NewDecoder(&out) // one JSON event per line
		for dec.More() {
			var r row
			if err := dec.Decode(&r); err != nil {
				t.Fatalf("xiaoclaw audit --json: %v", err)
			}
			if r.Kind == "node.invoke" {
				rows = append(rows, r)
			}
		}
		if len(rows) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit rows not written in time: %s", out.String())
		}
		time.Sleep(50 * time.Millisecond) // the writer batches every 50 ms
	}
	var denied bool
	for _, r := range rows {
		if r.Outcome == "denied" && r.RuleID == rule.ID {
			denied = true
		}
	}
	if !denied {
		t.Fatalf("no denied row naming rule %s: %+v", rule.ID, rows)
	}
}
