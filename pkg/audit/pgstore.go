package audit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/xiaoclaw/xiaoclaw/migrations"
)

// PartitionsAhead is how many days of partitions Prepare creates after
// today.
const PartitionsAhead = 3

// PostgresStore keeps events in the daily-partitioned audit_events table.
type PostgresStore struct {
	pool *pgxpool.Pool
	mu   sync.Mutex
	days map[string]bool // partitions known to exist
}

// OpenPostgres connects to dsn (e.g. "postgres://user@host:5432/db") and
// fails at once if the server is unreachable. Call Migrate before use
// unless a separate job migrates the schema.
func OpenPostgres(ctx context.Context, dsn string) (*PostgresStore, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("audit: postgres: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("audit: postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("audit: postgres unreachable: %w", err)
	}
	return NewPostgresStore(pool), nil
}

// NewPostgresStore uses an existing pool; Close closes it.
func NewPostgresStore(pool *pgxpool.Pool) *PostgresStore {
	return &PostgresStore{pool: pool, days: map[string]bool{}}
}

// Migrate applies the embedded schema migrations not yet applied.
func (s *PostgresStore) Migrate(ctx context.Context) error {
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close()
	_, err := migrations.Up(ctx, db, migrations.Postgres)
	return err
}

// Pool exposes the connection pool, for the SQL views and tests.
func (s *PostgresStore) Pool() *pgxpool.Pool { return s.pool }

// Close closes the pool.
func (s *PostgresStore) Close() error { s.pool.Close(); return nil }

// Write copies events into a staging table and moves the new ones into
// audit_events in one transaction.
func (s *PostgresStore) Write(ctx context.Context, events []Event) (int, error) {
	if len(events) == 0 {
		return 0, nil
	}
	rows := make([][]any, 0, len(events))
	days := map[time.Time]bool{}
	for i := range events {
		e := events[i]
		e.normalize()
		if err := e.Validate(); err != nil {
			return 0, err
		}
		days[dayOf(e.Time)] = true
		var args any
		if len(e.Args) > 0 {
			args = []byte(e.Args)
		}
		rows = append(rows, []any{e.ID, e.Time, e.Kind, e.Tenant, e.Principal, e.PrincipalName, e.Role, e.Node,
			e.Device, e.Command, e.Tool, args, e.Decision, e.RuleID, e.Outcome, e.ErrorCode, e.LatencyUs, e.TraceID,
			e.SpanID, e.IdempotencyKey, e.Replayed, e.RequestID, e.Instance, e.Detail})
	}
	for d := range days {
		if err := s.ensurePartition(ctx, d); err != nil {
			return 0, err
		}
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("audit: postgres: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE IF NOT EXISTS audit_staging
		(LIKE audit_events INCLUDING DEFAULTS) ON COMMIT DELETE ROWS`); err != nil {
		return 0, fmt.Errorf("audit: postgres staging: %w", err)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"audit_staging"}, columnNames, pgx.CopyFromRows(rows)); err != nil {
		return 0, fmt.Errorf("audit: postgres copy: %w", err)
	}
	tag, err := tx.Exec(ctx, `INSERT INTO audit_events (`+columns+`) SELECT `+columns+
		` FROM audit_staging ON CONFLICT DO NOTHING`)
	if err != nil {
		return 0, fmt.Errorf("audit: postgres insert: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("audit: postgres commit: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

func dayOf(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

const partitionPrefix = "audit_events_p"

func partitionName(day time.Time) string { return partitionPrefix + day.Format("20060102") }

// ensurePartition creates the partition of day unless it is known to exist.
func (s *PostgresStore) ensurePartition(ctx context.Context, day time.Time) error {
	name := partitionName(day)
	s.mu.Lock()
	known := s.days[name]
	s.mu.Unlock()
	if known {
		return nil
	}
	sql := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF audit_events FOR VALUES FROM ('%s') TO ('%s')`,
		name, day.Format(time.RFC3339), day.AddDate(0, 0, 1).Format(time.RFC3339))
	_, err := s.pool.Exec(ctx, sql)
	var pg *pgconn.PgError
	if errors.As(err, &pg) && (pg.Code == "42P07" || pg.Code == "23505") {
		err = nil // another writer created it at the same moment
	}
	if err != nil {
		return fmt.Errorf("audit: create partition %s: %w", name, err)
	}
	s.mu.Lock()
	s.days[name] = true
	s.mu.Unlock()
	return nil
}

// Prepare creates the partitions of yesterday, today and PartitionsAhead
// days after.
func (s *PostgresStore) Prepare(ctx context.Context, now time.Time) error {
	today := dayOf(now)
	for i := -1; i <= PartitionsAhead; i++ {
		if err := s.ensurePartition(ctx, today.AddDate(0, 0, i)); err != nil {
			return err
		}
	}
	return nil
}

// Query returns one page of a tenant's events, newest first.
func (s *PostgresStore) Query(ctx context.Context, q Query) (Page, error) {
	c, err := q.check()
	if err != nil {
		return Page{}, err
	}
	where, args := q.where(c, func(t time.Time) any { return t }, func(us int64) any { return time.UnixMicro(us).UTC() })
	rows, err := s.pool.Query(ctx, `SELECT `+columns+` FROM audit_events WHERE `+where+
		fmt.Sprintf(` ORDER BY ts DESC, id DESC LIMIT %d`, q.Limit+1), args...)
	if err != nil {
		return Page{}, fmt.Errorf("audit: query: %w", err)
	}
	defer rows.Close()
	return scanPage(rows, q.Limit, func(e *Event, ts time.Time, args []byte) {
		e.Time = ts.UTC()
		if len(args) > 0 {
			e.Args = args
		}
	})
}

// Prune drops every partition wholly older than the longest retention,
// then deletes the rows of tenants whose retention is shorter. It returns
// the number of rows deleted (rows of dropped partitions not counted).
func (s *PostgresStore) Prune(ctx context.Context, r Retention, now time.Time) (int64, error) {
	longest := r.longest()
	if longest > 0 {
		cut := now.Add(-longest)
		rows, err := s.pool.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = 'audit_events'::regclass`)
		if err != nil {
			return 0, fmt.Errorf("audit: prune: %w", err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return 0, fmt.Errorf("audit: prune: %w", err)
		}
		for _, n := range names {
			day, err := time.Parse("20060102", strings.TrimPrefix(n, partitionPrefix))
			if err != nil || !strings.HasPrefix(n, partitionPrefix) || day.AddDate(0, 0, 1).After(cut) {
				continue
			}
			if _, err := s.pool.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{n}.Sanitize()); err != nil {
				return 0, fmt.Errorf("audit: drop partition %s: %w", n, err)
			}
			s.mu.Lock()
			delete(s.days, n)
			s.mu.Unlock()
		}
	}
	var deleted int64
	var own []string
	for t, d := range r.Tenants {
		own = append(own, t)
		if d > 0 {
			tag, err := s.pool.Exec(ctx, `DELETE FROM audit_events WHERE tenant = $1 AND ts < $2`, t, now.Add(-d))
			if err != nil {
				return deleted, fmt.Errorf("audit: prune %s: %w", t, err)
			}
			deleted += tag.RowsAffected()
		}
	}
	if r.Default > 0 {
		if own == nil {
			own = []string{}
		}
		tag, err := s.pool.Exec(ctx, `DELETE FROM audit_events WHERE ts < $1 AND tenant <> ALL($2)`, now.Add(-r.Default), own)
		if err != nil {
			return deleted, fmt.Errorf("audit: prune: %w", err)
		}
		deleted += tag.RowsAffected()
	}
	return deleted, nil
}
