package natsconn_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsconn"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed/natsembedtest"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry/telemetrytest"
)

// A subscription that cannot keep up drops messages; the handler counts the
// slow consumer and logs it with the subject and the drops.
func TestNATSErrorHandlerCountsSlowConsumer(t *testing.T) {
	ns := natsembedtest.Start(t)
	reg := prometheus.NewRegistry()
	var logs telemetrytest.LogBuffer
	onErr, err := natsconn.ErrorHandler(reg, telemetry.LabelShim, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := ns.Connect("consumer", nats.ErrorHandler(onErr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	release := make(chan struct{})
	sub, err := nc.Subscribe("flood", func(*nats.Msg) { <-release })
	if err != nil {
		t.Fatal(err)
	}
	defer close(release)
	if err := sub.SetPendingLimits(8, -1); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	pub := natsembedtest.Connect(t, ns, "producer")
	for range 100 {
		if err := pub.Publish("flood", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	slow := func() float64 {
		return telemetrytest.MetricValue(t, reg, natsconn.MetricAsyncErrors, "kind", natsconn.KindSlowConsumer)
	}
	eventually.Within(t, 10*time.Second, "the slow consumer counted and logged", func() bool {
		return slow() >= 1 && strings.Contains(logs.String(), "subject=flood")
	})
	if !strings.Contains(logs.String(), "kind=slow_consumer") || !strings.Contains(logs.String(), "dropped_total=") {
		t.Fatalf("log line lacks kind or drops: %q", logs.String())
	}
}

// A service's connection logs a server restart and reconnects, and the
// gauge follows its state.
func TestConnectFollowsTheServer(t *testing.T) {
	ns := natsembedtest.Start(t)
	reg := prometheus.NewRegistry()
	var logs telemetrytest.LogBuffer
	nc, err := natsconn.Connect(reg, ns.ClientURL(), "shim test", telemetry.LabelShim,
		slog.New(slog.NewTextHandler(&logs, nil)), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if got := telemetrytest.MetricValue(t, reg, telemetry.MetricNATSConnected, telemetry.LabelService, telemetry.LabelShim); got != 1 {
		t.Fatalf("connected gauge %v, want 1", got)
	}

	if err := ns.Restart(); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "the disconnect to be logged", func() bool { return strings.Contains(logs.String(), "NATS disconnected") })
	eventually.True(t, "the reconnect to be logged", func() bool { return strings.Contains(logs.String(), "NATS reconnected") })
	if got := telemetrytest.MetricValue(t, reg, telemetry.MetricNATSConnected, telemetry.LabelService, telemetry.LabelShim); got != 1 {
		t.Fatalf("connected gauge %v after the reconnect, want 1", got)
	}
	nc.Close()
	if got := telemetrytest.MetricValue(t, reg, telemetry.MetricNATSConnected, telemetry.LabelService, telemetry.LabelShim); got != 0 {
		t.Fatalf("connected gauge %v after Close, want 0", got)
	}

	if _, err := natsconn.Connect(prometheus.NewRegistry(), "nats://127.0.0.1:1", "shim test", telemetry.LabelShim, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "connect NATS nats://127.0.0.1:1") {
		t.Fatalf("connecting to no server: %v", err)
	}
}
