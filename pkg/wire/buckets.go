package wire

import (
	"context"
	"errors"
	"time"

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

// BucketMCPSessions is the JetStream KV bucket of the gateways' MCP
// sessions, so any replica serves any request of a session; keys are
// "<tenant>.<principal hash>.<session id>".
const BucketMCPSessions = "xc_mcp_sessions"

// MCPSessionTTL is how long an MCP session's record outlives its last
// refresh: a session idle that long has ended everywhere.
const MCPSessionTTL = time.Hour

// MCPSessionsBucketConfig is the configuration of BucketMCPSessions: the
// latest record per session, in memory (a NATS restart ends the sessions,
// which clients then open again), expiring MCPSessionTTL after its last
// write. The gateways create it.
func MCPSessionsBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      BucketMCPSessions,
		Description: "xiaoclaw gateway MCP sessions",
		History:     1,
		TTL:         MCPSessionTTL,
		Storage:     jetstream.MemoryStorage,
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

// BucketUpstreams is the JetStream KV bucket of the tenants' stored
// upstream OpenClaw gateways, one UpstreamEntry per upstream under
// UpstreamKey(tenant, name). The gateways render it from the tenancy
// store (pkg/tenancy.UpstreamSync); the shims watch it and run the links.
// It holds secrets (the OpenClaw gateway's token or password and the
// caller token): only the gateway's and the shim's NATS users may read it.
const BucketUpstreams = "xc_upstreams"

// UpstreamsBucketConfig is the configuration of BucketUpstreams: the latest
// entry per upstream only, on disk, so that a NATS restart does not lose
// the caller tokens the tenancy store keeps only hashed.
func UpstreamsBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      BucketUpstreams,
		Description: "xiaoclaw stored upstream OpenClaw gateways",
		History:     1,
		Storage:     jetstream.FileStorage,
	}
}

// BucketUpstreamLeases is the JetStream KV bucket of the upstream links'
// leases, one per (tenant, upstream, node) under UpstreamLinkKey: the shim
// worker that runs a link refreshes its entry with the link's state
// (UpstreamLink plus details of its own) every third of the bucket's TTL,
// and an entry whose holder died expires. The shims create it; gateways
// read it to show the links in node.list.
const BucketUpstreamLeases = "xc_upstream_leases"

// UpstreamLinkKey is the key of a link in BucketUpstreamLeases; every part
// is a validated subject token.
func UpstreamLinkKey(tenant, upstream, nodeID string) string {
	return tenant + "." + upstream + "." + nodeID
}

// Upstream link states (UpstreamLink.State).
const (
	UpstreamConnecting = "connecting" // dialing or in the handshake
	UpstreamPairing    = "pairing"    // waiting for the pairing request to be approved upstream
	UpstreamOnline     = "online"     // the node is on the upstream gateway
	UpstreamBackoff    = "backoff"    // the last attempt failed; waiting to retry
	UpstreamDisabled   = "disabled"   // the upstream refused the credentials
)

// UpstreamLink is the state of one (device, upstream) link: the common
// part of a BucketUpstreamLeases entry and the payload of an
// EventNodeUpstream node event.
type UpstreamLink struct {
	Upstream  string `json:"upstream"`
	Tenant    string `json:"tenant,omitempty"`
	NodeID    string `json:"nodeId"`
	State     string `json:"state"`
	LastError string `json:"lastError,omitempty"`
	// RequestID is the pairing request to approve upstream (state pairing).
	RequestID string `json:"requestId,omitempty"`
	SinceMs   int64  `json:"sinceMs,omitempty"` // when State was entered
}
