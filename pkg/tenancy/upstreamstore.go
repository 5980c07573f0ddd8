package tenancy

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

const upstreamCols = `tenant, name, url, auth, secret, ca_cert, insecure_skip_verify, publish, publish_group, publish_nodes, caller_hash, created_at`

func scanUpstream(r scanner) (Upstream, error) {
	var u Upstream
	var nodes string
	var created int64
	err := r.Scan(&u.Tenant, &u.Name, &u.URL, &u.Auth, &u.Secret, &u.CACert, &u.InsecureSkipVerify,
		&u.Publish.Mode, &u.Publish.Group, &nodes, &u.CallerHash, &created)
	u.Publish.Nodes = strings.Fields(nodes)
	u.CreatedAt = fromMs(created)
	return u, err
}

// CreateUpstream stores an upstream; ErrConflict if the tenant has one of
// that name.
func (s *SQLStore) CreateUpstream(ctx context.Context, u Upstream) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := bump(ctx, tx, u.Tenant, u.CreatedAt); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO upstreams (`+upstreamCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
			u.Tenant, u.Name, u.URL, u.Auth, u.Secret, u.CACert, u.InsecureSkipVerify,
			u.Publish.Mode, u.Publish.Group, strings.Join(u.Publish.Nodes, " "), u.CallerHash, ms(u.CreatedAt))
		return err
	})
}

// Upstream returns one upstream of the tenant.
func (s *SQLStore) Upstream(ctx context.Context, tenant, name string) (Upstream, error) {
	u, err := scanUpstream(s.db.QueryRowContext(ctx, `SELECT `+upstreamCols+` FROM upstreams WHERE tenant = $1 AND name = $2`, tenant, name))
	if err != nil {
		return Upstream{}, fmt.Errorf("upstream %q: %w", name, classify(err))
	}
	return u, nil
}

// Upstreams returns the tenant's upstreams sorted by name.
func (s *SQLStore) Upstreams(ctx context.Context, tenant string) ([]Upstream, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+upstreamCols+` FROM upstreams WHERE tenant = $1 ORDER BY name`, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Upstream{}
	for rows.Next() {
		u, err := scanUpstream(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, rows.Err()
}

// UpstreamTenants returns the tenants that have an upstream, sorted.
func (s *SQLStore) UpstreamTenants(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT DISTINCT tenant FROM upstreams ORDER BY tenant`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// DeleteUpstream removes an upstream of the tenant.
func (s *SQLStore) DeleteUpstream(ctx context.Context, tenant, name string, at time.Time) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM upstreams WHERE tenant = $1 AND name = $2`, tenant, name)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return fmt.Errorf("upstream %q: %w", name, ErrNotFound)
		}
		return bump(ctx, tx, tenant, at)
	})
}

// SetUpstreamCaller replaces the caller hash of an upstream if it still is
// old (compare-and-set), so that of two replicas minting a caller token
// for the same upstream only the one whose token is in the bucket wins. It
// reports whether the hash was replaced.
func (s *SQLStore) SetUpstreamCaller(ctx context.Context, tenant, name, old, hash string, at time.Time) (bool, error) {
	var done bool
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE upstreams SET caller_hash = $4 WHERE tenant = $1 AND name = $2 AND caller_hash = $3`,
			tenant, name, old, hash)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil || n == 0 {
			return err
		}
		done = true
		return bump(ctx, tx, tenant, at)
	})
	return done, err
}
