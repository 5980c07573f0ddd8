package audit

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Store keeps audit events. Both implementations (PostgresStore,
// SQLiteStore) pass the same conformance tests.
type Store interface {
	// Write stores events, ignoring any whose id is already stored, and
	// returns how many were new. It is all or nothing.
	Write(ctx context.Context, events []Event) (inserted int, err error)
	// Query returns one page of a tenant's events, newest first.
	Query(ctx context.Context, q Query) (Page, error)
	// Prepare creates storage ahead of need (PostgreSQL: the daily
	// partitions from yesterday to PartitionsAhead days after now).
	Prepare(ctx context.Context, now time.Time) error
	// Prune deletes events older than the retention, per tenant.
	Prune(ctx context.Context, r Retention, now time.Time) (deleted int64, err error)
	Close() error
}

// Query selects events of one tenant. Empty fields do not filter.
type Query struct {
	Tenant    string
	Since     time.Time // inclusive
	Until     time.Time // exclusive
	Kind      string
	Node      string
	Principal string
	Tool      string
	Outcome   string
	Decision  string // DecisionAllow or DecisionDeny
	// Limit is the page size, 1 to MaxLimit; 0 means DefaultLimit.
	Limit int
	// Cursor is a Page's NextCursor, to continue after it.
	Cursor string
}

// Page sizes.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// Page is one page of a query's answer.
type Page struct {
	Events []Event `json:"events"`
	// NextCursor continues the query; empty on the last page.
	NextCursor string `json:"nextCursor,omitempty"`
}

// Retention says how long events are kept.
type Retention struct {
	// Default applies to every tenant without its own entry; 0 keeps
	// events forever.
	Default time.Duration
	// Tenants overrides Default per tenant (0 keeps forever).
	Tenants map[string]time.Duration
}

// longest is the longest retention in r, or 0 if anything is kept forever.
func (r Retention) longest() time.Duration {
	if r.Default == 0 {
		return 0
	}
	max := r.Default
	for _, d := range r.Tenants {
		if d == 0 {
			return 0
		}
		max = ddmax(max, d)
	}
	return max
}

func ddmax(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}

// ErrInvalidQuery is returned (wrapped) for a query a store refuses.
var ErrInvalidQuery = errors.New("audit: invalid query")

// cursor is the position after the last event of a page.
type cursor struct {
	tsUs int64
	id   string
}

func encodeCursor(e Event) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(e.Time.UnixMicro(), 10) + ":" + e.ID))
}

func decodeCursor(s string) (*cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: bad cursor", ErrInvalidQuery)
	}
	ts, id, ok := strings.Cut(string(b), ":")
	n, err := strconv.ParseInt(ts, 10, 64)
	if !ok || err != nil || id == "" || len(id) > 64 {
		return nil, fmt.Errorf("%w: bad cursor", ErrInvalidQuery)
	}
	return &cursor{tsUs: n, id: id}, nil
}

// check validates q and fills in the default limit.
func (q *Query) check() (*cursor, error) {
	if err := validTenant(q.Tenant); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidQuery, err)
	}
	switch {
	case q.Limit == 0:
		q.Limit = DefaultLimit
	case q.Limit < 0 || q.Limit > MaxLimit:
		return nil, fmt.Errorf("%w: limit must be 1-%d", ErrInvalidQuery, MaxLimit)
	}
	if !q.Since.IsZero() && !q.Until.IsZero() && !q.Until.After(q.Since) {
		return nil, fmt.Errorf("%w: until must be after since", ErrInvalidQuery)
	}
	if q.Cursor == "" {
		return nil, nil
	}
	return decodeCursor(q.Cursor)
}

// where builds the WHERE clause of a query with $n placeholders; ts turns
// a time into the store's column type.
func (q *Query) where(c *cursor, ts func(time.Time) any, tsUs func(int64) any) (string, []any) {
	var b strings.Builder
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		b.WriteString(" AND ")
		b.WriteString(strings.ReplaceAll(cond, "?", "$"+strconv.Itoa(len(args))))
	}
	b.WriteString("tenant = $1")
	args = append(args, q.Tenant)
	if !q.Since.IsZero() {
		add("ts >= ?", ts(q.Since))
	}
	if !q.Until.IsZero() {
		add("ts < ?", ts(q.Until))
	}
	for _, f := range []struct{ col, v string }{
		{"kind", q.Kind}, {"node", q.Node}, {"principal", q.Principal}, {"tool", q.Tool}, {"outcome", q.Outcome},
		{"decision", q.Decision},
	} {
		if f.v != "" {
			add(f.col+" = ?", f.v)
		}
	}
	if c != nil {
		// (ts, id) < (cursor): written out, as not every planner uses an
		// index for row comparisons.
		args = append(args, tsUs(c.tsUs), c.id)
		n := len(args)
		fmt.Fprintf(&b, " AND (ts < $%d OR (ts = $%d AND id < $%d))", n-1, n-1, n)
	}
	return b.String(), args
}

// rowScanner is what pgx.Rows and *sql.Rows share.
type rowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// scanPage reads the rows of a page query (SELECT columns ... LIMIT
// limit+1). The time and arguments columns are scanned into the store's
// own types TS and A, which set converts into the event.
func scanPage[TS, A any](r rowScanner, limit int, set func(e *Event, ts TS, args A)) (Page, error) {
	var out []Event
	for r.Next() {
		var e Event
		var ts TS
		var a A
		if err := r.Scan(&e.ID, &ts, &e.Kind, &e.Tenant, &e.Principal, &e.PrincipalName, &e.Role, &e.Node,
			&e.Device, &e.Command, &e.Tool, &a, &e.Decision, &e.RuleID, &e.Outcome, &e.ErrorCode, &e.LatencyUs,
			&e.TraceID, &e.SpanID, &e.IdempotencyKey, &e.Replayed, &e.RequestID, &e.Instance, &e.Detail); err != nil {
			return Page{}, fmt.Errorf("audit: query: %w", err)
		}
		set(&e, ts, a)
		out = append(out, e)
	}
	if err := r.Err(); err != nil {
		return Page{}, fmt.Errorf("audit: query: %w", err)
	}
	return pageOf(out, limit), nil
}

// pageOf cuts rows fetched with limit+1 into a page.
func pageOf(events []Event, limit int) Page {
	if len(events) <= limit {
		if events == nil {
			events = []Event{}
		}
		return Page{Events: events}
	}
	events = events[:limit]
	return Page{Events: events, NextCursor: encodeCursor(events[limit-1])}
}

// columns lists the stored fields in the order both stores use.
const columns = "id, ts, kind, tenant, principal, principal_name, role, node, device, command, tool, args, " +
	"decision, rule_id, outcome, error_code, latency_us, trace_id, span_id, idempotency_key, replayed, " +
	"request_id, instance, detail"

var columnNames = strings.Split(strings.ReplaceAll(columns, " ", ""), ",")
