package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/devstack"
	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
)

// TestAuditTrail: allowed and denied calls through the dev stack, with the
// telemetry of `xiaoclaw dev` and no OTEL_* variables (tracing off), become
// audit rows, readable with `xiaoclaw audit`, the denial with its rule id
// and the arguments redacted, and every row with the call's trace id.
func TestAuditTrail(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		t.Setenv(k, "") // the default: tracing off
	}
	tel, err := newDevTelemetry(ctx, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer tel.shutdown()
	if tel.gateway.Enabled() {
		t.Fatalf("tracing on by default: %s", tel.gateway)
	}
	const admin = "admin-token-0123456789"
	cfg := devstack.Config{DataDir: t.TempDir(), DeviceToken: "dtok", OperatorToken: "otok", AdminToken: admin}
	tel.stackConfig(&cfg)
	st, err := devstack.Start(ctx, cfg)
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
	// call returns the trace id the reply names: in the payload of a
	// result, in the details of an error.
	call := func(args string) (traceID string, err error) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			res, err := op.Invoke(ctx, occlient.InvokeParams{NodeID: node, Command: "mcp.tools.call",
				Params: json.RawMessage(`{"name":"self.audio_speaker.set_volume","arguments":` + args + `}`)})
			registering := err != nil && (strings.Contains(err.Error(), "not connected") || strings.Contains(err.Error(), "unknown nodeId"))
			if !registering || time.Now().After(deadline) {
				var named struct {
					TraceID string `json:"traceId"`
				}
				var oe *occlient.Error
				if errors.As(err, &oe) {
					res = oe.Details
				}
				_ = json.Unmarshal(res, &named)
				return named.TraceID, err
			}
			time.Sleep(20 * time.Millisecond) // the shim is still registering the device
		}
	}
	allowedTrace, err := call(`{"volume":30}`)
	if err != nil {
		t.Fatal(err)
	}
	deniedTrace, err := call(`{"volume":90}`)
	if err == nil {
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
		TraceID  string `json:"traceId"`
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
		// Wait for the denied call's row: calls retried while the shim
		// registered the device left "rejected" rows before it.
		if slices.ContainsFunc(rows, func(r row) bool { return r.Outcome == "denied" && r.RuleID == rule.ID }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no denied row naming rule %s in time: %+v", rule.ID, rows)
		}
		time.Sleep(50 * time.Millisecond) // the writer batches every 50 ms
	}
	if !slices.ContainsFunc(rows, func(r row) bool { return r.Outcome == "ok" && r.Decision == "allow" && r.TraceID == allowedTrace }) {
		t.Fatalf("no allowed row with the reply's trace id %q: %+v", allowedTrace, rows)
	}
	if !slices.ContainsFunc(rows, func(r row) bool { return r.Outcome == "denied" && r.TraceID == deniedTrace }) {
		t.Fatalf("no denied row with the reply's trace id %q: %+v", deniedTrace, rows)
	}
	seen := map[string]bool{}
	for _, r := range rows {
		if !traceIDPattern.MatchString(r.TraceID) || r.TraceID == strings.Repeat("0", 32) || seen[r.TraceID] {
			t.Errorf("%s row: trace id %q, want a call's own W3C trace id", r.Outcome, r.TraceID)
		}
		seen[r.TraceID] = true
	}
}

var traceIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestAuditConnectsAndAuthFailures: an operator's connect is recorded under
// its tenant; a connect with a wrong token and a device with a wrong token
// are recorded under the pseudo-tenant, which a global admin reads with
// `xiaoclaw audit --tenant _unknown`, and neither row holds the token.
func TestAuditConnectsAndAuthFailures(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const admin = "admin-token-0123456789"
	st, err := devstack.Start(ctx, devstack.Config{DataDir: t.TempDir(), DeviceToken: "dtok", OperatorToken: "otok", AdminToken: admin})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	op, err := occlient.Dial(cctx, occlient.Options{URL: st.GatewayURL(0), Token: "otok"})
	if err != nil {
		t.Fatal(err)
	}
	op.Close()
	const wrong = "wrong-token-4f1d9c"
	if bad, err := occlient.Dial(cctx, occlient.Options{URL: st.GatewayURL(0), Token: wrong}); err == nil {
		bad.Close()
		t.Fatal("a wrong operator token connected")
	}
	d, _ := xzsim.NewDevice(xzsim.Config{URL: st.DeviceURL(0), Token: wrong, MAC: "02:ad:00:00:00:02"})
	if err := d.Connect(cctx); err == nil {
		d.Close()
		t.Fatal("a wrong device token connected")
	}

	env := func(k string) string {
		return map[string]string{"XIAOCLAW_SERVER": "http://" + st.Gateways[0].Addr(), "XIAOCLAW_TOKEN": admin}[k]
	}
	type row struct {
		Kind      string `json:"kind"`
		Tenant    string `json:"tenant"`
		Principal string `json:"principal"`
		Device    string `json:"device"`
		Outcome   string `json:"outcome"`
		ErrorCode string `json:"errorCode"`
		Instance  string `json:"instance"`
		Detail    string `json:"detail"`
	}
	// rows polls `xiaoclaw audit` until it lists an event of every kind in
	// want (the writer commits in batches).
	rows := func(tenant string, want ...string) map[string]row {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var out, errb bytes.Buffer
			if code := run(ctx, []string{"audit", "--tenant", tenant, "--json"}, env, &out, &errb); code != exitOK {
				t.Fatalf("xiaoclaw audit --tenant %s: exit %d: %s", tenant, code, errb.String())
			}
			if strings.Contains(out.String(), wrong) {
				t.Fatalf("the audit trail holds the wrong token: %s", out.String())
			}
			got := map[string]row{}
			dec := json.NewDecoder(&out)
			for dec.More() {
				var r row
				if err := dec.Decode(&r); err != nil {
					t.Fatalf("xiaoclaw audit --json: %v", err)
				}
				got[r.Kind] = r
			}
			complete := true
			for _, k := range want {
				_, ok := got[k]
				complete = complete && ok
			}
			if complete {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("audit rows of %s not written in time: %s", tenant, out.String())
			}
			time.Sleep(50 * time.Millisecond) // the writer batches every 50 ms
		}
	}
	conn := rows("dev", "operator.connect")["operator.connect"]
	if conn.Outcome != "ok" || conn.Principal == "" || conn.Instance == "" || !strings.Contains(conn.Detail, "remote=127.0.0.1") {
		t.Fatalf("operator.connect row %+v", conn)
	}
	unknown := rows("_unknown", "operator.auth_failed", "device.auth_failed")
	if r := unknown["operator.auth_failed"]; r.Outcome != "rejected" || r.ErrorCode != "AUTH_TOKEN_MISMATCH" || r.Principal != "" ||
		r.Instance == "" || !strings.Contains(r.Detail, "remote=127.0.0.1") {
		t.Fatalf("operator.auth_failed row %+v", r)
	}
	if r := unknown["device.auth_failed"]; r.Outcome != "rejected" || r.Device != "02ad00000002" ||
		r.Instance == "" || !strings.Contains(r.Detail, `reason="unauthenticated"`) {
		t.Fatalf("device.auth_failed row %+v", r)
	}
}
