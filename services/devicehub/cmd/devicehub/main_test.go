package main

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

// TestDatabaseHealth: with --database-url the devicehub's db readiness
// check and xiaoclaw_db_connected{service="devicehub"} follow its tenancy
// store's database; without one it has neither.
func TestDatabaseHealth(t *testing.T) {
	ns, err := natsembed.Start(natsembed.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	nc, err := ns.Connect("devicehub")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)

	c, err := deviceCredentials(ctx, nc, "", deviceauth.StaticTokens{"tok": "dev"}, log)
	if err != nil {
		t.Fatal(err)
	}
	if c.db != nil {
		t.Fatal("without a database the devicehub has a database health check")
	}

	dsn := "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	if u := os.Getenv("XIAOCLAW_TEST_POSTGRES"); u != "" {
		dsn = u
	}
	c, err = deviceCredentials(ctx, nc, dsn, nil, log)
	if err != nil {
		t.Fatalf("PostgreSQL at %s is required: %v", dsn, err)
	}
	reg := telemetry.NewRegistry()
	if err := c.db.Register(reg, telemetry.LabelDevicehub); err != nil {
		t.Fatal(err)
	}
	check := c.db.Check()
	if err := check.Run(ctx); err != nil || check.Name != "db" {
		t.Fatalf("check %q answered %v with the database up", check.Name, err)
	}
	if got := dbConnected(t, reg); got != 1 {
		t.Errorf("xiaoclaw_db_connected = %v with the database up, want 1", got)
	}
	c.close() // the store's connections are gone
	if err := check.Run(ctx); err == nil {
		t.Fatal("the db check passed after the store was closed")
	}
	if got := dbConnected(t, reg); got != 0 {
		t.Errorf("xiaoclaw_db_connected = %v after the check failed, want 0", got)
	}
}

// dbConnected reads xiaoclaw_db_connected{service="devicehub"} from reg.
func dbConnected(t *testing.T, reg prometheus.Gatherer) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == telemetry.MetricDBConnected && len(m.GetLabel()) == 1 &&
				m.GetLabel()[0].GetValue() == telemetry.LabelDevicehub {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatal(`no xiaoclaw_db_connected{service="devicehub"}`)
	return 0
}

// Every flag falls back to XIAOCLAW_<FLAG>, typed like the flag, and
// XIAOCLAW_DEVICE_TOKEN takes a comma-separated list.
func TestRunReadsFlagsFromTheEnvironment(t *testing.T) {
	for _, c := range []struct{ name, value, want string }{
		{"XIAOCLAW_DEVICE_TOKEN", "dev=t1, Bad.Tenant=t2", "--device-token"},
		{"XIAOCLAW_NOTIFY_BURST", "lots", "XIAOCLAW_NOTIFY_BURST"},
		{"XIAOCLAW_CALL_TIMEOUT", "soon", "XIAOCLAW_CALL_TIMEOUT"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(c.name, c.value)
			err := run([]string{"--nats-url", "nats://127.0.0.1:1"})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%s=%s: %v, want an error with %q", c.name, c.value, err, c.want)
			}
		})
	}
}
