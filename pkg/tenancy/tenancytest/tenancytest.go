// Package tenancytest opens real, migrated, throw-away tenancy stores for
// tests: SQLite in a temporary directory and PostgreSQL in a fresh schema
// that is dropped when the test ends.
package tenancytest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
)

// DefaultPostgresURL is the local test server; XIAOCLAW_TEST_POSTGRES
// overrides it.
const DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// SQLite returns a migrated SQLite store in t.TempDir().
func SQLite(t testing.TB) *tenancy.SQLStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := tenancy.OpenSQLite(ctx, t.TempDir()+"/xiaoclaw.db")
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrate sqlite: %v", err)
	}
	return s
}

// PostgresURL returns the URL of the test server.
func PostgresURL() string {
	if u := os.Getenv("XIAOCLAW_TEST_POSTGRES"); u != "" {
		return u
	}
	return DefaultPostgresURL
}

// Postgres returns a migrated PostgreSQL store in a fresh schema of the
// test server. The test fails, never skips, when the server is unreachable.
func Postgres(t testing.TB) *tenancy.SQLStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := PostgresURL()
	admin, err := sql.Open("pgx", base)
	if err == nil {
		err = admin.PingContext(ctx)
	}
	if err != nil {
		t.Fatalf("PostgreSQL at %s is required by this test and is unreachable: %v "+
			"(start it, or point XIAOCLAW_TEST_POSTGRES at a server)", base, err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "xct_" + hex.EncodeToString(b)
	if _, err := admin.ExecContext(ctx, `CREATE SCHEMA `+schema); err != nil {
		admin.Close()
		t.Fatalf("create schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
		admin.Close()
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parse %s: %v", base, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	s, err := tenancy.OpenPostgres(ctx, u.String())
	if err != nil {
		t.Fatalf("open postgres: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrate postgres: %v", err)
	}
	return s
}

// Each runs fn as a subtest against a fresh store of every kind.
func Each(t *testing.T, fn func(t *testing.T, s *tenancy.SQLStore)) {
	for _, kind := range []struct {
		name string
		open func(testing.TB) *tenancy.SQLStore
	}{{"sqlite", SQLite}, {"postgres", Postgres}} {
		t.Run(kind.name, func(t *testing.T) { fn(t, kind.open(t)) })
	}
}
