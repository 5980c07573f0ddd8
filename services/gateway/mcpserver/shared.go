package mcpserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Sessions shared by the replicas: the replica that initializes a session
// writes its record to the KV bucket wire.BucketMCPSessions; a replica
// that gets a request of a session it does not hold reads the record and
// connects a copy of the session (its own SDK server and transport, with
// the recorded state) that serves this and later requests of the id. A
// DELETE on any replica deletes the record, and every replica watching the
// bucket closes its copy.

// refreshEvery is how often a session in use rewrites its record, which
// restarts the record's expiry (wire.MCPSessionTTL): at most once a minute,
// off the request's path.
const refreshEvery = time.Minute

// sessionRecord is a session's value in the bucket.
type sessionRecord struct {
	Tenant    string `json:"tenant"`
	Principal string `json:"principal"` // access.Principal.ID; every request's token must resolve to it
	// Role is the principal's role at initialize: a token whose role has
	// changed since must open a new session, as on the replica that
	// opened it.
	Role  string `json:"role"`
	Scope string `json:"scope"` // scope.String(): tenant, node:<id>, group:<name>
	// State is the SDK's session state: initialize params (clientInfo,
	// for the audit) and the negotiated protocol version.
	State   *mcp.ServerSessionState `json:"state"`
	Created time.Time               `json:"created"`
}

// ShareSessions keeps this replica's sessions in kv (the bucket of
// wire.MCPSessionsBucketConfig) and serves the sessions other replicas
// opened, until ctx ends. Call it before serving requests; without it
// sessions stay on the replica that opened them.
func (s *Server) ShareSessions(ctx context.Context, kv jetstream.KeyValue) error {
	// Only deletions matter: metadata is enough.
	w, err := kv.Watch(ctx, ">", jetstream.UpdatesOnly(), jetstream.MetaOnly())
	if err != nil {
		return fmt.Errorf("mcpserver: watch %s: %w", wire.BucketMCPSessions, err)
	}
	s.store = kv
	go func() {
		defer func() { _ = w.Stop() }()
		for e := range w.Updates() {
			if e == nil {
				continue
			}
			if op := e.Operation(); op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge {
				key := e.Key()
				s.closeLocal(key[strings.LastIndexByte(key, '.')+1:])
			}
		}
	}()
	return nil
}

// principalKey is a principal's part of a record's key: its tenant and a
// hash of its id (ids may hold characters keys may not). A request looks a
// session up under its own token's principal, so another principal's
// session is never found.
func principalKey(p access.Principal) string {
	h := sha256.Sum256([]byte(p.ID))
	return p.Tenant + "." + hex.EncodeToString(h[:8])
}

func recordKey(p access.Principal, id string) string { return principalKey(p) + "." + id }

// validSessionID accepts the ids newID makes (32 lowercase hex digits), so
// nothing else reaches a KV key.
func validSessionID(id string) bool {
	if len(id) != 32 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// save writes the record of a session that has just initialized.
func (sess *session) save(ctx context.Context, ss *mcp.ServerSession, version string) error {
	state := &mcp.ServerSessionState{InitializeParams: ss.InitializeParams(), NegotiatedProtocolVersion: version,
		// The client sends notifications/initialized next, to this replica
		// or another: a copy takes the session as initialized.
		InitializedParams: &mcp.InitializedParams{}}
	b, err := json.Marshal(sessionRecord{Tenant: sess.principal.Tenant, Principal: sess.principal.ID, Role: sess.principal.Role,
		Scope: sess.scope.String(), State: state, Created: time.Now().UTC()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rev, err := sess.s.store.Create(ctx, sess.key, b)
	if err != nil {
		return err
	}
	sess.record = b
	sess.rev.Store(rev)
	sess.refreshed.Store(time.Now().UnixNano())
	return nil
}

// touch refreshes the session's record if it is due, in the background.
func (sess *session) touch() {
	if sess.record == nil {
		return
	}
	now := time.Now().UnixNano()
	last := sess.refreshed.Load()
	if now-last < int64(refreshEvery) || !sess.refreshed.CompareAndSwap(last, now) {
		return
	}
	go sess.refresh()
}

// refresh rewrites the record (restarting its expiry) unless it is gone:
// then the session has ended elsewhere, and so does this copy.
func (sess *session) refresh() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv := sess.s.store
	rev, err := kv.Update(ctx, sess.key, sess.record, sess.rev.Load())
	if err != nil {
		// Another replica refreshed it (a newer revision), or it is gone.
		e, gerr := kv.Get(ctx, sess.key)
		if errors.Is(gerr, jetstream.ErrKeyNotFound) {
			sess.close()
			return
		}
		if gerr != nil {
			sess.s.log.Warn("mcp: session refresh", "err", gerr)
			return
		}
		if rev, err = kv.Update(ctx, sess.key, sess.record, e.Revision()); err != nil {
			sess.s.log.Warn("mcp: session refresh", "err", err)
			return
		}
	}
	sess.rev.Store(rev)
}

// forget deletes the session's record: the session ends on every replica.
func (s *Server) forget(ctx context.Context, sess *session) error {
	if s.store == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return s.store.Delete(ctx, sess.key)
}

// errNoSession is a session id this request cannot use: unknown, ended,
// another principal's or another path's.
var errNoSession = errors.New("session not found")

// lookup finds the session a request names, on this replica or in the
// bucket (then connecting a copy here).
func (s *Server) lookup(ctx context.Context, id string, p access.Principal, sc scope) (*session, error) {
	s.mu.Lock()
	sess := s.sessions[id]
	s.mu.Unlock()
	if sess != nil {
		// The session's principal as it was (a changed role opens a new
		// session) and its path.
		if sess.principal != p || sess.scope != sc {
			return nil, errNoSession
		}
		return sess, nil
	}
	if s.store == nil || !validSessionID(id) {
		return nil, errNoSession
	}
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	e, err := s.store.Get(gctx, recordKey(p, id))
	cancel()
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, errNoSession
	}
	if err != nil {
		return nil, err
	}
	var rec sessionRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.State == nil || rec.State.InitializeParams == nil {
		s.log.Warn("mcp: malformed session record", "key", e.Key(), "err", err)
		return nil, errNoSession
	}
	if rec.Tenant != p.Tenant || rec.Principal != p.ID || rec.Role != p.Role || rec.Scope != sc.String() {
		return nil, errNoSession
	}
	return s.restore(id, p, sc, &rec, e)
}

// restore connects this replica's copy of a session recorded by another.
func (s *Server) restore(id string, p access.Principal, sc scope, rec *sessionRecord, e jetstream.KeyValueEntry) (*session, error) {
	sess := &session{s: s, id: id, principal: p, scope: sc, key: e.Key(), record: e.Value(), restored: true}
	sess.rev.Store(e.Revision())
	sess.refreshed.Store(e.Created().UnixNano())
	sess.server = s.newSDKServer(sess)
	sess.transport = &mcp.StreamableServerTransport{SessionID: id}
	// The session outlives the request that restored it.
	ss, err := sess.server.Connect(context.Background(), sess.transport, &mcp.ServerSessionOptions{State: rec.State})
	if err != nil {
		return nil, fmt.Errorf("connect restored session: %w", err)
	}
	sess.idle = time.AfterFunc(s.cfg.SessionTimeout, sess.close)
	if got := s.register(sess, ss); got != sess {
		// A concurrent request restored it first.
		sess.idle.Stop()
		_ = ss.Close()
		return got, nil
	}
	return sess, nil
}

// serveCopy serves a request of a session restored on this replica.
func (s *Server) serveCopy(w http.ResponseWriter, r *http.Request, sess *session) {
	if v := r.Header.Get("Mcp-Protocol-Version"); v != "" && !slices.Contains(protocolVersions, v) {
		http.Error(w, "Bad Request: Unsupported protocol version (supported versions: "+strings.Join(protocolVersions, ",")+")", http.StatusBadRequest)
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodPost:
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.Body != nil {
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxRequestBytes)
	}
	sess.busy(1)
	defer sess.busy(-1)
	sess.transport.ServeHTTP(w, r)
}

// end answers a DELETE: the record goes (every replica's watcher closes
// its copy) and so does this replica's copy, here rather than in the SDK's
// handler, which would answer 404 had the watcher closed it first.
func (s *Server) end(w http.ResponseWriter, r *http.Request, sess *session) {
	if err := s.forget(r.Context(), sess); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		s.log.Warn("mcp: delete session record", "err", err)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "MCP sessions unavailable; retry", http.StatusServiceUnavailable)
		return
	}
	sess.close()
	w.WriteHeader(http.StatusNoContent)
}

// busy counts a restored copy's requests in progress (an open GET stream
// is one); the copy closes after SessionTimeout without any.
func (sess *session) busy(d int) {
	sess.idleMu.Lock()
	defer sess.idleMu.Unlock()
	sess.inUse += d
	if sess.inUse > 0 {
		sess.idle.Stop()
	} else {
		sess.idle.Reset(sess.s.cfg.SessionTimeout)
	}
}

// close ends this replica's copy of the session (the record stays, unless
// the caller deleted it). The copy is unreachable once close returns, so
// the next request of the session restores a new one.
func (sess *session) close() {
	ss := sess.serverSession()
	sess.s.unregister(sess)
	if ss != nil {
		_ = ss.Close()
	}
}

// closeLocal closes this replica's copy of a session, if it has one.
func (s *Server) closeLocal(id string) {
	s.mu.Lock()
	sess := s.sessions[id]
	s.mu.Unlock()
	if sess != nil {
		sess.close()
	}
}

// sessionsOf counts a principal's sessions: on every replica when they
// are shared, else on this one.
func (s *Server) sessionsOf(ctx context.Context, p access.Principal) (int, error) {
	if s.store == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		n := 0
		for sess := range s.byTenant[p.Tenant] {
			if sess.principal.ID == p.ID {
				n++
			}
		}
		return n, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := s.store.ListKeysFiltered(ctx, principalKey(p)+".*")
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Stop() }()
	n := 0
	for range l.Keys() {
		n++
	}
	return n, nil
}
