package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
)

// TestMigrate runs `xiaoclaw migrate` twice against a fresh Postgres
// database, as the Helm hook does on install and upgrade.
func TestMigrate(t *testing.T) {
	ctx := context.Background()
	admin, err := tenancy.OpenPostgres(ctx, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		t.Fatalf("PostgreSQL on 127.0.0.1:5432 is required: %v", err)
	}
	defer admin.Close()
	name := fmt.Sprintf("xc_migrate_%d", time.Now().UnixNano())
	if _, err := admin.DB().ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("PostgreSQL on 127.0.0.1:5432 is required: %v", err)
	}
	defer admin.DB().ExecContext(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
	dsn := "postgres://postgres@127.0.0.1:5432/" + name + "?sslmode=disable"
	for i := range 2 {
		var out, errb bytes.Buffer
		if code := run(ctx, []string{"migrate", "--database-url", dsn}, func(string) string { return "" }, &out, &errb); code != exitOK {
			t.Fatalf("run %d: exit %d: %s", i, code, errb.String())
		}
		if !strings.Contains(out.String(), "up to date") {
			t.Fatalf("run %d: %q", i, out.String())
		}
	}
	st, err := tenancy.OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var n int
	if err := st.DB().QueryRowContext(ctx, "SELECT count(*) FROM tenants").Scan(&n); err != nil {
		t.Fatalf("the tenants table is missing after migrate: %v", err)
	}
	var errb bytes.Buffer
	if code := run(ctx, []string{"migrate"}, func(string) string { return "" }, &bytes.Buffer{}, &errb); code != exitUsage {
		t.Fatalf("migrate without a database: exit %d", code)
	}
}
