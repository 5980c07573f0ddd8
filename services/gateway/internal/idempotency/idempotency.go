// Package idempotency deduplicates node.invoke by idempotency key across
// gateway replicas with the JetStream KV bucket wire.BucketIdempotency.
//
// The first call with a key claims it with one atomic KV create (the only KV
// round trip on the invoke path) and later records its outcome; a call with
// the same key and the same params gets that outcome, waiting while the first
// is in flight; the same key with other params is a conflict. Entries expire
// with the bucket's TTL.
package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// ErrConflict means the key was used before with different params.
var ErrConflict = errors.New("idempotency key reused with different params")

// Record states.
const (
	statePending = "pending"
	stateDone    = "done"
)

// Record is the value stored under a key.
type Record struct {
	State       string          `json:"s"`
	Fingerprint string          `json:"f"`
	Owner       string          `json:"o,omitempty"`
	OK          bool            `json:"ok,omitempty"`
	Result      json.RawMessage `json:"r,omitempty"` // the res payload, or the error object
}

// Claim is the right, and the duty, to run a call and record its outcome.
type Claim struct {
	key string
	rev uint64
}

// Store is the idempotency bucket.
//
// The writes on the invoke path are raw JetStream publishes to the bucket's
// subjects with the expected-revision header, which is what the KV API does
// minus a regular-expression check of every key; the KV API serves the rare
// paths (a key that was released, waiting for an outcome).
type Store struct {
	nc     *nats.Conn
	kv     jetstream.KeyValue
	prefix string // subject prefix of the bucket's keys
}

// Options of the bucket.
type Options struct {
	// TTL is how long a key is remembered; required.
	TTL time.Duration
	// Replicas is the bucket's replica count in a NATS cluster (default 1).
	Replicas int
}

// Open binds the bucket, creating it when missing and bringing its TTL and
// replicas to opts. The bucket is kept in file storage: clients retry
// exactly when something restarted, so a key must outlive a NATS server
// restart, or the retried call runs on the device a second time. A bucket
// an older release made in memory storage (which a server restart empties)
// is replaced; only keys it held are lost.
func Open(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, opts Options) (*Store, error) {
	if opts.TTL <= 0 {
		return nil, errors.New("idempotency: TTL is required")
	}
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	cfg := jetstream.KeyValueConfig{
		Bucket:      wire.BucketIdempotency,
		Description: "xiaoclaw node.invoke idempotency keys",
		History:     1,
		TTL:         opts.TTL,
		Storage:     jetstream.FileStorage,
		Replicas:    opts.Replicas,
	}
	kv, err := bind(ctx, js, cfg)
	if err != nil {
		return nil, fmt.Errorf("idempotency bucket: %w", err)
	}
	return &Store{nc: nc, kv: kv, prefix: "$KV." + cfg.Bucket + "."}, nil
}

// bind creates the bucket, or updates the one there to cfg. A stream's
// storage cannot change, so a memory bucket is deleted and created again.
func bind(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if kv, err := js.KeyValue(ctx, cfg.Bucket); err == nil {
		st, err := kv.Status(ctx)
		if err != nil {
			return nil, err
		}
		if info, ok := st.(*jetstream.KeyValueBucketStatus); ok && info.StreamInfo().Config.Storage != jetstream.FileStorage {
			if err := js.DeleteKeyValue(ctx, cfg.Bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
				return nil, fmt.Errorf("replace memory bucket: %w", err)
			}
		}
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, err
	}
	return js.CreateOrUpdateKeyValue(ctx, cfg)
}

// errWrongRevision is the server refusing a write whose expected revision
// is not the key's current one.
var errWrongRevision = errors.New("wrong last revision")

// jsWrongLastSequence is JetStream's error code for that refusal.
const jsWrongLastSequence = 10071

// put writes value under key if the key's revision is rev (0: no such key)
// and returns the new revision.
func (s *Store) put(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	m := &nats.Msg{Subject: s.prefix + key, Data: value, Header: nats.Header{}}
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	resp, err := s.nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		return 0, err
	}
	var ack struct {
		Seq   uint64 `json:"seq"`
		Error *struct {
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return 0, fmt.Errorf("idempotency write: bad ack: %w", err)
	}
	if ack.Error != nil {
		if ack.Error.ErrCode == jsWrongLastSequence {
			return 0, errWrongRevision
		}
		return 0, fmt.Errorf("idempotency write: %s", ack.Error.Description)
	}
	return ack.Seq, nil
}

// publish writes without waiting for the server's acknowledgement.
func (s *Store) publish(key string, value []byte, rev uint64, op string) error {
	m := &nats.Msg{Subject: s.prefix + key, Data: value, Header: nats.Header{}}
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	if op != "" {
		m.Header.Set("KV-Operation", op)
	}
	return s.nc.PublishMsg(m)
}

// Key is the bucket key of a tenant's idempotency key. The client's key is
// hashed: it may hold any characters and must not collide across tenants.
func Key(tenant, idempotencyKey string) string {
	sum := sha256.Sum256([]byte(idempotencyKey))
	return tenant + "." + hex.EncodeToString(sum[:])
}

// Fingerprint identifies a call's target and params; whitespace in params
// does not count.
func Fingerprint(nodeID, command string, params []byte) string {
	h := sha256.New()
	h.Write([]byte(nodeID))
	h.Write([]byte{0})
	h.Write([]byte(command))
	h.Write([]byte{0})
	if len(params) > 0 {
		var buf bytes.Buffer
		if json.Compact(&buf, params) == nil {
			params = buf.Bytes()
		}
		h.Write(params)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Begin claims key for a call with fingerprint fp. It returns a Claim when
// this call must run, or the Record of a completed earlier call; while an
// earlier call is in flight it waits for its outcome until ctx is done.
func (s *Store) Begin(ctx context.Context, key, fp, owner string) (*Claim, *Record, error) {
	pending := encodeRecord(statePending, fp, owner, false, nil)
	for attempt := 0; attempt < 4; attempt++ {
		rev, err := s.put(ctx, key, pending, 0)
		if errors.Is(err, errWrongRevision) {
			// The key exists, or only its delete marker does: the KV API
			// tells the two apart.
			rev, err = s.kv.Create(ctx, key, pending)
		}
		if err == nil {
			return &Claim{key: key, rev: rev}, nil, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, nil, err
		}
		rec, err := s.await(ctx, key, fp)
		if err != nil || rec != nil {
			return nil, rec, err
		}
		// The earlier call gave its claim up: try to claim it again.
	}
	return nil, nil, errors.New("idempotency key kept changing hands")
}

// await waits for the outcome stored under key. A nil Record with no error
// means the key was released and may be claimed.
func (s *Store) await(ctx context.Context, key, fp string) (*Record, error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if rec, done, err := decide(e.Value(), fp); done || err != nil {
		return rec, err
	}
	w, err := s.kv.Watch(ctx, key)
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, ctx.Err()
			}
			if e == nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				return nil, nil
			}
			if rec, done, err := decide(e.Value(), fp); done || err != nil {
				return rec, err
			}
		}
	}
}

// decide reads a stored record: done reports a final outcome (or conflict).
func decide(value []byte, fp string) (*Record, bool, error) {
	var rec Record
	if err := json.Unmarshal(value, &rec); err != nil {
		return nil, true, fmt.Errorf("idempotency record: %w", err)
	}
	if rec.Fingerprint != fp {
		return nil, true, ErrConflict
	}
	if rec.State == stateDone {
		return &rec, true, nil
	}
	return nil, false, nil
}

// Complete records the outcome of a claimed call; result must be JSON. It
// does not wait for the server: the answer has gone out already, and
// waiters watch the key.
func (s *Store) Complete(c *Claim, fp string, ok bool, result []byte) error {
	return s.publish(c.key, encodeRecord(stateDone, fp, "", ok, result), c.rev, "")
}

// encodeRecord encodes a Record; fp and owner are hex and instance names,
// result is JSON the caller built.
func encodeRecord(state, fp, owner string, ok bool, result []byte) []byte {
	b := make([]byte, 0, 112+len(owner)+len(result))
	b = append(b, `{"s":`...)
	b = strconv.AppendQuote(b, state)
	b = append(b, `,"f":`...)
	b = strconv.AppendQuote(b, fp)
	if owner != "" {
		b = append(b, `,"o":`...)
		b = appendJSONString(b, owner)
	}
	if ok {
		b = append(b, `,"ok":true`...)
	}
	if len(result) > 0 {
		b = append(b, `,"r":`...)
		b = append(b, result...)
	}
	return append(b, '}')
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s)
	return append(b, q...)
}

// Abandon releases a claim whose call never reached the node, so a retry
// with the same key runs again instead of replaying a failure.
func (s *Store) Abandon(c *Claim) error {
	return s.publish(c.key, nil, c.rev, "DEL")
}
