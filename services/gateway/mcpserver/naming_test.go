package mcpserver

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/registry"
)

func TestBaseToolName(t *testing.T) {
	for _, tc := range []struct{ display, node, tool, want string }{
		{"Kitchen speaker", "xz-1", "self.audio_speaker.set_volume", "Kitchen_speaker__self_audio_speaker_set_volume"},
		{"", "xz-aa-bb", "self.get_device_status", "xz_aa_bb__self_get_device_status"},
		{"客厅 speaker!", "xz-1", "run", "speaker__run"},
		{"客厅", "客厅", "工具", "node__tool"},
		{"a very long display name that goes on and on", "n", "t", "a_very_long_display_and_on__t"},
		{"esp32-s3-touch-amoled-1.8-d4e5f6", "n", "self.reboot", "esp32_s3_touch_amole_d4e5f6__self_reboot"},
	} {
		got, long := baseToolName(tc.display, tc.node, tc.tool)
		if got != tc.want || long {
			t.Errorf("baseToolName(%q, %q, %q) = %q (long %v), want %q", tc.display, tc.node, tc.tool, got, long, tc.want)
		}
	}
	got, long := baseToolName("Speaker", "xz-1", strings.Repeat("x", 80))
	if !long || len(got) != MaxToolName-hashSuffixLen {
		t.Errorf("a long tool name: %q long %v", got, long)
	}
}

// The catalog's names stay valid and unique whatever the nodes call
// themselves and their tools, and a name does not depend on the order the
// registry lists nodes in.
func TestCatalogNamesUniqueAndStable(t *testing.T) {
	recs := []struct{ id, name string }{{"xz-1", "Speaker"}, {"xz-2", "Speaker"}, {"xz-3", "speaker"}, {"xz-4", ""}, {"xz-5", strings.Repeat("L", 100)}}
	tools := []string{"self.a", "self_a", "self.a.b", strings.Repeat("t", 70), strings.Repeat("t", 71), "x"}
	var nodes []*registry.Node
	for _, r := range recs {
		nodes = append(nodes, registry.NewNode(device("acme", r.id, r.name, tools...), 1))
	}
	tc := &tenantCatalog{tools: map[*registry.Node]*nodeTools{}}
	a := tc.build(nodes)
	reversed := make([]*registry.Node, len(nodes))
	for i, n := range nodes {
		reversed[len(nodes)-1-i] = n
	}
	b := (&tenantCatalog{tools: map[*registry.Node]*nodeTools{}}).build(reversed)
	if len(a.entries) != len(recs)*len(tools) {
		t.Fatalf("%d entries, want %d", len(a.entries), len(recs)*len(tools))
	}
	seen := map[string]bool{}
	for i, e := range a.entries {
		if !ValidToolName(e.name) || seen[e.name] {
			t.Errorf("name %q invalid or repeated", e.name)
		}
		seen[e.name] = true
		if b.entries[i].name != e.name || b.entries[i].node.NodeID != e.node.NodeID {
			t.Errorf("names depend on the registry's order: %q vs %q", e.name, b.entries[i].name)
		}
	}
}

func FuzzToolNames(f *testing.F) {
	f.Add("Kitchen speaker", "xz-1", "self.audio_speaker.set_volume", "Kitchen speaker", "xz-2", "self.audio_speaker.set_volume")
	f.Add("", "n", "..", "", "n2", "--")
	f.Add("\xff\xfe", "a", strings.Repeat("é", 40), "b", "c", "d")
	f.Fuzz(func(t *testing.T, d1, n1, t1, d2, n2, t2 string) {
		if n1 == n2 && t1 == t2 {
			return
		}
		rec1, rec2 := device("acme", "x1", d1, t1), device("acme", "x2", d2, t2)
		rec1.NodeID, rec2.NodeID = n1, n2 // node ids come validated from the registry; names must not rely on it
		nodes := []*registry.Node{registry.NewNode(rec1, 1), registry.NewNode(rec2, 1)}
		s := (&tenantCatalog{tools: map[*registry.Node]*nodeTools{}}).build(nodes)
		seen := map[string]bool{}
		for _, e := range s.entries {
			if !ValidToolName(e.name) || strings.Contains(e.name, "-") {
				t.Fatalf("invalid name %q from (%q, %q, %q)", e.name, e.node.DisplayName, e.node.NodeID, e.tool.name)
			}
			if seen[e.name] {
				t.Fatalf("repeated name %q", e.name)
			}
			seen[e.name] = true
		}
	})
}

// FuzzToolCall sends arbitrary names, arguments and cursors through a
// session: nothing panics, and a call reaches the invoke path only for a
// tool of the catalog, with the arguments as sent.
func FuzzToolCall(f *testing.F) {
	f.Add("Speaker__self_ok", []byte(`{"v":1}`), "")
	f.Add("self.ok", []byte(`null`), "U3BlYWtlcl9f")
	f.Add("", []byte(`[1,2]`), "%%%")
	f.Add("Speaker__self_ok", []byte(`"str"`), "AAAA")
	nodes := &fakeNodes{}
	nodes.set(device("acme", "xz-1", "Speaker", "self.ok", "self.other"))
	inv := &fakeInvoker{fail: map[string]*CallError{}}
	srv, err := New(Config{Auth: tokens, Authorizer: access.AllowAll{}, Nodes: nodes, Invoker: inv, PageSize: 1})
	if err != nil {
		f.Fatal(err)
	}
	sessions := []*session{
		srv.newSession(tokens["op-a"], scope{kind: scopeTenant}),
		srv.newSession(tokens["op-a"], scope{kind: scopeNode, id: "xz-1"}),
	}
	f.Fuzz(func(t *testing.T, name string, args []byte, cursor string) {
		var raw json.RawMessage
		if json.Valid(args) {
			raw = args
		}
		for _, sess := range sessions {
			before := len(inv.calls)
			res, err := sess.callTool(context.Background(), &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Name: name, Arguments: raw}})
			if (res == nil) == (err == nil) {
				t.Fatalf("callTool(%q) gave result %v and error %v", name, res, err)
			}
			if len(inv.calls) > before {
				c := inv.calls[len(inv.calls)-1]
				if c.NodeID != "xz-1" || (c.Tool != "self.ok" && c.Tool != "self.other") || string(c.Arguments) != string(raw) {
					t.Fatalf("invoked %+v for %q", c, name)
				}
			}
			if _, _, err := sess.page(context.Background(), cursor); err != nil && err != errInvalidCursor {
				t.Fatalf("page(%q): %v", cursor, err)
			}
		}
	})
}

// FuzzDeviceResult: the fast reading of a device's result gives what the
// SDK's decoder gives, for any bytes a device may send.
func FuzzDeviceResult(f *testing.F) {
	for _, s := range []string{
		`{"content":[{"type":"text","text":"true"}],"isError":false}`,
		`{"content":[{"type":"text","text":"a"},{"type":"text","text":"\u00e9\ud83d"}],"isError":true}`,
		`{"content":[{"type":"image","data":"AA==","mimeType":"image/png"}]}`,
		`{"content":[{"type":"text","text":"x","annotations":{"priority":1}}],"structuredContent":{"v":1}}`,
		`{"content":[],"isError":null}`, `{"content":null}`, `{"Content":[{"type":"text","text":"x"}]}`,
		`{"content":[{"type":"text","text":"x"}],"content":[{"type":"text","text":"y"}]}`,
		`{"content":[{"TYPE":"text","text":"x"}]}`, `{"content":[null]}`, `"plain"`, `[1]`, `{"content":[{"type":"text","text":"\xff"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		fast, ok := textResult(payload)
		if !ok {
			return
		}
		var slow mcp.CallToolResult
		if err := slow.UnmarshalJSON(payload); err != nil {
			t.Fatalf("read %s as a text result; the SDK refuses it: %v", payload, err)
		}
		a, errA := json.Marshal(fast)
		b, errB := json.Marshal(&slow)
		if errA != nil || errB != nil || string(a) != string(b) {
			t.Fatalf("payload %s: fast %s (%v), SDK %s (%v)", payload, a, errA, b, errB)
		}
	})
}
