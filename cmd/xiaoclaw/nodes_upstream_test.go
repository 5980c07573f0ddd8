package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/devstack"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// `xiaoclaw nodes` shows each node's upstream links: here an upstream
// nothing listens on, so the device's link waits to retry, and `nodes
// describe` says why.
func TestNodesShowTheirUpstreamLinks(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "ws://" + ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	st, err := devstack.Start(ctx, devstack.Config{DataDir: t.TempDir(), DeviceToken: "dtok", OperatorToken: "otok",
		Upstream: upstream.Upstream{Name: "lab", URL: deadURL, Token: "t"}})
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
		return map[string]string{"XIAOCLAW_URL": st.GatewayURL(0), "XIAOCLAW_TOKEN": "otok"}[k]
	}
	xc := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := run(ctx, args, env, &out, &errb)
		return code, out.String() + errb.String()
	}

	var out string
	eventually.Within(t, 15*time.Second, "the UPSTREAM column shows the link", func() bool {
		var code int
		code, out = xc("nodes")
		return code == exitOK && strings.Contains(out, "UPSTREAM") &&
			(strings.Contains(out, "lab:backoff") || strings.Contains(out, "lab:connecting"))
	})
	t.Logf("\n%s", out)
	code, out := xc("nodes", "describe", "xz-02aa00000007")
	if code != exitOK || !strings.Contains(out, "upstream:  lab ") || !strings.Contains(out, "(connect") {
		t.Fatalf("describe: exit %d\n%s", code, out)
	}
}
