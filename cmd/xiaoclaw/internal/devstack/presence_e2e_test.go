package devstack

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
	"github.com/xiaoclaw/xiaoclaw/services/shim"
)

// buildDevicehub builds the devicehub command into dir.
func buildDevicehub(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "devicehub")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/xiaoclaw/xiaoclaw/services/devicehub/cmd/devicehub").CombinedOutput()
	if err != nil {
		t.Fatalf("go build devicehub: %v\n%s", err, out)
	}
	return bin
}

// testNATSPassword is the password of the stack's NATS listener in tests
// that run a service in its own process.
const testNATSPassword = "devstack-test-nats-password"

// hubProcess is a devicehub running as its own process.
type hubProcess struct {
	cmd  *exec.Cmd
	addr string
}

// startHubProcess runs the devicehub command on the stack's NATS and waits
// until it listens.
func startHubProcess(t *testing.T, st *Stack, bin, instance string, heartbeat time.Duration) *hubProcess {
	t.Helper()
	cmd := exec.Command(bin, "--nats-url", st.NATSURL(), "--nats-user", NATSUser, "--nats-password", testNATSPassword, "--device-addr", "127.0.0.1:0", "--ops-addr", "127.0.0.1:0",
		"--device-token", DevTenant+"="+testDeviceToken, "--instance", instance,
		"--heartbeat-interval", heartbeat.String(), "--log-format", "json")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "devicehub: listening" {
				addr <- line.Addr
				break
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	select {
	case a := <-addr:
		return &hubProcess{cmd: cmd, addr: a}
	case <-time.After(30 * time.Second):
		t.Fatal("devicehub process did not listen within 30s")
		return nil
	}
}

// connectTo connects a simulated device to a hub process.
func (h *hubProcess) connectTo(t *testing.T, mac string) *xzsim.Device {
	t.Helper()
	d, err := xzsim.NewDevice(xzsim.Config{URL: "ws://" + h.addr + "/xiaozhi/v1/", Token: testDeviceToken, MAC: mac})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := d.Connect(ctx); err != nil {
		t.Fatalf("device connect: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// A devicehub process killed with SIGKILL publishes no offline event: its
// devices read connected=false within the shims' hub timeout (plus the
// check interval), with a node.disconnected event, and a hub started again
// under the same name restores them once they reconnect.
func TestPresenceAfterHubKilled(t *testing.T) {
	const heartbeat, hubTimeout = 300 * time.Millisecond, 1500 * time.Millisecond
	st := startStack(t, Config{NATSListen: "127.0.0.1:0", NATSPassword: testNATSPassword,
		TuneShim: func(c *shim.Config) { c.HubTimeout = hubTimeout }})
	events := &nodeEventsByNode{n: map[string]int{}}
	op := dialAs(t, st.GatewayURL(0), testOperatorToken, events.on)

	bin := buildDevicehub(t, t.TempDir())
	hub := startHubProcess(t, st, bin, "hub-proc", heartbeat)
	const mac = "aa:bb:cc:0d:0e:01"
	dev := hub.connectTo(t, mac)
	node := nodeID(dev)
	waitNodes(t, op, true, node)

	if err := hub.cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	killed := time.Now()
	_ = hub.cmd.Wait()
	// The bound: the timeout, one check interval, and a second of slack for
	// the registry write and the gateways' watchers.
	bound := hubTimeout + time.Second + time.Second
	if !eventually.Until(bound-time.Since(killed), func() bool { return !listNodes(t, op)[node].Connected }) {
		t.Fatalf("node still connected %s after its hub was killed (bound %s)", time.Since(killed), bound)
	}
	t.Logf("connected=false %s after SIGKILL", time.Since(killed).Round(10*time.Millisecond))
	waitFor(t, func() bool { return events.count(node, wire.EventNodeDisconnected) == 1 })

	again := startHubProcess(t, st, bin, "hub-proc", heartbeat)
	again.connectTo(t, mac)
	waitNodes(t, op, true, node)
	waitFor(t, func() bool { return events.count(node, wire.EventNodeConnected) == 2 })
	// The returned hub's heartbeats keep the node connected.
	deadline := time.Now().Add(2 * hubTimeout)
	for time.Now().Before(deadline) {
		if !listNodes(t, op)[node].Connected {
			t.Fatal("node of the returned hub marked disconnected")
		}
		time.Sleep(100 * time.Millisecond) // watching a state hold over a period
	}
}
