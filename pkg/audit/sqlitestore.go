package audit

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/xiaoclaw/xiaoclaw/migrations"
)

// SQLiteStore keeps events in an SQLite file: the embedded default of
// `xiaoclaw dev`. It may share the file of the tenancy store.
type SQLiteStore struct {
	db *sql.DB
}

// OpenSQLite opens (creating if needed) the SQLite file at path, with WAL
// journaling and a busy timeout.
func OpenSQLite(ctx context.Context, path string) (*SQLiteStore, error) {
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("audit: open sqlite: %w", err)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("audit: open sqlite %s: %w", path, err)
	}
	return &SQLiteStore{db: db}, nil
}

// Migrate applies the embedded schema migrations not yet applied.
func (s *SQLiteStore) Migrate(ctx context.Context) error {
	_, err := migrations.Up(ctx, s.db, migrations.SQLite)
	return err
}

// DB exposes the database, for the SQL views and tests.
func (s *SQLiteStore) DB() *sql.DB { return s.db }

// Close closes the database.
func (s *SQLiteStore) Close() error { return s.db.Close() }

var sqliteInsert = func() string {
	ph := make([]string, len(columnNames))
	for i := range ph {
		ph[i] = fmt.Sprintf("$%d", i+1)
	}
	return `INSERT INTO audit_events (` + columns + `) VALUES (` + strings.Join(ph, ", ") + `) ON CONFLICT (id) DO NOTHING`
}()

// Write inserts events in one transaction, skipping known ids.
func (s *SQLiteStore) Write(ctx context.Context, events []Event) (int, error) {
	if len(events) == 0 {
		return 0, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("audit: sqlite: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	stmt, err := tx.PrepareContext(ctx, sqliteInsert)
	if err != nil {
		return 0, fmt.Errorf("audit: sqlite: %w", err)
	}
	defer stmt.Close()
	n := 0
	for i := range events {
		e := events[i]
		e.normalize()
		if err := e.Validate(); err != nil {
			return 0, err
		}
		var args any
		if len(e.Args) > 0 {
			args = string(e.Args)
		}
		res, err := stmt.ExecContext(ctx, e.ID, e.Time.UnixMicro(), e.Kind, e.Tenant, e.Principal, e.PrincipalName,
			e.Role, e.Node, e.Device, e.Command, e.Tool, args, e.Decision, e.RuleID, e.Outcome, e.ErrorCode,
			e.LatencyUs, e.TraceID, e.SpanID, e.IdempotencyKey, e.Replayed, e.RequestID, e.Instance, e.Detail)
		if err != nil {
			return 0, fmt.Errorf("audit: sqlite insert: %w", err)
		}
		k, _ := res.RowsAffected()
		n += int(k)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("audit: sqlite commit: %w", err)
	}
	return n, nil
}

// Prepare has nothing to create ahead on SQLite.
func (s *SQLiteStore) Prepare(context.Context, time.Time) error { return nil }

// Query returns one page of a tenant's events, newest first.
func (s *SQLiteStore) Query(ctx context.Context, q Query) (Page, error) {
	c, err := q.check()
	if err != nil {
		return Page{}, err
	}
	where, args := q.where(c, func(t time.Time) any { return t.UnixMicro() }, func(us int64) any { return us })
	rows, err := s.db.QueryContext(ctx, `SELECT `+columns+` FROM audit_events WHERE `+where+
		fmt.Sprintf(` ORDER BY ts DESC, id DESC LIMIT %d`, q.Limit+1), args...)
	if err != nil {
		return Page{}, fmt.Errorf("audit: query: %w", err)
	}
	defer rows.Close()
	return scanPage(rows, q.Limit, func(e *Event, ts int64, args sql.NullString) {
		e.Time = time.UnixMicro(ts).UTC()
		if args.Valid && args.String != "" {
			e.Args = []byte(args.String)
		}
	})
}

// Prune deletes rows older than each tenant's retention.
func (s *SQLiteStore) Prune(ctx context.Context, r Retention, now time.Time) (int64, error) {
	var deleted int64
	var own []any
	var marks []string
	for t, d := range r.Tenants {
		own = append(own, t)
		marks = append(marks, fmt.Sprintf("$%d", len(own)+1))
		if d > 0 {
			res, err := s.db.ExecContext(ctx, `DELETE FROM audit_events WHERE tenant = $1 AND ts < $2`, t, now.Add(-d).UnixMicro())
			if err != nil {
				return deleted, fmt.Errorf("audit: prune %s: %w", t, err)
			}
			k, _ := res.RowsAffected()
			deleted += k
		}
	}
	if r.Default > 0 {
		q := `DELETE FROM audit_events WHERE ts < $1`
		if len(marks) > 0 {
			q += ` AND tenant NOT IN (` + strings.Join(marks, ", ") + `)`
		}
		res, err := s.db.ExecContext(ctx, q, append([]any{now.Add(-r.Default).UnixMicro()}, own...)...)
		if err != nil {
			return deleted, fmt.Errorf("audit: prune: %w", err)
		}
		k, _ := res.RowsAffected()
		deleted += k
	}
	return deleted, nil
}
