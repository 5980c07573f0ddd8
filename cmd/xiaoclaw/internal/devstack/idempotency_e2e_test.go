package devstack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// A client retries a node.invoke after the NATS server restarted (clients
// retry exactly when something restarted): the retry gets the recorded
// answer and the device does not run the call a second time.
func TestIdempotencyKeySurvivesNATSRestart(t *testing.T) {
	// A restart needs a listener: in-process clients cannot reconnect.
	st := startStack(t, Config{NATSListen: "127.0.0.1:0", NATSPassword: testNATSPassword})
	dev := connectDevices(t, st, 0, 1, 11, nil)[0]
	op := operator(t, st.GatewayURL(0))
	node := nodeID(dev)
	waitNodes(t, op, true, node)

	invoke := func(key string, volume int) (json.RawMessage, error) {
		p, _ := json.Marshal(map[string]any{"name": "self.audio_speaker.set_volume", "arguments": map[string]int{"volume": volume}})
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		return op.Invoke(ctx, occlient.InvokeParams{NodeID: node, Command: "mcp.tools.call", Params: p, TimeoutMs: 5000, IdempotencyKey: key})
	}
	first, err := invoke("retry-me", 33)
	if err != nil {
		t.Fatalf("first call: %v", err)
	}
	if dev.Calls() != 1 || dev.Volume() != 33 {
		t.Fatalf("device calls %d volume %d after the first call", dev.Calls(), dev.Volume())
	}
	awaitIdempotencyRecord(t, st, DevTenant, "retry-me")

	if err := st.RestartNATS(); err != nil {
		t.Fatalf("restart NATS: %v", err)
	}
	waitFor(t, func() bool {
		for _, c := range st.Components {
			if !c.NATS().IsConnected() {
				return false
			}
		}
		return true
	})
	// The operator sets the volume by hand meanwhile; a second run of the
	// retried call would undo it.
	if _, err := invoke("by-hand", 50); err != nil {
		t.Fatalf("call with a new key after the restart: %v", err)
	}
	if dev.Calls() != 2 || dev.Volume() != 50 {
		t.Fatalf("device calls %d volume %d after a new call", dev.Calls(), dev.Volume())
	}

	again, err := invoke("retry-me", 33)
	if err != nil {
		t.Fatalf("retry after the restart: %v", err)
	}
	if dev.Calls() != 2 || dev.Volume() != 50 {
		t.Fatalf("the retry ran on the device again: calls %d, volume %d", dev.Calls(), dev.Volume())
	}
	if !bytes.Equal(first, again) {
		t.Fatalf("the retry's answer differs from the recorded one:\n%s\n%s", first, again)
	}
}

// awaitIdempotencyRecord waits until the outcome of a tenant's call with key
// is stored (the gateway records it after it answered).
func awaitIdempotencyRecord(t *testing.T, st *Stack, tenant, key string) {
	t.Helper()
	js, err := jetstream.New(st.tenNC)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), wire.BucketIdempotency)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(key))
	k := tenant + "." + hex.EncodeToString(sum[:])
	waitFor(t, func() bool {
		e, err := kv.Get(context.Background(), k)
		return err == nil && bytes.Contains(e.Value(), []byte(`"s":"done"`))
	})
}
