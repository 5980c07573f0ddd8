package tenancy

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/xiaoclaw/xiaoclaw/migrations"
)

// SQLStore implements Store on PostgreSQL (through pgx) or SQLite (pure Go,
// modernc.org/sqlite). Both run the same SQL: it is portable, with $n
// placeholders, which both drivers accept.
type SQLStore struct {
	db      *sql.DB
	dialect migrations.Dialect
}

// OpenPostgres opens a PostgreSQL store, e.g.
// "postgres://user@host:5432/db?sslmode=disable". Call Migrate before use
// unless a separate job migrates the schema.
func OpenPostgres(ctx context.Context, dsn string) (*SQLStore, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("tenancy: open postgres: %w", err)
	}
	db.SetMaxOpenConns(8)
	db.SetConnMaxIdleTime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("tenancy: postgres unreachable: %w", err)
	}
	return &SQLStore{db: db, dialect: migrations.Postgres}, nil
}

// OpenSQLite opens (creating if needed) a SQLite store in the file at path,
// with foreign keys on, WAL journaling and a busy timeout so that a reader
// never fails while a writer holds the lock.
func OpenSQLite(ctx context.Context, path string) (*SQLStore, error) {
	q := url.Values{}
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("tenancy: open sqlite: %w", err)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("tenancy: open sqlite %s: %w", path, err)
	}
	return &SQLStore{db: db, dialect: migrations.SQLite}, nil
}

// Migrate applies the embedded schema migrations that are not yet applied.
func (s *SQLStore) Migrate(ctx context.Context) error {
	_, err := migrations.Up(ctx, s.db, s.dialect)
	return err
}

// DB exposes the database handle, for tests and for other tables of the
// same database.
func (s *SQLStore) DB() *sql.DB { return s.db }

// Close closes the database.
func (s *SQLStore) Close() error { return s.db.Close() }

func ms(t time.Time) int64 { return t.UnixMilli() }

// nullMs stores the zero time as NULL.
func nullMs(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixMilli(), Valid: true}
}

func fromMs(v int64) time.Time { return time.UnixMilli(v).UTC() }

func fromNullMs(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return fromMs(v.Int64)
}

// classify maps driver errors to the package's errors.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNotFound
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "23505" {
		return fmt.Errorf("%w: %s", ErrConflict, pg.Detail)
	}
	var lite *sqlite.Error
	if errors.As(err, &lite) {
		switch lite.Code() {
		case sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, sqlite3.SQLITE_CONSTRAINT_UNIQUE:
			return fmt.Errorf("%w: %v", ErrConflict, err)
		}
	}
	return err
}

func (s *SQLStore) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return errors.Join(classify(err), tx.Rollback())
	}
	return classify(tx.Commit())
}

// bump raises the tenant's version; ErrNotFound if there is no tenant.
func bump(ctx context.Context, tx *sql.Tx, tenant string, at time.Time) error {
	res, err := tx.ExecContext(ctx,
		`UPDATE tenants SET version = version + 1, updated_at = $2 WHERE id = $1`, tenant, ms(at))
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return fmt.Errorf("tenant %q: %w", tenant, ErrNotFound)
	}
	return nil
}

const tenantCols = `id, display_name, status, default_effect, device_allowlist, version, created_at, updated_at, max_inflight, max_inflight_per_device, require_tool_approval`

type scanner interface{ Scan(...any) error }

func scanTenant(r scanner) (Tenant, error) {
	var t Tenant
	var created, updated int64
	var maxInflight, perDevice sql.NullInt64
	err := r.Scan(&t.ID, &t.DisplayName, &t.Status, &t.DefaultEffect, &t.DeviceAllowlist, &t.Version, &created, &updated,
		&maxInflight, &perDevice, &t.RequireToolApproval)
	t.CreatedAt, t.UpdatedAt = fromMs(created), fromMs(updated)
	t.Limits = Limits{MaxInflight: int(maxInflight.Int64), MaxInflightPerDevice: int(perDevice.Int64)}
	return t, err
}

// nullLimit stores a default (0) limit as NULL; the schema refuses a
// negative one.
func nullLimit(v int) sql.NullInt64 {
	return sql.NullInt64{Int64: int64(v), Valid: v != 0}
}

// CreateTenant inserts t; ErrConflict if the id is taken.
func (s *SQLStore) CreateTenant(ctx context.Context, t Tenant) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO tenants (`+tenantCols+`) VALUES ($1, $2, $3, $4, $5, 1, $6, $6, $7, $8, $9)`,
		t.ID, t.DisplayName, t.Status, t.DefaultEffect, t.DeviceAllowlist, ms(t.CreatedAt),
		nullLimit(t.Limits.MaxInflight), nullLimit(t.Limits.MaxInflightPerDevice), t.RequireToolApproval)
	return classify(err)
}

// Tenant returns one tenant.
func (s *SQLStore) Tenant(ctx context.Context, id string) (Tenant, error) {
	t, err := scanTenant(s.db.QueryRowContext(ctx, `SELECT `+tenantCols+` FROM tenants WHERE id = $1`, id))
	if err != nil {
		return Tenant{}, fmt.Errorf("tenant %q: %w", id, classify(err))
	}
	return t, nil
}

// Tenants returns all tenants sorted by id.
func (s *SQLStore) Tenants(ctx context.Context) ([]Tenant, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+tenantCols+` FROM tenants ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Tenant{}
	for rows.Next() {
		t, err := scanTenant(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// UpdateTenant changes the fields u names.
func (s *SQLStore) UpdateTenant(ctx context.Context, id string, u TenantUpdate, at time.Time) (Tenant, error) {
	var out Tenant
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		t, err := scanTenant(tx.QueryRowContext(ctx, `SELECT `+tenantCols+` FROM tenants WHERE id = $1`, id))
		if err != nil {
			return fmt.Errorf("tenant %q: %w", id, classify(err))
		}
		if u.DisplayName != nil {
			t.DisplayName = *u.DisplayName
		}
		if u.Status != nil {
			t.Status = *u.Status
		}
		if u.DefaultEffect != nil {
			t.DefaultEffect = *u.DefaultEffect
		}
		if u.MaxInflight != nil {
			t.Limits.MaxInflight = *u.MaxInflight
		}
		if u.MaxInflightPerDevice != nil {
			t.Limits.MaxInflightPerDevice = *u.MaxInflightPerDevice
		}
		if u.RequireToolApproval != nil {
			t.RequireToolApproval = *u.RequireToolApproval
		}
		t.Version++
		t.UpdatedAt = fromMs(ms(at))
		_, err = tx.ExecContext(ctx, `UPDATE tenants SET display_name = $2, status = $3, default_effect = $4,
			version = $5, updated_at = $6, max_inflight = $7, max_inflight_per_device = $8, require_tool_approval = $9 WHERE id = $1`,
			id, t.DisplayName, t.Status, t.DefaultEffect, t.Version, ms(at),
			nullLimit(t.Limits.MaxInflight), nullLimit(t.Limits.MaxInflightPerDevice), t.RequireToolApproval)
		out = t
		return err
	})
	return out, err
}

// TenantVersions maps tenant ids to versions.
func (s *SQLStore) TenantVersions(ctx context.Context) (map[string]int64, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, version FROM tenants`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var id string
		var v int64
		if err := rows.Scan(&id, &v); err != nil {
			return nil, err
		}
		out[id] = v
	}
	return out, rows.Err()
}

const tokenCols = `id, tenant, name, role, secret_hash, created_at, expires_at, revoked_at`

func scanToken(r scanner) (Token, error) {
	var t Token
	var created int64
	var expires, revoked sql.NullInt64
	err := r.Scan(&t.ID, &t.Tenant, &t.Name, &t.Role, &t.SecretHash, &created, &expires, &revoked)
	t.CreatedAt, t.ExpiresAt, t.RevokedAt = fromMs(created), fromNullMs(expires), fromNullMs(revoked)
	return t, err
}

// CreateToken stores a token record.
func (s *SQLStore) CreateToken(ctx context.Context, t Token) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := bump(ctx, tx, t.Tenant, t.CreatedAt); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO operator_tokens (`+tokenCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL)`,
			t.ID, t.Tenant, t.Name, t.Role, t.SecretHash, ms(t.CreatedAt), nullMs(t.ExpiresAt))
		return err
	})
}

// Token returns a token by id.
func (s *SQLStore) Token(ctx context.Context, id string) (Token, error) {
	t, err := scanToken(s.db.QueryRowContext(ctx, `SELECT `+tokenCols+` FROM operator_tokens WHERE id = $1`, id))
	if err != nil {
		return Token{}, fmt.Errorf("token %q: %w", id, classify(err))
	}
	return t, nil
}

// Tokens returns the tenant's tokens, oldest first.
func (s *SQLStore) Tokens(ctx context.Context, tenant string) ([]Token, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+tokenCols+` FROM operator_tokens WHERE tenant = $1 ORDER BY created_at, id`, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Token{}
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// RevokeToken revokes a token of the tenant.
func (s *SQLStore) RevokeToken(ctx context.Context, tenant, id string, at time.Time) (Token, error) {
	var out Token
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		t, err := scanToken(tx.QueryRowContext(ctx, `SELECT `+tokenCols+` FROM operator_tokens WHERE id = $1 AND tenant = $2`, id, tenant))
		if err != nil {
			return fmt.Errorf("token %q: %w", id, classify(err))
		}
		if !t.RevokedAt.IsZero() {
			out = t
			return nil
		}
		if err := bump(ctx, tx, tenant, at); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE operator_tokens SET revoked_at = $3 WHERE id = $1 AND tenant = $2`, id, tenant, ms(at)); err != nil {
			return err
		}
		t.RevokedAt = fromMs(ms(at))
		out = t
		return nil
	})
	return out, err
}

const keyCols = `id, tenant, secret, created_at, retire_at`

func scanKey(r scanner) (DeviceKey, error) {
	var k DeviceKey
	var created int64
	var retire sql.NullInt64
	err := r.Scan(&k.ID, &k.Tenant, &k.Secret, &created, &retire)
	k.CreatedAt, k.RetireAt = fromMs(created), fromNullMs(retire)
	return k, err
}

func insertKey(ctx context.Context, tx *sql.Tx, k DeviceKey) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO device_keys (`+keyCols+`) VALUES ($1, $2, $3, $4, $5)`,
		k.ID, k.Tenant, k.Secret, ms(k.CreatedAt), nullMs(k.RetireAt))
	return err
}

// CreateDeviceKey stores a new device key.
func (s *SQLStore) CreateDeviceKey(ctx context.Context, k DeviceKey) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := bump(ctx, tx, k.Tenant, k.CreatedAt); err != nil {
			return err
		}
		return insertKey(ctx, tx, k)
	})
}

// DeviceKey returns a key by id.
func (s *SQLStore) DeviceKey(ctx context.Context, id string) (DeviceKey, error) {
	k, err := scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyCols+` FROM device_keys WHERE id = $1`, id))
	if err != nil {
		return DeviceKey{}, fmt.Errorf("device key %q: %w", id, classify(err))
	}
	return k, nil
}

func queryKeys(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, tenant string) ([]DeviceKey, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+keyCols+` FROM device_keys WHERE tenant = $1 ORDER BY created_at, id`, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []DeviceKey{}
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// DeviceKeys returns the tenant's keys, oldest first.
func (s *SQLStore) DeviceKeys(ctx context.Context, tenant string) ([]DeviceKey, error) {
	return queryKeys(ctx, s.db, tenant)
}

// RotateDeviceKeys adds k and retires the tenant's other keys by retireAt.
func (s *SQLStore) RotateDeviceKeys(ctx context.Context, k DeviceKey, retireAt time.Time) ([]DeviceKey, error) {
	var out []DeviceKey
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := bump(ctx, tx, k.Tenant, k.CreatedAt); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE device_keys SET retire_at = $2
			WHERE tenant = $1 AND (retire_at IS NULL OR retire_at > $2)`, k.Tenant, ms(retireAt)); err != nil {
			return err
		}
		if err := insertKey(ctx, tx, k); err != nil {
			return err
		}
		var err error
		out, err = queryKeys(ctx, tx, k.Tenant)
		return err
	})
	return out, err
}

// Allowlist returns the tenant's device allowlist.
func (s *SQLStore) Allowlist(ctx context.Context, tenant string) (bool, []string, error) {
	var enabled bool
	if err := s.db.QueryRowContext(ctx, `SELECT device_allowlist FROM tenants WHERE id = $1`, tenant).Scan(&enabled); err != nil {
		return false, nil, fmt.Errorf("tenant %q: %w", tenant, classify(err))
	}
	rows, err := s.db.QueryContext(ctx, `SELECT device FROM device_allowlist WHERE tenant = $1 ORDER BY device`, tenant)
	if err != nil {
		return false, nil, err
	}
	defer rows.Close()
	devices := []string{}
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			return false, nil, err
		}
		devices = append(devices, d)
	}
	return enabled, devices, rows.Err()
}

// SetAllowlist replaces the tenant's allowlist.
func (s *SQLStore) SetAllowlist(ctx context.Context, tenant string, enabled bool, devices []string, at time.Time) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := bump(ctx, tx, tenant, at); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE tenants SET device_allowlist = $2 WHERE id = $1`, tenant, enabled); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM device_allowlist WHERE tenant = $1`, tenant); err != nil {
			return err
		}
		for _, d := range dedupe(devices) {
			if _, err := tx.ExecContext(ctx, `INSERT INTO device_allowlist (tenant, device) VALUES ($1, $2)`, tenant, d); err != nil {
				return err
			}
		}
		return nil
	})
}

func dedupe(in []string) []string {
	out := append([]string(nil), in...)
	sort.Strings(out)
	n := 0
	for i, v := range out {
		if i == 0 || v != out[n-1] {
			out[n] = v
			n++
		}
	}
	return out[:n]
}

const ruleCols = `id, tenant, effect, subject, object, action, cond, description, created_at`

// AddRule stores a rule.
func (s *SQLStore) AddRule(ctx context.Context, r Rule) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := bump(ctx, tx, r.Tenant, r.CreatedAt); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO policy_rules (`+ruleCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			r.ID, r.Tenant, r.Effect, r.Subject, r.Object, r.Action, r.When, r.Description, ms(r.CreatedAt))
		return err
	})
}

// Rules returns the tenant's rules in insertion order.
func (s *SQLStore) Rules(ctx context.Context, tenant string) ([]Rule, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+ruleCols+` FROM policy_rules WHERE tenant = $1 ORDER BY created_at, id`, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Rule{}
	for rows.Next() {
		var r Rule
		var created int64
		if err := rows.Scan(&r.ID, &r.Tenant, &r.Effect, &r.Subject, &r.Object, &r.Action, &r.When, &r.Description, &created); err != nil {
			return nil, err
		}
		r.CreatedAt = fromMs(created)
		out = append(out, r)
	}
	return out, rows.Err()
}

// RemoveRule deletes a rule of the tenant.
func (s *SQLStore) RemoveRule(ctx context.Context, tenant, id string, at time.Time) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM policy_rules WHERE id = $1 AND tenant = $2`, id, tenant)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return fmt.Errorf("rule %q: %w", id, ErrNotFound)
		}
		return bump(ctx, tx, tenant, at)
	})
}

// SetGroup replaces a group's members.
func (s *SQLStore) SetGroup(ctx context.Context, tenant, group string, nodes []string, at time.Time) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := bump(ctx, tx, tenant, at); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM node_groups WHERE tenant = $1 AND grp = $2`, tenant, group); err != nil {
			return err
		}
		for _, n := range dedupe(nodes) {
			if _, err := tx.ExecContext(ctx, `INSERT INTO node_groups (tenant, grp, node) VALUES ($1, $2, $3)`, tenant, group, n); err != nil {
				return err
			}
		}
		return nil
	})
}

// Groups returns the tenant's node groups.
func (s *SQLStore) Groups(ctx context.Context, tenant string) (map[string][]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT grp, node FROM node_groups WHERE tenant = $1 ORDER BY grp, node`, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var g, n string
		if err := rows.Scan(&g, &n); err != nil {
			return nil, err
		}
		out[g] = append(out[g], n)
	}
	return out, rows.Err()
}
