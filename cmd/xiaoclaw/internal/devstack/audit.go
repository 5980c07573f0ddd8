package devstack

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/auditapi"
)

// Audit is the audit trail of the stack: the publisher the gateways call
// before answering, the store the writer fills and the query API.
type Audit struct {
	Publisher *audit.Publisher
	Store     audit.Store
	API       http.Handler
	closeFn   func() error
}

// Auditor is the gateways' audit hook.
func (a *Audit) Auditor() gateway.Auditor { return auditapi.InvokeAuditor(a.Publisher) }

// ConnectAuditor is a gateway's best-effort hook for connects and refused
// connects.
func (a *Audit) ConnectAuditor(log *slog.Logger) gateway.ConnectAuditor {
	return auditapi.ConnectAuditor(a.Publisher, log)
}

func openAudit(ctx context.Context, cfg Config, nc *nats.Conn, t *Tenancy, log *slog.Logger) (*Audit, error) {
	a := &Audit{}
	var err error
	if cfg.DatabaseURL != "" {
		var pg *audit.PostgresStore
		if pg, err = audit.OpenPostgres(ctx, cfg.DatabaseURL); err == nil {
			a.Store, a.closeFn = pg, pg.Close
			err = pg.Migrate(ctx)
		}
	} else {
		var lite *audit.SQLiteStore
		if lite, err = audit.OpenSQLite(ctx, filepath.Join(cfg.DataDir, "audit.db")); err == nil {
			a.Store, a.closeFn = lite, lite.Close
			err = lite.Migrate(ctx)
		}
	}
	if err != nil {
		a.close()
		return nil, fmt.Errorf("audit store: %w", err)
	}
	if a.Publisher, err = audit.NewPublisher(ctx, nc, audit.PublisherConfig{}, log); err != nil {
		a.close()
		return nil, fmt.Errorf("audit publisher: %w", err)
	}
	var admins []string
	if cfg.AdminToken != "" {
		admins = []string{cfg.AdminToken}
	}
	if a.API, err = auditapi.New(auditapi.Config{Store: a.Store, Operators: t.OperatorAuth, AdminTokens: admins, Log: log}); err != nil {
		a.close()
		return nil, err
	}
	return a, nil
}

func (a *Audit) close() {
	if a.closeFn != nil {
		_ = a.closeFn()
	}
}

// adminRoutes serves the audit API under /api/audit/ and the admin API
// under the rest of /api/.
func adminRoutes(admin, auditAPI http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/api/audit/", auditAPI)
	mux.Handle("/api/", admin)
	return mux
}

// runTogether runs every run until ctx is done or one fails, and returns
// the first error.
func runTogether(runs ...func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		g, gctx := errgroup.WithContext(ctx)
		for _, run := range runs {
			g.Go(func() error { return run(gctx) })
		}
		return g.Wait()
	}
}

// ready adapts a component that is ready as soon as it runs.
type ready struct {
	run func(context.Context) error
	ch  chan struct{}
}

func readyAtOnce(run func(context.Context) error) ready {
	ch := make(chan struct{})
	close(ch)
	return ready{run: run, ch: ch}
}

func (r ready) Run(ctx context.Context) error { return r.run(ctx) }
func (r ready) Ready() <-chan struct{}        { return r.ch }
