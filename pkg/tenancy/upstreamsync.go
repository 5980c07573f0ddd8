package tenancy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// UpstreamSyncConfig configures an UpstreamSync.
type UpstreamSyncConfig struct {
	Store Store
	JS    jetstream.JetStream
	// ResyncInterval is how often the whole bucket is compared with the
	// store (catching a lost entry or bucket); default 10 s.
	ResyncInterval time.Duration
	// Grace is how old an entry whose caller token does not match the
	// stored hash must be before it gets a new token: younger, it may be
	// another replica's token whose hash is being stored. Default 30 s.
	Grace time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// UpstreamSync keeps the wire.BucketUpstreams bucket equal to the stored
// upstreams: one entry per upstream, rendered with its publish selection
// resolved (a group's members), no entry for a removed upstream. The
// caller token exists in clear only in the entry; the store keeps its
// hash. An upstream with no entry (the bucket was lost) gets a new caller
// token: the entry is written with KV Create, so of several gateway
// replicas exactly one mints it, and then its hash replaces the stored one.
//
// Every gateway replica runs one (Run); it also serves the Manager
// (ManagerConfig.Upstreams) and listens to tenancy changes (register it
// with the Watcher).
type UpstreamSync struct {
	cfg  UpstreamSyncConfig
	log  *slog.Logger
	kick chan struct{}

	mu      sync.Mutex
	pending map[string]bool // tenants to sync
	kv      jetstream.KeyValue
}

// NewUpstreamSync returns an UpstreamSync; call Run.
func NewUpstreamSync(cfg UpstreamSyncConfig, log *slog.Logger) (*UpstreamSync, error) {
	if cfg.Store == nil || cfg.JS == nil || log == nil {
		return nil, errors.New("tenancy: upstream sync needs a store, JetStream and a logger")
	}
	if cfg.ResyncInterval <= 0 {
		cfg.ResyncInterval = 10 * time.Second
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &UpstreamSync{cfg: cfg, log: log.With("component", "upstream-sync"), kick: make(chan struct{}, 1),
		pending: map[string]bool{}}, nil
}

// TenancyChanged schedules a sync of the tenant after a change of its
// upstreams, its groups or anything of it (resync). It does not block.
func (s *UpstreamSync) TenancyChanged(c wire.TenancyChange) {
	switch c.Kind {
	case wire.ChangeUpstream, wire.ChangeGroup, wire.ChangeResync, wire.ChangeTenant:
	default:
		return
	}
	s.mu.Lock()
	s.pending[c.Tenant] = true
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Run syncs every tenant at once and every ResyncInterval, the tenants
// TenancyChanged names as they come, and the tenant of an entry deleted
// behind the store's back (a removal's own delete costs one idle sync),
// until ctx ends.
func (s *UpstreamSync) Run(ctx context.Context) error {
	if err := s.SyncAll(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn("upstream bucket sync failed; retrying at the next resync", "err", err)
	}
	deletes := s.watchDeletes(ctx)
	tick := time.NewTicker(s.cfg.ResyncInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-deletes:
			switch {
			case !ok: // the bucket went; the next resync creates it again
				deletes = nil
			case e != nil && e.Operation() != jetstream.KeyValuePut:
				if t, _, ok := strings.Cut(e.Key(), "."); ok {
					s.TenancyChanged(wire.TenancyChange{Tenant: t, Kind: wire.ChangeUpstream})
				}
			}
		case <-s.kick:
			s.mu.Lock()
			tenants := make([]string, 0, len(s.pending))
			for t := range s.pending {
				tenants = append(tenants, t)
			}
			clear(s.pending)
			s.mu.Unlock()
			for _, t := range tenants {
				if err := s.SyncTenant(ctx, t); err != nil && ctx.Err() == nil {
					s.log.Warn("upstream bucket sync failed; retrying at the next resync", "tenant", t, "err", err)
				}
			}
		case <-tick.C:
			if err := s.SyncAll(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("upstream bucket sync failed; retrying at the next resync", "err", err)
			}
			if deletes == nil {
				deletes = s.watchDeletes(ctx)
			}
		}
	}
}

// watchDeletes watches the bucket for changes (their keys only); nil when
// the bucket cannot be watched now.
func (s *UpstreamSync) watchDeletes(ctx context.Context) <-chan jetstream.KeyValueEntry {
	kv, err := s.bucket(ctx, false)
	if err != nil {
		return nil
	}
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly(), jetstream.MetaOnly())
	if err != nil {
		return nil
	}
	return w.Updates()
}

// bucket returns the bucket, opening (or creating) it when fresh is set or
// it is not open yet: a full sync opens it again, so a deleted bucket is
// created anew.
func (s *UpstreamSync) bucket(ctx context.Context, fresh bool) (jetstream.KeyValue, error) {
	s.mu.Lock()
	kv := s.kv
	s.mu.Unlock()
	if kv != nil && !fresh {
		return kv, nil
	}
	kv, err := wire.OpenBucket(ctx, s.cfg.JS, wire.UpstreamsBucketConfig())
	if err != nil {
		return nil, fmt.Errorf("upstream bucket: %w", err)
	}
	s.mu.Lock()
	s.kv = kv
	s.mu.Unlock()
	return kv, nil
}

// listKeys returns the names of the bucket's entries per tenant, of one
// tenant when tenant is set.
func listKeys(ctx context.Context, kv jetstream.KeyValue, tenant string) (map[string][]string, error) {
	filter := ">"
	if tenant != "" {
		filter = tenant + ".*"
	}
	l, err := kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for k := range l.Keys() {
		t, name, ok := strings.Cut(k, ".")
		if ok {
			out[t] = append(out[t], name)
		}
	}
	return out, nil
}

// SyncAll makes the whole bucket match the store.
func (s *UpstreamSync) SyncAll(ctx context.Context) error {
	kv, err := s.bucket(ctx, true)
	if err != nil {
		return err
	}
	// The entries are listed before the store is read: an entry the store
	// does not know of then belongs to a removed upstream (an upstream is
	// stored before its entry is written).
	keys, err := listKeys(ctx, kv, "")
	if err != nil {
		return fmt.Errorf("list upstream entries: %w", err)
	}
	// One query finds the tenants with upstreams: a resync costs nothing
	// per tenant without any.
	tenants, err := s.cfg.Store.UpstreamTenants(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range tenants {
		errs = append(errs, s.syncTenant(ctx, kv, t, keys[t]))
		delete(keys, t)
	}
	for t, names := range keys { // entries of tenants without upstreams
		errs = append(errs, s.syncTenant(ctx, kv, t, names))
	}
	return errors.Join(errs...)
}

// SyncTenant makes the tenant's entries match the store.
func (s *UpstreamSync) SyncTenant(ctx context.Context, tenant string) error {
	if wire.ValidTenant(tenant) != nil {
		return nil
	}
	kv, err := s.bucket(ctx, false)
	if err != nil {
		return err
	}
	keys, err := listKeys(ctx, kv, tenant)
	if err != nil {
		return fmt.Errorf("list upstream entries: %w", err)
	}
	return s.syncTenant(ctx, kv, tenant, keys[tenant])
}

func (s *UpstreamSync) syncTenant(ctx context.Context, kv jetstream.KeyValue, tenant string, listed []string) error {
	ups, err := s.cfg.Store.Upstreams(ctx, tenant)
	if errors.Is(err, ErrNotFound) {
		ups = nil
	} else if err != nil {
		return err
	}
	groups, err := s.groupsFor(ctx, tenant, ups)
	if err != nil {
		return err
	}
	var errs []error
	stored := map[string]bool{}
	for _, u := range ups {
		stored[u.Name] = true
		errs = append(errs, s.syncOne(ctx, kv, u, groups))
	}
	for _, n := range listed {
		if !stored[n] {
			errs = append(errs, s.remove(ctx, kv, tenant, n))
		}
	}
	return errors.Join(errs...)
}

// groupsFor reads the tenant's groups if an upstream publishes one.
func (s *UpstreamSync) groupsFor(ctx context.Context, tenant string, ups []Upstream) (map[string][]string, error) {
	for _, u := range ups {
		if u.Publish.Mode == PublishGroup {
			return s.cfg.Store.Groups(ctx, tenant)
		}
	}
	return nil, nil
}

// render is the entry of u without its caller token.
func render(u Upstream, groups map[string][]string) wire.UpstreamEntry {
	e := wire.UpstreamEntry{Tenant: u.Tenant, Name: u.Name, URL: u.URL, Auth: u.Auth, Secret: u.Secret,
		CACert: u.CACert, InsecureSkipVerify: u.InsecureSkipVerify, Publish: u.Publish.Mode}
	switch u.Publish.Mode {
	case PublishGroup:
		e.Group = u.Publish.Group
		e.Nodes = slices.Clone(groups[u.Publish.Group])
	case PublishNodes:
		e.Nodes = slices.Clone(u.Publish.Nodes)
	default:
		e.Publish = wire.PublishAll
	}
	slices.Sort(e.Nodes)
	if len(e.Nodes) == 0 {
		e.Nodes = nil
	}
	return e
}

// syncOne writes u's entry if it is missing or differs, keeping its
// caller token when that token is the stored one.
func (s *UpstreamSync) syncOne(ctx context.Context, kv jetstream.KeyValue, u Upstream, groups map[string][]string) error {
	want := render(u, groups)
	key := wire.UpstreamKey(u.Tenant, u.Name)
	cur, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return s.mint(ctx, kv, u, want, 0)
	}
	if err != nil {
		return fmt.Errorf("upstream entry %s: %w", key, err)
	}
	have, perr := wire.ParseUpstreamEntry(cur.Value())
	if perr != nil || hashToken(have.CallerToken) != u.CallerHash {
		if s.cfg.Now().Sub(cur.Created()) < s.cfg.Grace {
			return nil // maybe another replica's token, its hash on the way
		}
		return s.mint(ctx, kv, u, want, cur.Revision())
	}
	want.CallerToken = have.CallerToken
	b, _ := json.Marshal(want)
	if bytes.Equal(b, cur.Value()) {
		return nil
	}
	if _, err := kv.Update(ctx, key, b, cur.Revision()); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("upstream entry %s: %w", key, err)
	}
	s.log.Info("upstream entry rendered again", "upstream", u)
	return nil
}

// mint writes want with a new caller token, over revision rev (0: the
// entry must not exist), and stores the token's hash. Losing the write to
// another replica is no error: that replica stores its own hash.
func (s *UpstreamSync) mint(ctx context.Context, kv jetstream.KeyValue, u Upstream, want wire.UpstreamEntry, rev uint64) error {
	token := newUpstreamCallerToken(u.Tenant, u.Name)
	want.CallerToken = token
	b, _ := json.Marshal(want)
	key := wire.UpstreamKey(u.Tenant, u.Name)
	var err error
	if rev == 0 {
		rev, err = kv.Create(ctx, key, b)
	} else {
		rev, err = kv.Update(ctx, key, b, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("upstream entry %s: %w", key, err)
	}
	ok, err := s.cfg.Store.SetUpstreamCaller(ctx, u.Tenant, u.Name, u.CallerHash, hashToken(token), s.cfg.Now().UTC())
	if err != nil || !ok {
		// The upstream was removed or changed meanwhile: take the entry
		// back (unless it moved on), the next sync renders it again.
		_ = kv.Delete(ctx, key, jetstream.LastRevision(rev))
		if err != nil {
			return fmt.Errorf("upstream %s: store caller hash: %w", key, err)
		}
		return nil
	}
	s.log.Info("upstream entry written with a new caller token", "upstream", u)
	return nil
}

func (s *UpstreamSync) remove(ctx context.Context, kv jetstream.KeyValue, tenant, name string) error {
	err := kv.Delete(ctx, wire.UpstreamKey(tenant, name))
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("upstream entry %s: %w", wire.UpstreamKey(tenant, name), err)
	}
	s.log.Info("upstream entry removed", "tenant", tenant, "name", name)
	return nil
}

// Deliver writes the entry of a newly stored upstream with its caller
// token (Manager.AddUpstream). Should the entry exist already (a stale
// one, or another replica's sync was first), the sync decides.
func (s *UpstreamSync) Deliver(ctx context.Context, u Upstream, callerToken string) error {
	kv, err := s.bucket(ctx, false)
	if err != nil {
		return err
	}
	var groups map[string][]string
	if u.Publish.Mode == PublishGroup {
		if groups, err = s.cfg.Store.Groups(ctx, u.Tenant); err != nil {
			return err
		}
	}
	e := render(u, groups)
	e.CallerToken = callerToken
	b, _ := json.Marshal(e)
	_, err = kv.Create(ctx, wire.UpstreamKey(u.Tenant, u.Name), b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return s.syncOne(ctx, kv, u, groups)
	}
	return err
}

// Withdraw deletes the entry of a removed upstream (Manager.RemoveUpstream).
func (s *UpstreamSync) Withdraw(ctx context.Context, tenant, name string) error {
	kv, err := s.bucket(ctx, false)
	if err != nil {
		return err
	}
	return s.remove(ctx, kv, tenant, name)
}
