package audit_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed/natsembedtest"
)

// defaultPostgresURL is the local test server; XIAOCLAW_TEST_POSTGRES
// overrides it.
const defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testLog(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return quietLog()
}

func postgresURL() string {
	if u := os.Getenv("XIAOCLAW_TEST_POSTGRES"); u != "" {
		return u
	}
	return defaultPostgresURL
}

// freshSchema creates a schema on the server at base and returns a URL
// whose connections use it; the schema is dropped when the test ends. The
// test fails, never skips, if the server is unreachable.
func freshSchema(t testing.TB, base string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("PostgreSQL at %s is required by this test and is unreachable: %v "+
			"(start it, or point XIAOCLAW_TEST_POSTGRES at a server)", base, err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "xca_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	admin.Close(ctx)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// openPostgres returns a migrated store in a fresh schema of dsn's server.
func openPostgres(t testing.TB, base string) *audit.PostgresStore {
	t.Helper()
	dsn := freshSchema(t, base)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := audit.OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return s
}

func openSQLite(t testing.TB) *audit.SQLiteStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := audit.OpenSQLite(ctx, filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return s
}

// embeddedNATS starts a JetStream server and returns a connection factory.
func embeddedNATS(t testing.TB) func() *nats.Conn {
	t.Helper()
	srv := natsembedtest.Start(t)
	return func() *nats.Conn {
		nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}

// throwawayPostgres is a PostgreSQL cluster of the test's own, under /tmp,
// that the test may stop and start.
type throwawayPostgres struct {
	t    testing.TB
	bin  string
	dir  string
	port int
}

func (p *throwawayPostgres) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

func (p *throwawayPostgres) pgctl(args ...string) error {
	cmd := exec.Command("su", "postgres", "-c", filepath.Join(p.bin, "pg_ctl")+" "+shellJoin(args))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %v: %v: %s", args, err, out)
	}
	return nil
}

// start starts the cluster. Commits are synchronous (the default): an
// immediate stop is a crash, and only synchronous commits survive one.
func (p *throwawayPostgres) start() {
	p.t.Helper()
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off -c full_page_writes=off", p.port, p.dir)
	if err := p.pgctl("-D", p.dir+"/data", "-l", p.dir+"/server.log", "-w", "-o", opts, "start"); err != nil {
		p.t.Fatal(err)
	}
}

func (p *throwawayPostgres) stop() {
	p.t.Helper()
	if err := p.pgctl("-D", p.dir+"/data", "-m", "immediate", "-w", "stop"); err != nil {
		p.t.Fatal(err)
	}
}

func shellJoin(args []string) string {
	s := ""
	for _, a := range args {
		s += " '" + a + "'"
	}
	return s
}

// startThrowawayPostgres runs initdb and starts a cluster on a free port
// (toolchain.md §2 option B); it is stopped by its own pg_ctl at the end.
func startThrowawayPostgres(t testing.TB) *throwawayPostgres {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	if len(bins) == 0 {
		t.Fatal("this test needs PostgreSQL's server binaries (/usr/lib/postgresql/*/bin) to run a cluster of its own")
	}
	dir, err := os.MkdirTemp("/tmp", "xcaudit-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if out, err := exec.Command("chown", "postgres", dir).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v %s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	p := &throwawayPostgres{t: t, bin: bins[len(bins)-1], dir: dir, port: port}
	initdb := exec.Command("su", "postgres", "-c", filepath.Join(p.bin, "initdb")+shellJoin([]string{"-D", dir + "/data", "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"}))
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v %s", err, out)
	}
	p.start()
	t.Cleanup(func() { _ = p.pgctl("-D", dir+"/data", "-m", "immediate", "-w", "stop") })
	return p
}
