package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sync/errgroup"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/backend"
)

// freshDatabase creates a database on the local test server (or
// XIAOCLAW_TEST_POSTGRES's) and returns its URL; it is dropped at the end.
func freshDatabase(t *testing.T) string {
	t.Helper()
	server := "postgres://postgres@127.0.0.1:5432"
	if u := os.Getenv("XIAOCLAW_TEST_POSTGRES"); u != "" {
		server = u
	}
	ctx := context.Background()
	admin, err := tenancy.OpenPostgres(ctx, server+"/test?sslmode=disable")
	if err != nil {
		t.Fatalf("PostgreSQL at %s is required: %v", server, err)
	}
	t.Cleanup(func() { admin.Close() })
	name := fmt.Sprintf("xc_gwbackend_%d", time.Now().UnixNano())
	if _, err := admin.DB().ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("PostgreSQL at %s is required: %v", server, err)
	}
	t.Cleanup(func() { _, _ = admin.DB().ExecContext(ctx, "DROP DATABASE "+name+" WITH (FORCE)") })
	return server + "/" + name + "?sslmode=disable"
}

// TestBackendExportsDatabaseAndAuditGauges: a gateway with a database
// reports it reachable on /metrics and in the db readiness check, and the
// one that runs the audit writer exports the audit backlog and lag.
func TestBackendExportsDatabaseAndAuditGauges(t *testing.T) {
	dsn := freshDatabase(t)
	ns, err := natsembed.Start(natsembed.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	nc, err := ns.Connect("gateway")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg := telemetry.NewRegistry()
	be, runners, err := openBackend(ctx, backend.Config{DatabaseURL: dsn}, nc, true, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close)
	g, gctx := errgroup.WithContext(ctx)
	for _, run := range runners {
		g.Go(func() error { return run(gctx) })
	}
	t.Cleanup(func() {
		cancel()
		if err := g.Wait(); err != nil {
			t.Errorf("backend runners: %v", err)
		}
	})

	eventually.True(t, "the database reported reachable", be.DB.Connected)
	if check := be.DB.Check(); check.Name != "db" || check.Run(ctx) != nil {
		t.Fatalf("readiness check %q: want a passing db check", check.Name)
	}
	for name, want := range map[string]int{
		telemetry.MetricDBConnected: 1, telemetry.MetricAuditBacklog: 1, telemetry.MetricAuditLag: 1,
	} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != want {
			t.Errorf("%s: %d series (%v), want %d", name, n, err, want)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != telemetry.MetricDBConnected {
			continue
		}
		m := mf.GetMetric()[0]
		if l := m.GetLabel(); len(l) != 1 || l[0].GetValue() != telemetry.LabelGateway || m.GetGauge().GetValue() != 1 {
			t.Errorf("xiaoclaw_db_connected = %v %v, want service=gateway 1", l, m.GetGauge().GetValue())
		}
	}
}
