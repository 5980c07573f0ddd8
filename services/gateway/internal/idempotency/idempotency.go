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
	"time"

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
type Store struct {
	kv  jetstream.KeyValue
	ttl time.Duration
}

// Open binds the bucket with the given TTL, creating it when missing.
func Open(ctx context.Context, js jetstream.JetStream, ttl time.Duration) (*Store, error) {
	cfg := jetstream.KeyValueConfig{
		Bucket:      wire.BucketIdempotency,
		Description: "xiaoclaw node.invoke idempotency keys",
		History:     1,
		TTL:         ttl,
		Storage:     jetstream.FileStorage,
	}
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if err != nil {
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency bucket: %w", err)
	}
	return &Store{kv: kv, ttl: ttl}, nil
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
	pending, err := json.Marshal(Record{State: statePending, Fingerprint: fp, Owner: owner})
	if err != nil {
		return nil, nil, err
	}
	for attempt := 0; attempt < 4; attempt++ {
		rev, err := s.kv.Create(ctx, key, pending)
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

// Complete records the outcome of a claimed call.
func (s *Store) Complete(ctx context.Context, c *Claim, fp string, ok bool, result []byte) error {
	b, err := json.Marshal(Record{State: stateDone, Fingerprint: fp, OK: ok, Result: result})
	if err != nil {
		return err
	}
	_, err = s.kv.Update(ctx, c.key, b, c.rev)
	return err
}

// Abandon releases a claim whose call never reached the node, so a retry
// with the same key runs again instead of replaying a failure.
func (s *Store) Abandon(ctx context.Context, c *Claim) error {
	return s.kv.Delete(ctx, c.key, jetstream.LastRevision(c.rev))
}
