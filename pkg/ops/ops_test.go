package ops_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
	"github.com/xiaoclaw/xiaoclaw/pkg/ops"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

// startOps runs an ops server on a random loopback port until the test ends.
func startOps(t *testing.T, cfg ops.Config, log *slog.Logger) string {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	srv, err := ops.NewServer(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ops server Run: %v", err)
		}
	})
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatalf("ops server stopped: %v", err)
	}
	return "http://" + srv.Addr()
}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	res, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func do(t *testing.T, method, u, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, u, strings.NewReader(body))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func readiness(t *testing.T, base string) (int, ops.Readiness) {
	t.Helper()
	code, body := get(t, base+"/readyz")
	var r ops.Readiness
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("readyz body %q: %v", body, err)
	}
	return code, r
}

// waitReadiness polls /readyz until it answers want, or fails after 10 s.
func waitReadiness(t *testing.T, base string, want int) ops.Readiness {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, r := readiness(t, base)
		if code == want {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz answers %d %+v, want %d", code, r, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestReadyzFollowsTheNATSConnection(t *testing.T) {
	store := t.TempDir()
	srv, err := natsembed.Start(natsembed.Config{StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(srv.ClientURL())
	port, _ := strconv.Atoi(u.Port())
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	reg := telemetry.NewRegistry()
	if err := telemetry.RegisterNATSConnected(reg, telemetry.LabelShim, nc); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	base := startOps(t, ops.Config{
		Gatherer: reg,
		Checks:   []ops.Check{ops.NATSCheck(nc), ops.ChannelCheck("shim", started)},
	}, nil)

	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d", code)
	}
	r := waitReadiness(t, base, http.StatusServiceUnavailable)
	if len(r.Failing) != 1 || r.Failing[0] != "shim" {
		t.Fatalf("before the service started: %+v, want only shim failing", r)
	}
	close(started)
	r = waitReadiness(t, base, http.StatusOK)
	if r.Status != "ready" || len(r.Checks) != 2 {
		t.Fatalf("ready body %+v", r)
	}

	srv.Shutdown() // NATS goes away
	r = waitReadiness(t, base, http.StatusServiceUnavailable)
	if len(r.Failing) != 1 || r.Failing[0] != "nats" || !strings.Contains(r.Checks[0].Error, "reconnecting") {
		t.Fatalf("NATS down: %+v", r)
	}
	if _, body := get(t, base+"/metrics"); !strings.Contains(body, `xiaoclaw_nats_connected{service="shim"} 0`) {
		t.Fatalf("metrics while NATS is down lack xiaoclaw_nats_connected 0")
	}
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d while NATS is down: the process is alive", code)
	}

	srv2, err := natsembed.Start(natsembed.Config{StoreDir: store, Port: port}) // and comes back
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Shutdown()
	waitReadiness(t, base, http.StatusOK)
	if _, body := get(t, base+"/metrics"); !strings.Contains(body, `xiaoclaw_nats_connected{service="shim"} 1`) {
		t.Fatalf("metrics after reconnect lack xiaoclaw_nats_connected 1")
	}
}

func TestReadyzCheckTimeoutAndSecrets(t *testing.T) {
	hang := make(chan struct{})
	defer close(hang)
	base := startOps(t, ops.Config{
		CheckTimeout: 50 * time.Millisecond,
		Checks: []ops.Check{
			ops.PingCheck("db", func(context.Context) error {
				return errors.New("connect postgres://app:db-s3cr3t@db:5432/x: refused")
			}),
			{Name: "slow", Run: func(context.Context) error { <-hang; return nil }},
		},
	}, nil)
	code, body := get(t, base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"failing":["db","slow"]`) || !strings.Contains(body, "timeout") {
		t.Fatalf("readyz %d %s", code, body)
	}
	if strings.Contains(body, "db-s3cr3t") {
		t.Fatalf("readyz body shows the database password: %s", body)
	}
}

func TestOpsConfigIsValidated(t *testing.T) {
	for _, cfg := range []ops.Config{
		{Addr: ":0", Checks: []ops.Check{{Name: "x"}}},
		{Addr: ":0", Checks: []ops.Check{ops.ChannelCheck("a", nil), ops.ChannelCheck("a", nil)}},
	} {
		if _, err := ops.NewServer(cfg, nil); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
	for _, addr := range []string{"", "256.0.0.1:99999"} {
		srv, err := ops.NewServer(ops.Config{Addr: addr}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Run(context.Background()); err == nil {
			t.Errorf("Run on address %q returned nil", addr)
		}
	}
}

func TestLogLevelEndpoint(t *testing.T) {
	var lv slog.LevelVar
	var buf bytes.Buffer
	log, err := telemetry.NewLogger(&buf, "json", &lv)
	if err != nil {
		t.Fatal(err)
	}
	base := startOps(t, ops.Config{LogLevel: &lv}, log)
	u := base + "/debug/loglevel"

	if code, body := get(t, u); code != 200 || !strings.Contains(body, `"level":"INFO"`) {
		t.Fatalf("GET %d %s", code, body)
	}
	log.Debug("before")
	if code, body := do(t, http.MethodPut, u, `{"level":"debug"}`); code != 200 || !strings.Contains(body, `"previous":"INFO"`) {
		t.Fatalf("PUT json %d %s", code, body)
	}
	log.Debug("after")
	if code, _ := do(t, http.MethodPut, u, "warn"); code != 200 || lv.Level() != slog.LevelWarn {
		t.Fatalf("PUT plain %d level %v", code, lv.Level())
	}
	for _, bad := range []string{"", "loud", `{"level":5}`, `{"level":"nope"}`, strings.Repeat("x", 2000)} {
		if code, _ := do(t, http.MethodPut, u, bad); code != http.StatusBadRequest {
			t.Errorf("PUT %.20q: %d, want 400", bad, code)
		}
	}
	if lv.Level() != slog.LevelWarn {
		t.Fatalf("bad requests changed the level to %v", lv.Level())
	}
	if code, _ := do(t, http.MethodDelete, u, ""); code != http.StatusMethodNotAllowed {
		t.Fatalf("DELETE %d", code)
	}
	out := buf.String()
	if strings.Contains(out, `"before"`) || !strings.Contains(out, `"msg":"after"`) || !strings.Contains(out, "log level changed") {
		t.Fatalf("log output %s", out)
	}
}

func TestMetricsDeclarations(t *testing.T) {
	reg := telemetry.NewRegistry()
	devices, err := telemetry.NewDevicesConnected(reg)
	if err != nil {
		t.Fatal(err)
	}
	invokes, _ := telemetry.NewInvokes(reg)
	hops, _ := telemetry.NewHopDuration(reg)
	policy, _ := telemetry.NewPolicyDecisions(reg)
	backlog, _ := telemetry.NewAuditBacklog(reg)
	lag, _ := telemetry.NewAuditLag(reg)
	if err := telemetry.RegisterDBConnected(reg, telemetry.LabelGateway, func() bool { return true }); err != nil {
		t.Fatal(err)
	}

	devices.WithLabelValues("acme", "websocket").Inc()
	invokes.WithLabelValues(telemetry.LabelGateway, telemetry.CommandLabel("mcp.tools.call"), telemetry.OutcomeOK).Inc()
	invokes.WithLabelValues(telemetry.LabelGateway, telemetry.CommandLabel("made.up.by.a.node"), telemetry.OutcomeOf("TIMEOUT")).Inc()
	hops.WithLabelValues(telemetry.HopDevicehubDevice).Observe(0.012)
	policy.WithLabelValues(telemetry.EffectDeny).Inc()
	backlog.Set(3)
	lag.Set(0.25)

	// A second service on the same registry (xiaoclaw dev) gets the same collectors.
	invokes2, err := telemetry.NewInvokes(reg)
	if err != nil || invokes2 != invokes {
		t.Fatalf("second NewInvokes: %v (same collector: %v)", err, invokes2 == invokes)
	}
	invokes2.WithLabelValues(telemetry.LabelShim, "mcp.tools.call", telemetry.OutcomeOK).Inc()
	backlog2, _ := telemetry.NewAuditBacklog(reg)
	backlog2.Inc()

	base := startOps(t, ops.Config{Gatherer: reg}, nil)
	_, body := get(t, base+"/metrics")
	for _, want := range []string{
		`xiaoclaw_devices_connected{tenant="acme",transport="websocket"} 1`,
		`xiaoclaw_invokes_total{command="mcp.tools.call",outcome="ok",service="gateway"} 1`,
		`xiaoclaw_invokes_total{command="other",outcome="timeout",service="gateway"} 1`,
		`xiaoclaw_invokes_total{command="mcp.tools.call",outcome="ok",service="shim"} 1`,
		`xiaoclaw_hop_duration_seconds_bucket{hop="devicehub_device",le="0.025"} 1`,
		`xiaoclaw_policy_decisions_total{effect="deny"} 1`,
		`xiaoclaw_audit_backlog 4`,
		`xiaoclaw_audit_lag_seconds 0.25`,
		`xiaoclaw_db_connected{service="gateway"} 1`,
		`go_goroutines `,
		`process_resident_memory_bytes `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(body)
	}

	// The same name with other labels is a programming error, reported, not panicked.
	clash := prometheus.NewCounterVec(prometheus.CounterOpts{Name: telemetry.MetricInvokes, Help: "x"}, []string{"x"})
	if err := reg.Register(clash); err == nil {
		t.Error("a clashing metric registered")
	}
	if _, err := telemetry.NewInvokes(nil); err == nil {
		t.Error("nil registerer accepted")
	}
	for method, want := range map[string]string{"tools/call": "mcp.tools.call", "tools/list": "mcp.tools.list", "initialize": "mcp.initialize", "x/y": "other"} {
		if got := telemetry.CommandLabel(telemetry.MCPCommand(method)); got != want {
			t.Errorf("CommandLabel(MCPCommand(%q)) = %q, want %q", method, got, want)
		}
	}
	if n := testutil.CollectAndCount(invokes); n != 3 {
		t.Errorf("invokes has %d series, want 3", n)
	}
}

func TestNoDefaultRegistererIsTouched(t *testing.T) {
	before, _ := prometheus.DefaultGatherer.Gather()
	reg := telemetry.NewRegistry()
	_, _ = telemetry.NewInvokes(reg)
	after, _ := prometheus.DefaultGatherer.Gather()
	if len(before) != len(after) {
		t.Fatal("the default registry changed")
	}
}
