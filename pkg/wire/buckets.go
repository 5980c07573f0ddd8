package wire

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// NodesBucketConfig is the configuration of the node registry bucket
// (BucketNodes): the latest record per node only, on disk. The shims write
// it and the gateways watch it; whichever service starts first creates it.
func NodesBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      BucketNodes,
		Description: "xiaoclaw node registry",
		History:     1,
		Storage:     jetstream.FileStorage,
	}
}

// OpenBucket binds bucket cfg.Bucket, creating it with cfg if it does not
// exist. A bucket that exists is used as it is (another service created it,
// maybe with other settings), and a replica that loses the creation race
// binds the winner's bucket.
func OpenBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, err
	}
	kv, err = js.CreateKeyValue(ctx, cfg)
	if err == nil {
		return kv, nil
	}
	if kv2, err2 := js.KeyValue(ctx, cfg.Bucket); err2 == nil {
		return kv2, nil
	}
	return nil, err
}
