package devicehub_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry/telemetrytest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub"
)

// warnCounter counts the warning records whose message contains match.
type warnCounter struct {
	match string
	n     *atomic.Int64
}

func (h warnCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h warnCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn && strings.Contains(r.Message, h.match) {
		h.n.Add(1)
	}
	return nil
}
func (h warnCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h warnCounter) WithGroup(string) slog.Handler      { return h }

// A device flooding notifications is cut to its rate at the hub: the rest
// is dropped and counted, one warning is logged, and another device's
// notification still goes through.
func TestNotificationFloodIsLimited(t *testing.T) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	warnings := new(atomic.Int64)
	const rate, burst, flood = 5, 10, 400
	nc, err := e.ns.Connect("hub")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	hub, err := devicehub.New(devicehub.Config{
		Auth: deviceAuth(), DeviceAddr: "127.0.0.1:0", NotifyRate: rate, NotifyBurst: burst, Registerer: reg,
	}, nc, slog.New(warnCounter{match: "notification rate", n: warnings}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hub.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-hub.Ready()

	const macA, macB = "aa:bb:cc:00:0f:01", "aa:bb:cc:00:0f:02"
	a := connectOnline(t, e, hub, macA, nil)
	b := connectOnline(t, e, hub, macB, nil)
	var gotA, gotB atomic.Int64
	var mu sync.Mutex
	var lastB wire.DeviceEvent
	for _, s := range []struct {
		mac string
		fn  nats.MsgHandler
	}{
		{macA, func(*nats.Msg) { gotA.Add(1) }},
		{macB, func(m *nats.Msg) {
			mu.Lock()
			_ = json.Unmarshal(m.Data, &lastB)
			mu.Unlock()
			gotB.Add(1)
		}},
	} {
		sub, err := e.nc.Subscribe(wire.DeviceNotify(testTenant, canonical(t, s.mac)), s.fn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	params := json.RawMessage(`{"blob":"` + strings.Repeat("x", 8<<10) + `"}`)
	start := time.Now()
	for range flood {
		if err := a.Notify(context.Background(), "notifications/flood", params); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Notify(context.Background(), "notifications/state_changed", json.RawMessage(`{"newState":"idle"}`)); err != nil {
		t.Fatal(err)
	}
	dropped := func() int64 {
		return int64(telemetrytest.MetricValue(t, reg, devicehub.MetricNotificationsDropped, "tenant", testTenant))
	}
	eventually.True(t, "every notification passed or dropped", func() bool { return gotB.Load() == 1 && gotA.Load()+dropped() == flood })
	elapsed := time.Since(start)

	if n := gotA.Load(); n < burst || float64(n) > burst+rate*elapsed.Seconds()+1 {
		t.Fatalf("flooding device got %d of %d notifications through in %s (rate %d/s, burst %d)", n, flood, elapsed, rate, burst)
	}
	mu.Lock()
	if lastB.Kind != wire.DeviceNotification || !strings.Contains(string(lastB.Notification), "state_changed") {
		t.Fatalf("other device's notification: %+v", lastB)
	}
	mu.Unlock()
	if w := warnings.Load(); w != 1 {
		t.Fatalf("%d warnings about the flood, want 1", w)
	}
}
