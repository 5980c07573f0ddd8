package devstack

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/ops"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

// TestStackExportsDatabaseAndAuditGauges: with a registry, the stack's
// /metrics (on the gateway's port) say that the database answers, for
// both services that use it, and carry the audit backlog and lag, which
// read 0 once the audit trail has caught up.
func TestStackExportsDatabaseAndAuditGauges(t *testing.T) {
	reg := telemetry.NewRegistry()
	ops, err := ops.NewServer(ops.Config{Gatherer: reg}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := startStack(t, Config{Registerer: reg, Ops: ops.Handler()})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := st.DB.Check().Run(ctx); err != nil {
		t.Fatalf("db readiness check: %v", err)
	}

	want := []string{
		`xiaoclaw_db_connected{service="gateway"} 1`,
		`xiaoclaw_db_connected{service="devicehub"} 1`,
		`xiaoclaw_audit_backlog 0`,
		`xiaoclaw_audit_lag_seconds 0`,
	}
	deadline := time.Now().Add(waitLimit)
	for {
		body := httpGet(t, "http://"+st.Gateways[0].Addr()+"/metrics")
		var missing []string
		for _, w := range want {
			if !strings.Contains(body, w+"\n") {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %q", missing)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
