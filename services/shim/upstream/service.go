package upstream

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Upstream is one OpenClaw gateway a tenant publishes its devices to.
type Upstream struct {
	Name   string // [A-Za-z0-9_-]; the principal is "upstream:<name>"
	Tenant string
	URL    string // ws://host:port or wss://… of the OpenClaw gateway
	Token  string // the OpenClaw gateway's shared token; never logged
	// Password is the gateway's shared password, given instead of Token;
	// never logged.
	Password string
	// CACert is a PEM bundle trusted on top of the system roots for a
	// wss:// URL; InsecureSkipVerify accepts any certificate (the links
	// then say so in their status and the log warns).
	CACert             string
	InsecureSkipVerify bool
	// Publish selects the devices that get a link: wire.PublishAll (or
	// empty) every device of the tenant; wire.PublishGroup and
	// wire.PublishNodes the devices in Nodes (a group's members as the
	// gateway resolved them).
	Publish string
	Nodes   []string
	// CallerToken is the xiaoclaw token of the upstream's calls through
	// xiaoclaw's gateway (GatewayInvoker); never logged.
	CallerToken string
}

// String leaves the secrets out, so that printing an Upstream (%v, %+v)
// never shows them; GoString (%#v) and LogValue (slog) do the same.
func (u Upstream) String() string {
	return "upstream " + u.Name + " of tenant " + u.Tenant + " at " + u.URL
}

// GoString implements fmt.GoStringer without the secrets.
func (u Upstream) GoString() string { return u.String() }

// LogValue implements slog.LogValuer without the secrets.
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
	if _, err := u.tlsConfig(); err != nil {
		return err
	}
	switch u.Publish {
	case "", wire.PublishAll, wire.PublishGroup, wire.PublishNodes:
	default:
		return fmt.Errorf("upstream %s: unknown publish mode %q", u.Name, u.Publish)
	}
	return nil
}

// publishes reports whether the upstream sees the device node.
func (u Upstream) publishes(node string) bool {
	if u.Publish == "" || u.Publish == wire.PublishAll {
		return true
	}
	return slices.Contains(u.Nodes, node)
}

// tlsConfig is the TLS configuration of a wss:// upstream with a CA or
// without verification; nil means the defaults.
func (u Upstream) tlsConfig() (*tls.Config, error) {
	switch {
	case u.InsecureSkipVerify:
		return &tls.Config{InsecureSkipVerify: true}, nil //nolint:gosec // asked for by the tenant, warned about
	case u.CACert != "":
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM([]byte(u.CACert)) {
			return nil, fmt.Errorf("upstream %s: caCert holds no PEM certificate", u.Name)
		}
		return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
	}
	return nil, nil
}

// connection is what a link was started with: a change of any of it
// restarts the upstream's links. The node selection and the caller token
// are read when needed.
func (u Upstream) connection() string {
	sum := sha256.Sum256([]byte(strings.Join([]string{u.URL, u.Token, u.Password, u.CACert,
		strconv.FormatBool(u.InsecureSkipVerify)}, "\x00")))
	return string(sum[:])
}

// upstreamOf is the upstream of a bucket entry.
func upstreamOf(e wire.UpstreamEntry) Upstream {
	u := Upstream{Name: e.Name, Tenant: e.Tenant, URL: e.URL, CACert: e.CACert, InsecureSkipVerify: e.InsecureSkipVerify,
		Publish: e.Publish, Nodes: e.Nodes, CallerToken: e.CallerToken}
	if e.Auth == wire.UpstreamAuthPassword {
		u.Password = e.Secret
	} else {
		u.Token = e.Secret
	}
	return u
}

// Principal is the xiaoclaw principal id of an upstream's calls.
func Principal(name string) string { return "upstream:" + name }

// Config of the upstream service of one shim worker.
type Config struct {
	Instance string // names this worker as lease holder
	// Upstreams are configured here (flags, xiaoclaw dev); they win over a
	// stored upstream of the same tenant and name.
	Upstreams []Upstream
	// Stored runs the tenants' stored upstreams too, as the gateways
	// deliver them in the wire.BucketUpstreams bucket.
	Stored  bool
	Invoker Invoker // runs the calls (GatewayInvoker)
	Timing  Timing
	// LeaseTTL is how long a lease outlives its holder; a link moves to
	// another worker within LeaseTTL plus one refresh (LeaseTTL/3) after its
	// holder died. Default 10 s.
	LeaseTTL time.Duration
	// NodesWait bounds how long Run waits for the node registry bucket to
	// appear (the shim creates it); default 30 s.
	NodesWait time.Duration
	// Registerer receives the links' metrics; nil keeps them in a private
	// registry.
	Registerer prometheus.Registerer
}

// Service runs the links this worker holds.
type Service struct {
	cfg Config
	nc  *nats.Conn
	log *slog.Logger

	ids     identities
	leases  jetstream.KeyValue
	metrics metrics
	kick    chan struct{}
	subs    map[string]*nats.Subscription // tenant -> its node events; Run's goroutine only

	mu         sync.Mutex
	devices    map[string]wire.NodeRecord // registry key -> connected xiaozhi record
	held       map[string]*heldLink       // lease key -> link run here
	static     map[string]Upstream        // UpstreamKey -> configured upstream
	stored     map[string]Upstream        // UpstreamKey -> stored upstream from the bucket
	loading    map[string]Upstream        // the bucket's entries while a watch replays them
	ups        map[string]Upstream        // UpstreamKey -> upstream run: static over stored
	handshakes map[string]chan struct{}   // upstream URL -> its links' handshake slots
}

// heldLink is a link with the lease this worker holds for it.
type heldLink struct {
	key    string
	link   *link
	conn   string // the upstream's connection() the link runs with
	warn   string // shown in the link's status
	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex // orders lease writes; guards rev
	rev uint64

	repMu sync.Mutex // orders the link's reports (report.go)
	rep   linkReport
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
	static := map[string]Upstream{}
	for _, u := range cfg.Upstreams {
		if err := u.Validate(); err != nil {
			return nil, err
		}
		k := wire.UpstreamKey(u.Tenant, u.Name)
		if _, ok := static[k]; ok {
			return nil, fmt.Errorf("upstream %s of tenant %s is configured twice", u.Name, u.Tenant)
		}
		static[k] = u
	}
	cfg.Timing.setDefaults()
	if log == nil {
		log = slog.Default()
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, metrics: m, nc: nc, log: log.With("component", "upstream"), kick: make(chan struct{}, 1),
		subs: map[string]*nats.Subscription{}, devices: map[string]wire.NodeRecord{}, held: map[string]*heldLink{},
		static: static, stored: map[string]Upstream{}, handshakes: map[string]chan struct{}{}}
	s.mergeUpstreams()
	return s, nil
}

// mergeUpstreams recomputes the upstreams run; s.mu held or not shared yet.
func (s *Service) mergeUpstreams() {
	s.ups = make(map[string]Upstream, len(s.static)+len(s.stored))
	maps.Copy(s.ups, s.stored)
	maps.Copy(s.ups, s.static)
}

// Run watches the node registry and keeps one link per (connected device,
// upstream) among all workers, until ctx ends; then it closes its links and
// gives up their leases.
func (s *Service) Run(ctx context.Context) error {
	if len(s.cfg.Upstreams) == 0 && !s.cfg.Stored {
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

	var sw storedWatch // its channel is nil (never ready) without stored upstreams
	if s.cfg.Stored {
		if sw, err = s.watchStored(ctx, js); err != nil {
			return err
		}
	}
	defer func() { sw.stop() }()
	if err := s.syncSubscriptions(); err != nil {
		return err
	}
	defer func() {
		for _, sub := range s.subs {
			_ = sub.Unsubscribe()
		}
	}()

	refresh := time.NewTicker(s.cfg.LeaseTTL / 3)
	defer refresh.Stop()
	defer s.releaseAll()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-sw.updates:
			if !ok {
				if ctx.Err() != nil { // the watch ends with ctx
					return nil
				}
				s.log.Warn("stored upstreams watch ended; watching again")
				sw.stop()
				sw = storedWatch{}
				continue
			}
			if e == nil { // the bucket's current entries are all in
				s.mu.Lock()
				s.stored, s.loading = s.loading, nil
				s.mergeUpstreams()
				s.mu.Unlock()
			} else {
				s.applyUpstream(e)
			}
			if err := s.syncSubscriptions(); err != nil {
				s.log.Warn("upstream node events", "err", err)
			}
			s.poke()
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
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
			if s.cfg.Stored && !sw.current(ctx, js) {
				// The bucket was lost and written again (or the watch
				// ended): watch the new one. The links run on meanwhile.
				sw.stop()
				if sw, err = s.watchStored(ctx, js); err != nil {
					s.log.Warn("stored upstreams", "err", err)
				}
			}
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

// storedWatch is the watch of the stored upstreams' bucket.
type storedWatch struct {
	w       jetstream.KeyWatcher
	updates <-chan jetstream.KeyValueEntry
	created time.Time // the bucket's stream creation: a new one means the bucket was lost
}

func (sw storedWatch) stop() {
	if sw.w != nil {
		_ = sw.w.Stop()
	}
}

// current reports whether the watch still follows the bucket: a deleted
// bucket's watch need not end, so the bucket's creation time tells.
func (sw storedWatch) current(ctx context.Context, js jetstream.JetStream) bool {
	if sw.w == nil {
		return false
	}
	created, err := bucketCreated(ctx, js)
	return err != nil || created.Equal(sw.created) // when in doubt keep the watch
}

// bucketCreated is when the stored upstreams' bucket (its stream) was
// created: one stream info request.
func bucketCreated(ctx context.Context, js jetstream.JetStream) (time.Time, error) {
	st, err := js.Stream(ctx, "KV_"+wire.BucketUpstreams)
	if err != nil {
		return time.Time{}, err
	}
	return st.CachedInfo().Created, nil
}

// watchStored opens (or creates) the bucket of stored upstreams and
// watches it; the current entries load into s.loading, which replaces
// s.stored once they are all in, so that watching again after the bucket
// was lost does not stop the links meanwhile.
func (s *Service) watchStored(ctx context.Context, js jetstream.JetStream) (storedWatch, error) {
	kv, err := wire.OpenBucket(ctx, js, wire.UpstreamsBucketConfig())
	if err != nil {
		return storedWatch{}, fmt.Errorf("upstream: stored upstreams: %w", err)
	}
	created, err := bucketCreated(ctx, js)
	if err != nil {
		return storedWatch{}, fmt.Errorf("upstream: stored upstreams: %w", err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return storedWatch{}, fmt.Errorf("upstream: watch stored upstreams: %w", err)
	}
	s.mu.Lock()
	s.loading = map[string]Upstream{}
	s.mu.Unlock()
	return storedWatch{w: w, updates: w.Updates(), created: created}, nil
}

// applyUpstream keeps the stored upstreams; an entry that does not parse
// is not run (and the gateway that wrote it is newer or broken).
func (s *Service) applyUpstream(e jetstream.KeyValueEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	into := s.stored
	if s.loading != nil {
		into = s.loading
	} else {
		defer s.mergeUpstreams()
	}
	if e.Operation() != jetstream.KeyValuePut {
		delete(into, e.Key())
		return
	}
	ent, err := wire.ParseUpstreamEntry(e.Value())
	if err == nil && wire.UpstreamKey(ent.Tenant, ent.Name) != e.Key() {
		err = fmt.Errorf("entry of %s under key %s", wire.UpstreamKey(ent.Tenant, ent.Name), e.Key())
	}
	var u Upstream
	if err == nil {
		u = upstreamOf(ent)
		err = u.Validate()
	}
	if err != nil {
		s.log.Warn("stored upstream not run", "key", e.Key(), "err", err)
		delete(into, e.Key())
		return
	}
	if _, ok := s.static[e.Key()]; ok {
		s.log.Warn("stored upstream not run: an upstream of that name is configured on this shim", "upstream", u)
	}
	into[e.Key()] = u
}

// upstream returns the current record of an upstream.
func (s *Service) upstream(tenant, name string) (Upstream, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.ups[wire.UpstreamKey(tenant, name)]
	return u, ok
}

// syncSubscriptions subscribes to the node events of the tenants that
// have an upstream and drops the others'; Run's goroutine only.
func (s *Service) syncSubscriptions() error {
	want := map[string]bool{}
	s.mu.Lock()
	for _, u := range s.ups {
		want[u.Tenant] = true
	}
	s.mu.Unlock()
	for t, sub := range s.subs {
		if !want[t] {
			_ = sub.Unsubscribe()
			delete(s.subs, t)
		}
	}
	for t := range want {
		if s.subs[t] != nil {
			continue
		}
		sub, err := s.nc.Subscribe(wire.NodeEvent(t), s.onNodeEvent)
		if err != nil {
			return fmt.Errorf("upstream: subscribe node events: %w", err)
		}
		s.subs[t] = sub
	}
	return nil
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
	conns := make(map[string]string, len(s.ups)) // UpstreamKey -> connection()
	for k, u := range s.ups {
		conns[k] = u.connection()
	}
	for _, rec := range s.devices {
		for _, u := range s.ups {
			if u.Tenant == rec.Tenant && u.publishes(rec.NodeID) {
				wanted[linkKey(u.Tenant, u.Name, rec.NodeID)] = want{u, rec}
			}
		}
	}
	var stale []*heldLink
	var keep []*heldLink
	for k, h := range s.held {
		if w, ok := wanted[k]; ok && conns[wire.UpstreamKey(w.up.Tenant, w.up.Name)] == h.conn {
			keep = append(keep, h)
		} else { // not wanted, or its upstream's connection changed: taken again below
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
			s.reportReleased(h)
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
	h := &heldLink{key: key, rev: rev, done: make(chan struct{}), conn: w.up.connection()}
	if w.up.InsecureSkipVerify {
		h.warn = "TLS certificate not verified (insecureSkipVerify)"
		s.log.Warn("upstream link does not verify the gateway's TLS certificate", "link", key, "upstream", w.up)
	}
	s.mu.Lock()
	slots := s.handshakes[w.up.URL]
	if slots == nil {
		slots = newHandshakeSlots()
		s.handshakes[w.up.URL] = slots
	}
	s.mu.Unlock()
	inv := recordInvoker{s: s, tenant: w.up.Tenant, name: w.up.Name}
	h.link = newLink(linkConfig{upstream: w.up, node: nodeOf(w.rec), identity: identity, invoker: inv,
		timing: s.cfg.Timing, log: s.log, handshakes: slots, onStatus: func(st Status) {
			s.reportStatus(h, st)
			// Best effort: the periodic refresh writes the state again.
			wctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = s.writeLease(wctx, h, st)
		}})
	s.reportTaken(h, h.link.Status())
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
	st.Holder, st.Warning = s.cfg.Instance, h.warn
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
	s.reportReleased(h)
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
	if ev.Event == wire.EventNodeConnected || ev.Event == wire.EventNodeDisconnected || ev.Event == wire.EventNodeUpstream {
		return // the links' own news is not the device's
	}
	tenant, ok := wire.TenantFromSubject(m.Subject)
	if !ok {
		return
	}
	s.mu.Lock()
	var links []*link
	for _, u := range s.ups {
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
		st.Holder, st.Warning = s.cfg.Instance, h.warn
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
