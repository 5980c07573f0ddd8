package backend

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
)

// A backend on SQLite keeps both stores in the directory, lets the static
// tokens in before the store's, serves the admin and audit APIs under /api/
// and gives a gateway all of it.
func TestOpenOnSQLite(t *testing.T) {
	ns, err := natsembed.Start(natsembed.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	nc, err := ns.Connect("backend")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if _, err := Open(ctx, Config{}, nc); err == nil {
		t.Fatal("opened without a database URL or a SQLite directory")
	}
	dir := t.TempDir()
	static := access.StaticTokens{"static-token": {Tenant: "acme", ID: "static:acme", Role: access.RoleOperator}}
	b, err := Open(ctx, Config{SQLiteDir: dir, Static: static, AdminToken: "admin-token-0123456789"}, nc)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, f := range []string{"xiaoclaw.db", "audit.db"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("store file %s: %v", f, err)
		}
	}
	if _, err := b.Manager.CreateTenant(ctx, tenancy.TenantSpec{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	if p, err := b.OperatorAuth.AuthenticateOperator(ctx, "static-token"); err != nil || p.Tenant != "acme" {
		t.Fatalf("static token: %+v %v", p, err)
	}
	if _, err := b.OperatorAuth.AuthenticateOperator(ctx, "no-such-token"); err == nil {
		t.Fatal("an unknown token authenticated")
	}
	for path, want := range map[string]int{
		"/api/whoami":       http.StatusOK, // admin API
		"/api/audit/events": http.StatusOK, // audit API
	} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Authorization", "Bearer static-token")
		rec := httptest.NewRecorder()
		b.API.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("GET %s = %d %s, want %d", path, rec.Code, rec.Body, want)
		}
	}

	var cfg gateway.Config
	b.Configure(&cfg)
	if cfg.Auth == nil || cfg.Limits == nil || cfg.Authorizer == nil || cfg.Auditor == nil ||
		cfg.ConnectAuditor == nil || cfg.AdminAPI == nil {
		t.Fatalf("Configure left a backend hook unset: %+v", cfg)
	}
}
