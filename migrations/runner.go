package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Dialect names the SQL database a migration runs on.
type Dialect string

// Supported dialects.
const (
	Postgres Dialect = "postgres"
	SQLite   Dialect = "sqlite"
)

// advisoryLockID serialises concurrent runners on one PostgreSQL database
// (several replicas starting at once); SQLite serialises writers itself.
const advisoryLockID = 0x78636c6177 // "xclaw"

// Migration is one numbered schema version.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
}

// Load reads the migrations for dialect d from fsys, sorted by version. It
// fails on a gap or duplicate in the numbering, or a version without an up
// file, so a bad file set never reaches a database.
func Load(fsys fs.FS, d Dialect) ([]Migration, error) {
	if d != Postgres && d != SQLite {
		return nil, fmt.Errorf("migrations: unknown dialect %q", d)
	}
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	byVersion := map[int]*Migration{}
	// A dialect-specific file wins over a portable one of the same version.
	specific := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".sql") {
			continue
		}
		version, label, dialect, direction, err := parseName(name)
		if err != nil {
			return nil, err
		}
		if dialect != "" && dialect != d {
			continue
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("migrations: %w", err)
		}
		m := byVersion[version]
		if m == nil {
			m = &Migration{Version: version, Name: label}
			byVersion[version] = m
		} else if m.Name != label {
			return nil, fmt.Errorf("migrations: version %d has two names, %q and %q", version, m.Name, label)
		}
		key := fmt.Sprintf("%d.%s", version, direction)
		if dialect == "" && specific[key] {
			continue
		}
		if dialect != "" {
			specific[key] = true
		}
		if direction == "up" {
			m.Up = string(body)
		} else {
			m.Down = string(body)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.Up == "" {
			return nil, fmt.Errorf("migrations: version %d has no up file", m.Version)
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migrations: expected version %d, found %d", i+1, m.Version)
		}
	}
	return out, nil
}

// parseName splits "0001_name[.dialect].up.sql".
func parseName(file string) (version int, label string, d Dialect, direction string, err error) {
	bad := fmt.Errorf("migrations: file %q is not NNNN_name[.postgres|.sqlite].up|down.sql", file)
	parts := strings.Split(strings.TrimSuffix(file, ".sql"), ".")
	switch len(parts) {
	case 2:
	case 3:
		d = Dialect(parts[1])
		if d != Postgres && d != SQLite {
			return 0, "", "", "", bad
		}
	default:
		return 0, "", "", "", bad
	}
	direction = parts[len(parts)-1]
	if direction != "up" && direction != "down" {
		return 0, "", "", "", bad
	}
	num, label, ok := strings.Cut(parts[0], "_")
	if !ok || label == "" || len(num) != 4 {
		return 0, "", "", "", bad
	}
	version, err = strconv.Atoi(num)
	if err != nil || version < 1 {
		return 0, "", "", "", bad
	}
	return version, label, d, direction, nil
}

// Up applies every embedded migration not yet recorded in db and returns
// the versions it applied.
func Up(ctx context.Context, db *sql.DB, d Dialect) ([]int, error) {
	ms, err := Load(files, d)
	if err != nil {
		return nil, err
	}
	return apply(ctx, db, d, ms)
}

// Down rolls back, newest first, every applied version above target
// (target 0 removes the whole schema).
func Down(ctx context.Context, db *sql.DB, d Dialect, target int) error {
	ms, err := Load(files, d)
	if err != nil {
		return err
	}
	return withConn(ctx, db, d, func(conn *sql.Conn) error {
		done, err := appliedVersions(ctx, conn)
		if err != nil {
			return err
		}
		for i := len(ms) - 1; i >= 0; i-- {
			m := ms[i]
			if m.Version <= target || !done[m.Version] {
				continue
			}
			if m.Down == "" {
				return fmt.Errorf("migrations: version %d has no down file", m.Version)
			}
			if err := inTx(ctx, conn, func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, m.Down); err != nil {
					return err
				}
				_, err := tx.ExecContext(ctx, `DELETE FROM schema_migrations WHERE version = $1`, m.Version)
				return err
			}); err != nil {
				return fmt.Errorf("migrations: down %04d_%s: %w", m.Version, m.Name, err)
			}
		}
		return nil
	})
}

func apply(ctx context.Context, db *sql.DB, d Dialect, ms []Migration) ([]int, error) {
	var applied []int
	err := withConn(ctx, db, d, func(conn *sql.Conn) error {
		done, err := appliedVersions(ctx, conn)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if done[m.Version] {
				continue
			}
			if err := inTx(ctx, conn, func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, m.Up); err != nil {
					return err
				}
				_, err := tx.ExecContext(ctx,
					`INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)`,
					m.Version, m.Name, time.Now().UnixMilli())
				return err
			}); err != nil {
				return fmt.Errorf("migrations: up %04d_%s: %w", m.Version, m.Name, err)
			}
			applied = append(applied, m.Version)
		}
		return nil
	})
	return applied, err
}

// withConn runs fn on one connection that holds the migration lock and has
// the schema_migrations table.
func withConn(ctx context.Context, db *sql.DB, d Dialect, fn func(*sql.Conn) error) (err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	defer conn.Close()
	if d == Postgres {
		if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, advisoryLockID); err != nil {
			return fmt.Errorf("migrations: lock: %w", err)
		}
		defer func() {
			// A fresh context: the unlock must run even when ctx is done.
			_, uerr := conn.ExecContext(context.Background(), `SELECT pg_advisory_unlock($1)`, advisoryLockID)
			err = errors.Join(err, uerr)
		}()
	}
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    BIGINT PRIMARY KEY,
		name       TEXT   NOT NULL,
		applied_at BIGINT NOT NULL)`); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	return fn(conn)
}

func appliedVersions(ctx context.Context, conn *sql.Conn) (map[int]bool, error) {
	rows, err := conn.QueryContext(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	defer rows.Close()
	done := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("migrations: %w", err)
		}
		done[v] = true
	}
	return done, rows.Err()
}

func inTx(ctx context.Context, conn *sql.Conn, fn func(*sql.Tx) error) error {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	return tx.Commit()
}
