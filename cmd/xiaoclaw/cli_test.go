package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/devstack"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
)

// TestOperatorCLI runs the CLI as a user would, against a dev stack with a
// simulated device, and checks output and exit codes.
func TestOperatorCLI(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := devstack.Start(ctx, devstack.Config{DataDir: t.TempDir(), DeviceToken: "dtok", OperatorToken: "otok"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dev, err := xzsim.NewDevice(xzsim.Config{URL: st.DeviceURL(0), Token: "dtok", MAC: "02:aa:00:00:00:01"})
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	if err := dev.Connect(cctx); err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	node := wire.DeviceNodeID("02aa00000001")

	env := func(k string) string {
		return map[string]string{"XIAOCLAW_URL": st.GatewayURL(0), "XIAOCLAW_TOKEN": "otok"}[k]
	}
	xc := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(ctx, args, env, &out, &errb)
		return code, out.String(), errb.String()
	}

	// The node shows up once the shim has registered the device.
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, out, _ := xc("nodes", "--json")
		if code == exitOK && strings.Contains(out, node) && strings.Contains(out, `"connected": true`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not listed: exit %d\n%s", node, code, out)
		}
		time.Sleep(20 * time.Millisecond) // polling for the registry
	}

	if code, out, errs := xc("call", node, "self.audio_speaker.set_volume", `{"volume":30}`); code != exitOK || dev.Volume() != 30 {
		t.Fatalf("call: exit %d volume %d\n%s%s", code, dev.Volume(), out, errs)
	}
	// By display-name-free prefix, as the stock CLI resolves nodes.
	if code, out, errs := xc("invoke", node[:8], "mcp.tools.list", `{}`, "--json"); code != exitOK || !strings.Contains(out, "self.get_device_status") {
		t.Fatalf("invoke by prefix: exit %d\n%s%s", code, out, errs)
	}
	if code, out, _ := xc("nodes", "describe", node, "--json"); code != exitOK || !json.Valid([]byte(out)) || !strings.Contains(out, "mcp.tools.call") {
		t.Fatalf("describe: exit %d\n%s", code, out)
	}
	if code, _, errs := xc("call", node, "self.audio_speaker.set_volume", `{"volume":300}`); code != exitGatewayErr || !strings.Contains(errs, "volume") {
		t.Fatalf("invalid argument: exit %d, want %d\n%s", code, exitGatewayErr, errs)
	}
	if code, _, _ := xc("call", "xz-ffffffffffff", "self.get_device_status"); code != exitGatewayErr {
		t.Fatalf("unknown node: exit %d, want %d", code, exitGatewayErr)
	}
	if code, _, _ := xc("nodes", "--token", "wrong"); code != exitConnect {
		t.Fatalf("wrong token: exit %d, want %d", code, exitConnect)
	}
	if code, _, _ := xc("call", node, "x", "{not json"); code != exitUsage {
		t.Fatalf("bad JSON: exit %d, want %d", code, exitUsage)
	}
}
