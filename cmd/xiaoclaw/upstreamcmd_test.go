package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/devstack"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// TestUpstreamStatusCLI publishes a device to a gateway that refuses the
// token (a second stack with another operator token) and reads the link's
// state with `xiaoclaw upstream status`.
func TestUpstreamStatusCLI(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	up, err := devstack.Start(ctx, devstack.Config{DataDir: t.TempDir(), DeviceToken: "d1", OperatorToken: "right"})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	const natsPassword = "upstream-status-test"
	st, err := devstack.Start(ctx, devstack.Config{DataDir: t.TempDir(), DeviceToken: "dtok", OperatorToken: "otok",
		NATSListen: "127.0.0.1:0", NATSPassword: natsPassword,
		Upstream: upstream.Upstream{Name: "lab", URL: up.GatewayURL(0), Token: "wrong-token"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dev, err := xzsim.NewDevice(xzsim.Config{URL: st.DeviceURL(0), Token: "dtok", MAC: "02:aa:00:00:00:07"})
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	if err := dev.Connect(cctx); err != nil {
		t.Fatal(err)
	}
	defer dev.Close()

	env := func(k string) string {
		return map[string]string{"XIAOCLAW_NATS_URL": st.NATSURL(), natsauth.EnvUser: devstack.NATSUser, natsauth.EnvPassword: natsPassword}[k]
	}
	var out, errb bytes.Buffer
	var code int
	if !eventually.Until(eventually.Limit, func() bool {
		out.Reset()
		errb.Reset()
		code = run(ctx, []string{"upstream", "status"}, env, &out, &errb)
		return code == exitOK && strings.Contains(out.String(), "disabled")
	}) {
		t.Fatalf("no disabled link: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "xz-02aa00000007") || !strings.Contains(out.String(), "lab") ||
		strings.Contains(out.String(), "wrong-token") {
		t.Fatalf("status:\n%s", out.String())
	}
	errb.Reset()
	if code := run(ctx, []string{"upstream", "status"}, func(string) string { return "" }, &bytes.Buffer{}, &errb); code != exitUsage {
		t.Fatalf("without --nats-url: exit %d %s", code, errb.String())
	}
}
