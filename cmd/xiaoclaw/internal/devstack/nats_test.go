package devstack

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// By default the embedded NATS server listens nowhere: the services talk
// in-process and no client outside the process can reach the bus.
func TestDevNATSHasNoListenerByDefault(t *testing.T) {
	st := startStack(t, Config{})
	if u := st.NATSURL(); u != "" {
		t.Fatalf("embedded NATS listens at %s; want no listener", u)
	}
	// The services still work: a device connects and is listed.
	d := connectDevices(t, st, 0, 1, 5, nil)[0]
	waitNodes(t, operator(t, st.GatewayURL(0)), true, nodeID(d))
}

// With --nats-listen the server requires the generated password: a raw
// client publishing a device RPC is refused, and so is nats.go without
// credentials; with them it connects.
func TestDevNATSListenerRequiresCredentials(t *testing.T) {
	st := startStack(t, Config{NATSListen: "127.0.0.1:0", NATSPassword: "s3cret-nats"})
	u, err := url.Parse(st.NATSURL())
	if err != nil || u.Host == "" {
		t.Fatalf("NATS URL %q: %v", st.NATSURL(), err)
	}
	c, err := net.DialTimeout("tcp", u.Host, waitLimit)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(waitLimit))
	r := bufio.NewReader(c)
	if info, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(info, "INFO ") {
		t.Fatalf("INFO line %q: %v", info, err)
	}
	body := `{"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":1}}}`
	if _, err := c.Write([]byte("CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPUB xc.dev.dev.aabbcc000001.rpc " +
		strconv.Itoa(len(body)) + "\r\n" + body + "\r\nPING\r\n")); err != nil {
		t.Fatal(err)
	}
	line, _ := r.ReadString('\n')
	if !strings.Contains(line, "Authorization Violation") {
		t.Fatalf("raw client without credentials got %q, want -ERR 'Authorization Violation'", line)
	}

	if nc, err := nats.Connect(st.NATSURL(), nats.MaxReconnects(0)); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("nats.go without credentials: %v, want an authorization error", err)
	}
	if _, err := nats.Connect(st.NATSURL(), nats.UserInfo(NATSUser, "wrong"), nats.MaxReconnects(0)); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("nats.go with a wrong password: %v, want an authorization error", err)
	}
	nc, err := nats.Connect(st.NATSURL(), nats.UserInfo(NATSUser, "s3cret-nats"))
	if err != nil {
		t.Fatalf("with the credentials: %v", err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
}
