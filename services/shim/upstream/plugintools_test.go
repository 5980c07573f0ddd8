package upstream

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

func catalogOf(names ...string) json.RawMessage {
	var tools []map[string]any
	for _, n := range names {
		tools = append(tools, map[string]any{"name": n, "description": "does " + n,
			"inputSchema": map[string]any{"type": "object", "properties": map[string]any{"v": map[string]any{"type": "integer"}}}})
	}
	b, _ := json.Marshal(tools)
	return b
}

func TestPluginToolsOfMapsTheMCPCatalog(t *testing.T) {
	got := pluginToolsOf(json.RawMessage(`[
		{"name":"self.screen.set_theme","description":"Sets the theme.","inputSchema":{"type":"object"}},
		{"name":"self.audio_speaker.set_volume","inputSchema":"not an object"},
		{"name":"self.Audio-Speaker.set volume!"},
		{"name":"SELF.AUDIO-SPEAKER.SET_VOLUME_"},
		{"name":""}, 7, {"description":"no name"},
		{"name":"self.screen.set_theme","description":"a duplicate"}]`))
	var names []string
	for _, d := range got {
		names = append(names, d.Name)
		if d.PluginID != "node-mcp" || d.Command != "mcp.tools.call.v1" || d.MCP.Server != "xiaozhi" || d.Description == "" {
			t.Fatalf("descriptor %+v", d)
		}
	}
	// Sorted by tool name; names made provider-safe; unique ignoring case.
	want := []string{"xiaozhi_SELF_AUDIO-SPEAKER_SET_VOLUME", "xiaozhi_self_Audio-Speaker_set_volume_2",
		"xiaozhi_self_audio_speaker_set_volume", "xiaozhi_self_screen_set_theme"}
	if !slices.Equal(names, want) {
		t.Fatalf("names %v, want %v", names, want)
	}
	if got[2].MCP.Tool != "self.audio_speaker.set_volume" || string(got[2].Parameters) != string(defaultToolParameters) ||
		got[2].Description != "self.audio_speaker.set_volume" {
		t.Fatalf("a tool without description or object schema: %+v", got[2])
	}
	if string(got[3].Parameters) != `{"type":"object"}` || got[3].Description != "Sets the theme." {
		t.Fatalf("schema and description kept: %+v", got[3])
	}

	// OpenClaw's bounds: 64-character names, 1024 UTF-16 units of
	// description, 128 descriptors.
	long := strings.Repeat("x", 100)
	many := make([]string, 0, 200)
	for i := range 200 {
		many = append(many, fmt.Sprintf("t%03d", i))
	}
	d := pluginToolsOf(json.RawMessage(`[{"name":"` + long + `","description":"` + strings.Repeat("😀", 600) + `"}]`))
	if len(d) != 1 || len(d[0].Name) != 64 || d[0].MCP.Tool != long || len([]rune(d[0].Description)) != 512 {
		t.Fatalf("long name and description: %d %d", len(d[0].Name), len([]rune(d[0].Description)))
	}
	if n := len(pluginToolsOf(catalogOf(many...))); n != maxPluginTools {
		t.Fatalf("%d descriptors of 200 tools", n)
	}
	if pluginToolsOf(json.RawMessage(`{"not":"a list"}`)) != nil {
		t.Fatal("descriptors from a catalog that is not a list")
	}
}

// requestLog reads a fake connection's requests by method, keeping the
// others for later.
type requestLog struct {
	c     *fakeConn
	stash []map[string]json.RawMessage
}

func (r *requestLog) next(t *testing.T, method string) json.RawMessage {
	t.Helper()
	is := func(f map[string]json.RawMessage) bool {
		var m string
		_ = json.Unmarshal(f["method"], &m)
		return m == method
	}
	for i, f := range r.stash {
		if is(f) {
			r.stash = slices.Delete(r.stash, i, i+1)
			return f["params"]
		}
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case f := <-r.c.reqs:
			if is(f) {
				return f["params"]
			}
			r.stash = append(r.stash, f)
		case <-deadline:
			t.Fatalf("no %s from the node", method)
			return nil
		}
	}
}

func toolNames(t *testing.T, params json.RawMessage) []string {
	t.Helper()
	var p pluginToolsParams
	if err := json.Unmarshal(params, &p); err != nil {
		t.Fatalf("node.pluginTools.update params %s: %v", params, err)
	}
	var out []string
	for _, d := range p.Tools {
		out = append(out, d.MCP.Tool)
	}
	return out
}

func TestLinkPublishesItsCatalogOnceOnlineAndOnChange(t *testing.T) {
	gw := newFakeGateway(t)
	timing := fastTiming
	timing.ToolsDebounce = 200 * time.Millisecond
	l := newLink(linkConfig{
		upstream: Upstream{Name: "home", Tenant: "acme", URL: gw.url(), Token: linkToken},
		node:     Node{NodeID: "xz-aabbccddeeff", DisplayName: "Kitchen speaker", Version: "1.6.0"},
		identity: occlient.NewIdentity(), invoker: &fakeInvoker{}, timing: timing, log: slog.New(slog.DiscardHandler),
	})
	l.setCatalog(catalogOf("self.a", "self.b"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	c := gw.next(t)
	reqs := &requestLog{c: c}
	if got := toolNames(t, reqs.next(t, methodPluginToolsUpdate)); !slices.Equal(got, []string{"self.a", "self.b"}) {
		t.Fatalf("first publication %v", got)
	}
	var ev struct {
		Event       string `json:"event"`
		PayloadJSON string `json:"payloadJSON"`
	}
	_ = json.Unmarshal(reqs.next(t, methodNodeEvent), &ev)
	if ev.Event != eventPresenceAlive || !strings.Contains(ev.PayloadJSON, `"trigger":"connect"`) {
		t.Fatalf("presence on connect: %+v", ev)
	}
	eventually.True(t, "the upstream's answer in the status", func() bool {
		a := l.Status().LastEvent
		return a != nil && a.Event == eventPresenceAlive && a.Handled && a.Error == ""
	})

	// A burst of changes is one publication of the last catalog; the same
	// catalog again is none.
	l.setCatalog(catalogOf("self.a", "self.b", "self.c"))
	l.setCatalog(catalogOf("self.a", "self.c"))
	l.setCatalog(catalogOf("self.a", "self.c"))
	if got := toolNames(t, reqs.next(t, methodPluginToolsUpdate)); !slices.Equal(got, []string{"self.a", "self.c"}) {
		t.Fatalf("after a burst of changes: %v", got)
	}
	l.setCatalog(catalogOf("self.a", "self.c"))
	l.setCatalog(catalogOf("self.d"))
	if got := toolNames(t, reqs.next(t, methodPluginToolsUpdate)); !slices.Equal(got, []string{"self.d"}) {
		t.Fatalf("the next publication %v, want only the new catalog (none for an unchanged one)", got)
	}

	// Approval upstream: the node publishes again to learn what the
	// upstream admitted, and says it is there.
	c.send(t, eventPairResolved, map[string]any{"requestId": "r1", "nodeId": c.params.Device.ID, "decision": "approved"})
	if got := toolNames(t, reqs.next(t, methodPluginToolsUpdate)); !slices.Equal(got, []string{"self.d"}) {
		t.Fatalf("after approval %v", got)
	}

	// An empty catalog clears the tools upstream.
	l.setCatalog(json.RawMessage(`[]`))
	if got := toolNames(t, reqs.next(t, methodPluginToolsUpdate)); len(got) != 0 {
		t.Fatalf("cleared catalog %v", got)
	}

	// A new connection gets the catalog again.
	l.setCatalog(catalogOf("self.e"))
	if got := toolNames(t, reqs.next(t, methodPluginToolsUpdate)); !slices.Equal(got, []string{"self.e"}) {
		t.Fatalf("after clearing %v", got)
	}
	_ = c.ws.CloseNow()
	c2 := gw.next(t)
	if got := toolNames(t, (&requestLog{c: c2}).next(t, methodPluginToolsUpdate)); !slices.Equal(got, []string{"self.e"}) {
		t.Fatalf("on the new connection %v", got)
	}
}

func TestServicePublishesCatalogChangesOfTheRecord(t *testing.T) {
	srv := startNATS(t)
	gw := newFakeGateway(t)
	seed := connectNATS(t, srv, "seed")
	const node = "xz-aabbccddeeff"
	rec := wire.NodeRecord{NodeID: node, Tenant: "acme", Kind: wire.NodeKindXiaoZhi, Connected: true,
		Tools: catalogOf("self.get_device_status")}
	putDevice(t, seed, rec)
	startWorker(t, connectNATS(t, srv, "worker"), "worker", gw, 3*time.Second)
	reqs := &requestLog{c: gw.next(t)}
	if got := toolNames(t, reqs.next(t, methodPluginToolsUpdate)); !slices.Equal(got, []string{"self.get_device_status"}) {
		t.Fatalf("first publication %v", got)
	}
	rec.Tools, rec.ToolsVersion = catalogOf("self.get_device_status", "self.reboot"), 2
	putDevice(t, seed, rec)
	if got := toolNames(t, reqs.next(t, methodPluginToolsUpdate)); !slices.Equal(got, []string{"self.get_device_status", "self.reboot"}) {
		t.Fatalf("after the catalog changed %v", got)
	}
}

var providerSafe = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`)

// FuzzPluginToolsOf feeds device catalogs (bytes a device chose) to the
// descriptor mapping: whatever they hold, every descriptor must be one the
// upstream's schema accepts.
func FuzzPluginToolsOf(f *testing.F) {
	f.Add([]byte(`[{"name":"self.audio_speaker.set_volume","description":"Sets the volume.","inputSchema":{"type":"object"}}]`))
	f.Add([]byte(`[{"name":"..."},{"name":"_-_"},{"name":"9lives","inputSchema":[1]},{"name":"\u00e9t\u00e9","description":" "}]`))
	f.Add([]byte(`[{"name":"a"},{"name":"A"},{"name":"a_2"},{"name":"a!"}]`))
	f.Add([]byte(`{"tools":[]}`))
	f.Fuzz(func(t *testing.T, catalog []byte) {
		got := pluginToolsOf(catalog)
		if len(got) > maxPluginTools {
			t.Fatalf("%d descriptors", len(got))
		}
		seen := map[string]bool{}
		for _, d := range got {
			if !providerSafe.MatchString(d.Name) || seen[strings.ToLower(d.Name)] {
				t.Fatalf("name %q (unique: %v)", d.Name, !seen[strings.ToLower(d.Name)])
			}
			seen[strings.ToLower(d.Name)] = true
			if strings.TrimSpace(d.Description) == "" || len(utf16.Encode([]rune(d.Description))) > maxToolDescription ||
				!utf8.ValidString(d.Description) {
				t.Fatalf("description %q", d.Description)
			}
			var params map[string]any
			if err := json.Unmarshal(d.Parameters, &params); err != nil {
				t.Fatalf("parameters %s: %v", d.Parameters, err)
			}
			if d.PluginID != pluginIDNodeMCP || d.Command != commandMCPCallV1 || d.MCP.Server != mcpServer || d.MCP.Tool == "" {
				t.Fatalf("descriptor %+v", d)
			}
		}
		if _, err := json.Marshal(pluginToolsParams{Tools: got}); err != nil {
			t.Fatal(err)
		}
	})
}

func TestLinkShowsARefusedCatalog(t *testing.T) {
	gw := newFakeGateway(t)
	gw.refuseMethods = map[string]gwError{
		methodPluginToolsUpdate: {Code: "INVALID_REQUEST", Message: "unknown method: node.pluginTools.update"},
		methodNodeEvent:         {Code: "UNAVAILABLE", Message: "node pairing changed while invocation was active"},
	}
	timing := fastTiming
	timing.ToolsDebounce = time.Millisecond
	l := startLink(t, gw, timing, &fakeInvoker{})
	reqs := &requestLog{c: gw.next(t)}
	l.setCatalog(catalogOf("self.a"))
	reqs.next(t, methodPluginToolsUpdate)
	eventually.True(t, "the refusal in the status", func() bool {
		st := l.Status()
		return st.State == StateOnline && strings.Contains(st.ToolsError, "unknown method") && st.Tools == 0 &&
			st.LastEvent != nil && strings.Contains(st.LastEvent.Error, "pairing changed")
	})
	// Refused params are not sent again on this connection; another
	// catalog is.
	l.setCatalog(catalogOf("self.a", "self.b"))
	if got := toolNames(t, reqs.next(t, methodPluginToolsUpdate)); !slices.Equal(got, []string{"self.a", "self.b"}) {
		t.Fatalf("after a refusal: %v", got)
	}
}
