package ops_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/xiaoclaw/xiaoclaw/pkg/ops"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry/telemetrytest"
)

// postgresURL is the local test server; XIAOCLAW_TEST_POSTGRES overrides it.
func postgresURL() string {
	if u := os.Getenv("XIAOCLAW_TEST_POSTGRES"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// waitMetric polls /metrics until it has the line want, or fails after 10 s.
func waitMetric(t *testing.T, base, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := get(t, base+"/metrics")
		if hasLine(body, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics never showed %q", want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func hasLine(body, line string) bool {
	for l := range strings.Lines(body) {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// dbOps serves the ops endpoints with h's readiness check and gauge.
func dbOps(t *testing.T, h *ops.DBHealth) string {
	t.Helper()
	reg := telemetry.NewRegistry()
	if err := h.Register(reg, telemetry.LabelGateway); err != nil {
		t.Fatal(err)
	}
	return startOps(t, ops.Config{Gatherer: reg, Checks: []ops.Check{h.Check()}}, nil)
}

// runHealth runs h.Run until the test ends.
func runHealth(t *testing.T, h *ops.DBHealth) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("DBHealth.Run: %v", err)
		}
	})
}

const (
	dbUp   = `xiaoclaw_db_connected{service="gateway"} 1`
	dbDown = `xiaoclaw_db_connected{service="gateway"} 0`
)

// TestDBConnectedFollowsTheDatabase: the gauge reads 1 while Postgres
// answers and 0 once the connection is gone, from the scheduled ping alone,
// and /readyz says the same.
func TestDBConnectedFollowsTheDatabase(t *testing.T) {
	db, err := sql.Open("pgx", postgresURL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("PostgreSQL at %s is required by this test and is unreachable: %v "+
			"(start it, or point XIAOCLAW_TEST_POSTGRES at a server)", postgresURL(), err)
	}
	var logs telemetrytest.LogBuffer
	h, err := ops.NewDBHealth(ops.DBHealthConfig{Ping: db.PingContext, Interval: 20 * time.Millisecond},
		slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	base := dbOps(t, h)
	if _, body := get(t, base+"/metrics"); !hasLine(body, dbDown) {
		t.Fatalf("before any ping the gauge must read 0:\n%s", body)
	}
	runHealth(t, h)
	waitMetric(t, base, dbUp)
	if code, r := readiness(t, base); code != http.StatusOK || r.Status != "ready" {
		t.Fatalf("/readyz %d %+v while the database answers", code, r)
	}

	db.Close() // the database is gone for this service
	waitMetric(t, base, dbDown)
	code, r := readiness(t, base)
	if code != http.StatusServiceUnavailable || len(r.Failing) != 1 || r.Failing[0] != "db" {
		t.Fatalf("/readyz %d %+v after the database went away, want only db failing", code, r)
	}
	if _, body := get(t, base+"/metrics"); !hasLine(body, dbDown) {
		t.Fatalf("the gauge disagrees with /readyz:\n%s", body)
	}
	// Every failed ping since is the same outage: one line says so.
	if n := strings.Count(logs.String(), "database unreachable"); n != 1 {
		t.Fatalf("the outage was logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestReadinessFeedsDBConnected: without the scheduled ping, each /readyz
// records its answer, so the gauge shows what readiness last found; a
// server that is not there reads 0 and fails readiness.
func TestReadinessFeedsDBConnected(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	for _, tc := range []struct {
		name, dsn, gauge string
		code             int
	}{
		{"reachable", postgresURL(), dbUp, http.StatusOK},
		{"closed port", fmt.Sprintf("postgres://postgres@127.0.0.1:%d/test?sslmode=disable&connect_timeout=2", closedPort),
			dbDown, http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, err := sql.Open("pgx", tc.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			h, err := ops.NewDBHealth(ops.DBHealthConfig{Ping: db.PingContext}, nil)
			if err != nil {
				t.Fatal(err)
			}
			base := dbOps(t, h)
			code, r := readiness(t, base)
			if code != tc.code {
				t.Fatalf("/readyz %d %+v, want %d", code, r, tc.code)
			}
			if _, body := get(t, base+"/metrics"); !hasLine(body, tc.gauge) {
				t.Fatalf("after /readyz answered %d the metrics lack %q:\n%s", code, tc.gauge, body)
			}
		})
	}
}
