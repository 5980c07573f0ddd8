package mcpserver

import (
	"context"
	"fmt"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fleet registers nodes × tools in tenant acme.
func fleet(h *harness, nodes, tools int) {
	names := make([]string, tools)
	for j := range names {
		names[j] = fmt.Sprintf("self.sim.tool_%02d", j)
	}
	for i := range nodes {
		h.nodes.set(device("acme", fmt.Sprintf("xz-%06d", i), fmt.Sprintf("bread-compact-wifi-%06x", i), names...))
	}
}

// BenchmarkToolsList measures tools/list over 1,000 nodes × 10 tools, 100
// tools per page, the policy asked for every tool (a fake authorizer
// denying one tool name, as cheap as a cached policy decision):
//   - page: one page from the tenant's cached catalog, server side;
//   - rebuild: the first page after a node change (the catalog renamed);
//   - http: one page through Streamable HTTP with the Go SDK client.
//
// Metric ms/page (the target is ≤ 20).
func BenchmarkToolsList(b *testing.B) {
	h := newHarness(b, Config{PageSize: 100, Authorizer: denyTools{"self.sim.tool_09": "r-1"}})
	fleet(h, 1000, 10)
	sess := h.srv.newSession(tokens["op-a"], scope{kind: scopeTenant})
	ctx := context.Background()
	// Cursors of every page, so each iteration lists a different one.
	var cursors []string
	for c := ""; ; {
		cursors = append(cursors, c)
		_, next, err := sess.page(ctx, c)
		if err != nil {
			b.Fatal(err)
		}
		if next == "" {
			break
		}
		c = next
	}
	if len(cursors) != 90 {
		b.Fatalf("%d pages, want 90 (9,000 visible tools)", len(cursors))
	}
	perPage := func(b *testing.B) { b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/page") }
	b.Run("page", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if tools, _, err := sess.page(ctx, cursors[i%len(cursors)]); err != nil || len(tools) != 100 {
				b.Fatal(err, len(tools))
			}
		}
		perPage(b)
	})
	b.Run("rebuild", func(b *testing.B) {
		for b.Loop() {
			h.srv.catalogs.invalidate("acme")
			if _, _, err := sess.page(ctx, ""); err != nil {
				b.Fatal(err)
			}
		}
		perPage(b)
	})
	b.Run("http", func(b *testing.B) {
		cs := h.connect("op-a", "/mcp", nil)
		for i := 0; b.Loop(); i++ {
			res, err := cs.ListTools(ctx, &mcp.ListToolsParams{Cursor: cursors[i%len(cursors)]})
			if err != nil || len(res.Tools) != 100 {
				b.Fatal(err)
			}
		}
		perPage(b)
	})
}

// BenchmarkToolCall measures one tools/call through Streamable HTTP with
// the Go SDK client against an invoker that answers at once: the MCP
// layer's own cost (HTTP, the SDKs' JSON-RPC, this package) without the
// invoke path.
//   - local: the session on the replica that opened it (no shared bucket);
//   - copy: on the other replica of a pair, which holds a copy restored
//     from the shared bucket;
//   - restore: on the other replica after it dropped its copy, so each
//     call first reads the record and connects a new copy.
func BenchmarkToolCall(b *testing.B) {
	ctx := context.Background()
	params := &mcp.CallToolParams{Name: "Kitchen_speaker__self_get_device_status", Arguments: map[string]any{}}
	call := func(b *testing.B, cs *mcp.ClientSession) {
		if res, err := cs.CallTool(ctx, params); err != nil || res.IsError {
			b.Fatal(err, res)
		}
	}
	b.Run("local", func(b *testing.B) {
		h := newHarness(b, Config{})
		h.nodes.set(device("acme", "xz-1", "Kitchen speaker", "self.get_device_status"))
		cs := h.connect("op-a", "/mcp", nil)
		b.ReportAllocs()
		for b.Loop() {
			call(b, cs)
		}
	})
	pair := func(b *testing.B) (*replicaPair, *mcp.ClientSession) {
		p := newReplicaPair(b, Config{})
		p.nodes.set(device("acme", "xz-1", "Kitchen speaker", "self.get_device_status"))
		cs, lb := p.connect("op-a", nil, false)
		lb.pin.Store(p.b)
		call(b, cs)
		return p, cs
	}
	b.Run("copy", func(b *testing.B) {
		_, cs := pair(b)
		b.ReportAllocs()
		for b.Loop() {
			call(b, cs)
		}
	})
	b.Run("restore", func(b *testing.B) {
		p, cs := pair(b)
		b.ReportAllocs()
		for b.Loop() {
			p.b.srv.closeLocal(cs.ID())
			call(b, cs)
		}
	})
}
