package mcpstdio

import "testing"

func TestEndpointURL(t *testing.T) {
	for _, tc := range []struct{ in, path, want string }{
		{"ws://127.0.0.1:18789", "/mcp", "http://127.0.0.1:18789/mcp"},
		{"wss://gw.example.com/", "/mcp/nodes/xz-1", "https://gw.example.com/mcp/nodes/xz-1"},
		{"http://gw:80/some/path", "/mcp", "http://gw:80/mcp"},
		{"https://gw", "/mcp/groups/kitchen", "https://gw/mcp/groups/kitchen"},
	} {
		got, err := EndpointURL(tc.in, tc.path)
		if err != nil || got != tc.want {
			t.Errorf("EndpointURL(%q, %q) = %q, %v; want %q", tc.in, tc.path, got, err, tc.want)
		}
	}
	if _, err := EndpointURL("127.0.0.1:18789", "/mcp"); err == nil {
		t.Error("a URL without a scheme was taken")
	}
}
