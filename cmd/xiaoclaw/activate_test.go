package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/devstack"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
)

// TestDeviceActivation: a new device boots through OTA and shows a code; an
// operator binds it with `xiaoclaw device activate`; the device then gets
// its credentials and connects into the tenant.
func TestDeviceActivation(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := devstack.Start(ctx, devstack.Config{DataDir: t.TempDir(), DeviceToken: "dtok", OperatorToken: "otok",
		AdminToken: "admin-token-0123456789", MQTTAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d, err := xzsim.NewDevice(xzsim.Config{OTAURL: st.OTAURL(0), MAC: "02:ac:00:00:00:01", ActivationPoll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	connected := make(chan error, 1)
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	defer ccancel()
	go func() { connected <- d.Connect(cctx) }()

	deadline := time.Now().Add(10 * time.Second)
	for d.ActivationCode() == "" {
		if time.Now().After(deadline) {
			t.Fatal("the device never showed an activation code")
		}
		time.Sleep(10 * time.Millisecond) // polling the simulated screen
	}
	env := func(k string) string {
		return map[string]string{"XIAOCLAW_SERVER": "http://" + st.Gateways[0].Addr(), "XIAOCLAW_TOKEN": "admin-token-0123456789"}[k]
	}
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"device", "activate", "000000", "--tenant", "dev"}, env, &out, &errb); code == exitOK {
		t.Fatal("a wrong code was accepted")
	}
	out.Reset()
	errb.Reset()
	if code := run(ctx, []string{"device", "activate", d.ActivationCode(), "--tenant", "dev"}, env, &out, &errb); code != exitOK {
		t.Fatalf("activate: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "02ac00000001") {
		t.Fatalf("activate output %q does not name the device", out.String())
	}
	if err := <-connected; err != nil {
		t.Fatalf("device did not connect after activation: %v", err)
	}
	defer d.Close()
}
