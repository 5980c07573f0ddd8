package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Upstream is one OpenClaw gateway a tenant publishes its devices to.
type Upstream struct {
	Name   string // [A-Za-z0-9_-]; the principal is "upstream:<name>"
	Tenant string
	URL    string // ws://host:port of the OpenClaw gateway
	Token  string // the OpenClaw gateway's shared token; never logged
}

// String leaves the token out, so that printing an Upstream (%v, %+v)
// never shows it; GoString (%#v) and LogValue (slog) do the same.
func (u Upstream) String() string {
	return "upstream " + u.Name + " of tenant " + u.Tenant + " at " + u.URL
}

// GoString implements fmt.GoStringer without the token.
func (u Upstream) GoString() string { return u.String() }

// LogValue implements slog.LogValuer without the token.
func (u Upstream) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", u.Name), slog.String("tenant", u.Tenant), slog.String("url", u.URL))
}

// Validate reports an upstream that cannot be used.
func (u Upstream) Validate() error {
	if err := wire.ValidTenant(u.Tenant); err != nil {
		return fmt.Errorf("upstream tenant: %w", err)
	}
	if err := wire.ValidNodeID(u.Name); err != nil {
		return fmt.Errorf("upstream name %q must be [A-Za-z0-9_-]", u.Name)
	}
	if u.URL == "" {
		return fmt.Errorf("upstream %s: url is required", u.Name)
	}
	return nil
}

// Principal is the xiaoclaw principal id of an upstream's calls.
func Principal(name string) string { return "upstream:" + name }

// Config of the upstream service of one shim worker.
type Config struct {
	Instance  string // names this worker as lease holder
	Upstreams []Upstream
	Invoker   Invoker // runs the calls (GatewayInvoker)
	Timing    Timing
	// LeaseTTL is how long a lease outlives its holder; a link moves to
	// another worker within LeaseTTL plus one refresh (LeaseTTL/3) after its
	// holder died. Default 10 s.
	LeaseTTL time.Duration
	// NodesWait bounds how long Run waits for the node registry bucket to
	// appear (the shim creates it); default 30 s.
	NodesWait time.Duration
}

// Service runs the links this worker holds.
type Service struct {
	cfg Config
	nc  *nats.Conn
	log *slog.Logger

	ids    identities
	leases jetstream.KeyValue
	kick   chan struct{}

	mu         sync.Mutex
	devices    map[string]wire.NodeRecord // registry key -> connected xiaozhi record
	held       map[string]*heldLink       // lease key -> link run here
	handshakes map[string]chan struct{}   // upstream URL -> its links' handshake slots
}

// heldLink is a link with the lease this worker holds for it.
type heldLink struct {
	key    string
	link   *link
	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex // orders lease writes; guards rev
	rev uint64
}

// New checks the configuration; Run does the work.
func New(cfg Config, nc *nats.Conn, log *slog.Logger) (*Service, error) {
	if cfg.Instance == "" {
		cfg.Instance = "shim"
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 10 * time.Second
	}
	if cfg.NodesWait <= 0 {
		cfg.NodesWait = 30 * time.Second
	}
	if cfg.Invoker == nil {
		return nil, errors.New("upstream: an Invoker is required")
	}
	seen := map[string]bool{}
	for _, u := range cfg.Upstreams {
		if err := u.Validate(); err != nil {
			return nil, err
		}
		if seen[u.Tenant+"."+u.Name] {
			return nil, fmt.Errorf("upstream %s of tenant %s is configured twice", u.Name, u.Tenant)
		}
		seen[u.Tenant+"."+u.Name] = true
	}
	cfg.Timing.setDefaults()
	if log == nil {
		log = slog.Default()
	}
	return &Service{cfg: cfg, nc: nc, log: log.With("component", "upstream"), kick: make(chan struct{}, 1),
		devices: map[string]wire.NodeRecord{}, held: map[string]*heldLink{},
		handshakes: map[string]chan struct{}{}}, nil
}

// Run watches the node registry and keeps one link per (connected device,
// upstream) among all workers, until ctx ends; then it closes its links and
// gives up their leases.
func (s *Service) Run(ctx context.Context) error {
	if len(s.cfg.Upstreams) == 0 {
		<-ctx.Done()
		return nil
	}
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("upstream: jetstream: %w", err)
	}
	idkv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketIdentities,
		Description: "xiaoclaw upstream node identities", History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		return fmt.Errorf("upstream: identity bucket: %w", err)
	}
	s.ids = identities{kv: idkv}
	s.leases, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketLeases,
		Description: "xiaoclaw upstream link leases and states", History: 1, TTL: s.cfg.LeaseTTL,
		Storage: jetstream.MemoryStorage})
	if err != nil {
		return fmt.Errorf("upstream: lease bucket: %w", err)
	}
	nodes, err := s.nodesBucket(ctx, js)
	if err != nil {
		return err
	}
	w, err := nodes.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("upstream: watch nodes: %w", err)
	}
	defer func() { _ = w.Stop() }()

	for _, tenant := range s.tenants() {
		sub, err := s.nc.Subscribe(wire.NodeEvent(tenant), s.onNodeEvent)
		if err != nil {
			return fmt.Errorf("upstream: subscribe node events: %w", err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}

	refresh := time.NewTicker(s.cfg.LeaseTTL / 3)
	defer refresh.Stop()
	defer s.releaseAll()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("upstream: node registry watch ended")
			}
			if e == nil { // initial values loaded
				s.reconcile(ctx)
				continue
			}
			s.applyNode(e)
			s.poke()
		case <-s.kick:
			s.reconcile(ctx)
		case <-refresh.C:
			s.reconcile(ctx)
		}
	}
}

// nodesBucket waits for the node registry bucket, which the shim creates.
func (s *Service) nodesBucket(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	deadline := time.Now().Add(s.cfg.NodesWait)
	for {
		kv, err := js.KeyValue(ctx, wire.BucketNodes)
		if err == nil {
			return kv, nil
		}
		if !errors.Is(err, jetstream.ErrBucketNotFound) || time.Now().After(deadline) {
			return nil, fmt.Errorf("upstream: node registry: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (s *Service) tenants() []string {
	seen := map[string]bool{}
	var out []string
	for _, u := range s.cfg.Upstreams {
		if !seen[u.Tenant] {
			seen[u.Tenant] = true
			out = append(out, u.Tenant)
		}
	}
	return out
}

func (s *Service) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// applyNode keeps the set of connected XiaoZhi devices.
func (s *Service) applyNode(e jetstream.KeyValueEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(s.devices, e.Key())
		return
	}
	var rec wire.NodeRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.Kind != wire.NodeKindXiaoZhi || !rec.Connected {
		delete(s.devices, e.Key())
		return
	}
	s.devices[e.Key()] = rec
	for _, u := range s.cfg.Upstreams { // the catalog changed, or may have
		if h := s.held[linkKey(u.Tenant, u.Name, rec.NodeID)]; h != nil && u.Tenant == rec.Tenant {
			h.link.setCatalog(rec.Tools)
		}
	}
}

// want is a link that should run somewhere.
type want struct {
	up  Upstream
	rec wire.NodeRecord
}

// reconcile refreshes the leases held here, takes free leases of wanted
// links and stops links no longer wanted or whose lease was lost.
func (s *Service) reconcile(ctx context.Context) {
	s.mu.Lock()
	wanted := map[string]want{}
	for _, rec := range s.devices {
		for _, u := range s.cfg.Upstreams {
			if u.Tenant == rec.Tenant {
				wanted[linkKey(u.Tenant, u.Name, rec.NodeID)] = want{u, rec}
			}
		}
	}
	var stale []*heldLink
	var keep []*heldLink
	for k, h := range s.held {
		if _, ok := wanted[k]; ok {
			keep = append(keep, h)
		} else {
			stale = append(stale, h)
			delete(s.held, k)
		}
	}
	var free []want
	keys := make([]string, 0, len(wanted))
	for k := range wanted {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if s.held[k] == nil {
			free = append(free, wanted[k])
		}
	}
	s.mu.Unlock()

	for _, h := range stale {
		s.release(h)
	}
	for _, h := range keep {
		if err := s.writeLease(ctx, h, h.link.Status()); err != nil {
			s.log.Warn("upstream lease lost", "link", h.key, "err", err)
			s.mu.Lock()
			if s.held[h.key] == h {
				delete(s.held, h.key)
			}
			s.mu.Unlock()
			h.stop()
		}
	}
	for _, w := range free {
		s.take(ctx, w)
	}
}

// take starts the link of w if its lease is free.
func (s *Service) take(ctx context.Context, w want) {
	key := linkKey(w.up.Tenant, w.up.Name, w.rec.NodeID)
	st := Status{Upstream: w.up.Name, Tenant: w.up.Tenant, NodeID: w.rec.NodeID, State: StateConnecting,
		SinceMs: time.Now().UnixMilli(), Holder: s.cfg.Instance}
	b, _ := json.Marshal(st)
	rev, err := s.leases.Create(ctx, key, b)
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			s.log.Warn("upstream lease", "link", key, "err", err)
		}
		return
	}
	identity, err := s.ids.get(ctx, key)
	if err != nil {
		s.log.Warn("upstream identity", "link", key, "err", err)
		_ = s.leases.Delete(ctx, key, jetstream.LastRevision(rev))
		return
	}
	h := &heldLink{key: key, rev: rev, done: make(chan struct{})}
	s.mu.Lock()
	slots := s.handshakes[w.up.URL]
	if slots == nil {
		slots = newHandshakeSlots()
		s.handshakes[w.up.URL] = slots
	}
	s.mu.Unlock()
	h.link = newLink(linkConfig{upstream: w.up, node: nodeOf(w.rec), identity: identity, invoker: s.cfg.Invoker,
		timing: s.cfg.Timing, log: s.log, handshakes: slots, onStatus: func(st Status) {
			// Best effort: the periodic refresh writes the state again.
			wctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = s.writeLease(wctx, h, st)
		}})
	h.link.setCatalog(w.rec.Tools)
	lctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	s.mu.Lock()
	s.held[key] = h
	s.mu.Unlock()
	s.log.Info("upstream link taken", "link", key, "holder", s.cfg.Instance)
	h.link.start(lctx, func() { close(h.done) })
}

// nodeOf is what a link announces about a device.
func nodeOf(rec wire.NodeRecord) Node {
	n := Node{NodeID: rec.NodeID, DisplayName: rec.DisplayName, Version: rec.Version, DeviceFamily: rec.DeviceFamily}
	if n.DisplayName == "" {
		n.DisplayName = rec.NodeID
	}
	if n.DeviceFamily == "" {
		n.DeviceFamily = rec.ModelIdentifier
	}
	return n
}

// writeLease refreshes the lease with the link's state; it fails when
// another worker took the lease (revision mismatch) or it expired.
func (s *Service) writeLease(ctx context.Context, h *heldLink, st Status) error {
	st.Holder = s.cfg.Instance
	b, _ := json.Marshal(st)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rev == 0 {
		return errors.New("lease released")
	}
	rev, err := s.leases.Update(ctx, h.key, b, h.rev)
	if err != nil {
		return err
	}
	h.rev = rev
	return nil
}

func (h *heldLink) stop() {
	h.cancel()
	<-h.done
}

// release stops a link and deletes its lease so another worker (or this
// one, later) can take it at once.
func (s *Service) release(h *heldLink) {
	h.stop()
	h.mu.Lock()
	rev := h.rev
	h.rev = 0
	h.mu.Unlock()
	if rev != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = s.leases.Delete(ctx, h.key, jetstream.LastRevision(rev))
	}
	s.log.Info("upstream link released", "link", h.key)
}

func (s *Service) releaseAll() {
	s.mu.Lock()
	all := make([]*heldLink, 0, len(s.held))
	for k, h := range s.held {
		all = append(all, h)
		delete(s.held, k)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, h := range all {
		wg.Go(func() { s.release(h) })
	}
	wg.Wait()
}

// onNodeEvent forwards a device's notifications and catalog changes to its
// links held here. Presence needs no event: the link itself connects and
// disconnects with the device.
func (s *Service) onNodeEvent(m *nats.Msg) {
	var ev wire.NodeEventMsg
	if err := json.Unmarshal(m.Data, &ev); err != nil || ev.NodeID == "" {
		return
	}
	if ev.Event == wire.EventNodeConnected || ev.Event == wire.EventNodeDisconnected {
		return
	}
	tenant, ok := wire.TenantFromSubject(m.Subject)
	if !ok {
		return
	}
	s.mu.Lock()
	var links []*link
	for _, u := range s.cfg.Upstreams {
		if u.Tenant == tenant {
			if h := s.held[linkKey(tenant, u.Name, ev.NodeID)]; h != nil {
				links = append(links, h.link)
			}
		}
	}
	s.mu.Unlock()
	for _, l := range links {
		l.sendEvent(ev.Event, ev.Payload)
	}
}

// Status returns the state of the links this worker holds.
func (s *Service) Status() []Status {
	s.mu.Lock()
	out := make([]Status, 0, len(s.held))
	for _, h := range s.held {
		st := h.link.Status()
		st.Holder = s.cfg.Instance
		out = append(out, st)
	}
	s.mu.Unlock()
	sortStatus(out)
	return out
}

// ReadStatus returns the state of every link held by any worker, from the
// lease bucket. No bucket yet means no links.
func ReadStatus(ctx context.Context, nc *nats.Conn) ([]Status, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, BucketLeases)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []Status
	for k := range lister.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue // expired or released meanwhile
		}
		var st Status
		if json.Unmarshal(e.Value(), &st) == nil {
			out = append(out, st)
		}
	}
	sortStatus(out)
	return out, nil
}

func sortStatus(s []Status) {
	sort.Slice(s, func(i, j int) bool {
		if s[i].Tenant != s[j].Tenant {
			return s[i].Tenant < s[j].Tenant
		}
		if s[i].Upstream != s[j].Upstream {
			return s[i].Upstream < s[j].Upstream
		}
		return s[i].NodeID < s[j].NodeID
	})
}
