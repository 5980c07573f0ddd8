package upstream

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Buckets of upstream mode.
const (
	// BucketIdentities holds one Ed25519 identity per (tenant, upstream,
	// node), created once and never expired: the upstream pairs the key,
	// so a new one would need a new approval.
	BucketIdentities = "xc_upstream_ids"
	// BucketLeases holds, per (tenant, upstream, node), the lease of the
	// worker that runs the link and the link's Status. Entries expire when
	// their holder stops refreshing them.
	BucketLeases = wire.BucketUpstreamLeases
)

// linkKey is the KV key of a (tenant, upstream, node) triple; every part is
// a validated subject token, so the key is a valid KV key.
func linkKey(tenant, upstream, node string) string {
	return wire.UpstreamLinkKey(tenant, upstream, node)
}

// identityRecord is the value of a BucketIdentities entry.
type identityRecord struct {
	Seed        []byte `json:"seed"` // ed25519 seed, 32 bytes
	CreatedAtMs int64  `json:"createdAtMs"`
}

// identities loads or creates link identities.
type identities struct{ kv jetstream.KeyValue }

// get returns the identity of key, creating it on first use. Two workers
// racing both end up with the one that was written first (Create is a
// compare-and-set on "absent").
func (s identities) get(ctx context.Context, key string) (ed25519.PrivateKey, error) {
	for range 3 {
		e, err := s.kv.Get(ctx, key)
		if err == nil {
			var rec identityRecord
			if err := json.Unmarshal(e.Value(), &rec); err != nil || len(rec.Seed) != ed25519.SeedSize {
				return nil, fmt.Errorf("identity %s is corrupt", key)
			}
			return ed25519.NewKeyFromSeed(rec.Seed), nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("read identity %s: %w", key, err)
		}
		seed := make([]byte, ed25519.SeedSize)
		_, _ = rand.Read(seed)
		b, _ := json.Marshal(identityRecord{Seed: seed, CreatedAtMs: time.Now().UnixMilli()})
		if _, err := s.kv.Create(ctx, key, b); err == nil {
			return ed25519.NewKeyFromSeed(seed), nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("store identity %s: %w", key, err)
		}
	}
	return nil, fmt.Errorf("identity %s: lost the creation race three times", key)
}
