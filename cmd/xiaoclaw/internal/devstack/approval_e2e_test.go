package devstack

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/admincmd"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
)

// adminCLI runs one `xiaoclaw` admin command line against the stack's
// gateway with the global admin token.
func adminCLI(t *testing.T, st *Stack, token string, args ...string) string {
	t.Helper()
	out, err := adminCLIErr(st, token, args...)
	if err != nil {
		t.Fatalf("xiaoclaw %v: %v\n%s", args, err, out)
	}
	return out
}

func adminCLIErr(st *Stack, token string, args ...string) (string, error) {
	server := "http://" + strings.TrimPrefix(st.GatewayURL(0), "ws://")
	env := map[string]string{"XIAOCLAW_SERVER": server, "XIAOCLAW_TOKEN": token}
	root := &cobra.Command{Use: "xiaoclaw", SilenceErrors: true, SilenceUsage: true}
	root.AddCommand(admincmd.CommandsWithEnv(func(k string) string { return env[k] })...)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

// In a tenant that requires tool approval, a tool a known node gains is
// hidden from node.list and refused until an admin approves it with
// `xiaoclaw node approve-tools`; the tools it had stay usable.
func TestNewToolsAwaitApproval(t *testing.T) {
	const admin = "test-admin-token"
	st := startStack(t, Config{Hubs: 1, Shims: 1, Gateways: 1, AdminToken: admin})
	acme := newTenant(t, st, "acme")
	adminCLI(t, st, admin, "tenant", "update", "acme", "--require-tool-approval")

	const mac = "02:ab:00:00:00:01"
	cfg := xzsim.Config{URL: st.DeviceURL(0), MAC: mac, ExtraTools: 1}
	probe, err := xzsim.NewDevice(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Token, err = st.Tenancy.Devices.MintDeviceToken(context.Background(), acme.id, probe.ClientID(), mac); err != nil {
		t.Fatal(err)
	}
	d, err := xzsim.NewDevice(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := d.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	op := dialAs(t, st.GatewayURL(0), acme.token, nil)
	node := nodeID(d)
	first := waitCatalog(t, op, node, "listed", func(n catalogNode) bool {
		return n.Connected && slices.Contains(n.names(), "self.sim.extra_0001")
	})

	// The device gains a tool.
	d.SetExtraTools(2)
	if err := d.Notify(ctx, "notifications/tools/list_changed", nil); err != nil {
		t.Fatal(err)
	}
	widened := waitCatalog(t, op, node, "at the next version", func(n catalogNode) bool { return n.ToolsVersion > first.ToolsVersion })
	if slices.Contains(widened.names(), "self.sim.extra_0002") {
		t.Fatalf("a tool awaiting approval is listed: %v", widened.names())
	}
	if _, err := callTool(ctx, op, node, "self.sim.extra_0002", map[string]int{"value": 7}, 5*time.Second); err == nil ||
		!strings.Contains(err.Error(), "approve-tools") {
		t.Fatalf("call of a tool awaiting approval: %v", err)
	}
	if _, err := callTool(ctx, op, node, "self.sim.extra_0001", map[string]int{"value": 5}, 5*time.Second); err != nil {
		t.Fatalf("an approved tool of the node: %v", err)
	}

	// Approving a tool that is not pending, or on an unknown node, fails.
	if out, err := adminCLIErr(st, admin, "node", "approve-tools", node, "--tenant", "acme", "--tool", "self.sim.extra_0001"); err == nil ||
		!strings.Contains(err.Error(), "not awaiting approval") {
		t.Fatalf("approving a tool that is not pending: %v %s", err, out)
	}
	if out, err := adminCLIErr(st, admin, "node", "approve-tools", "xz-02ab00000099", "--tenant", "acme"); err == nil ||
		!strings.Contains(err.Error(), "not found") {
		t.Fatalf("approving on an unknown node: %v %s", err, out)
	}
	out := adminCLI(t, st, admin, "node", "approve-tools", node, "--tenant", "acme")
	if !strings.Contains(out, "approved self.sim.extra_0002") {
		t.Fatalf("approve-tools said %q", out)
	}
	waitCatalog(t, op, node, "listing the approved tool", func(n catalogNode) bool { return slices.Contains(n.names(), "self.sim.extra_0002") })
	if _, err := callTool(ctx, op, node, "self.sim.extra_0002", map[string]int{"value": 7}, 5*time.Second); err != nil {
		t.Fatalf("call of an approved tool: %v", err)
	}
	if d.ExtraValue(2) != 7 {
		t.Fatalf("the approved call did not reach the device: %d", d.ExtraValue(2))
	}
}
