package xzsim

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestToolsPagesFollowTheFirmware(t *testing.T) {
	c := newCatalog(100)
	var names []string
	cursor := ""
	pages := 0
	for {
		page, errMsg := c.toolsPage(cursor, false)
		if errMsg != "" {
			t.Fatal(errMsg)
		}
		if len(page) > maxToolsPage {
			t.Fatalf("page of %d bytes exceeds %d", len(page), maxToolsPage)
		}
		var p struct {
			Tools []struct {
				Name        string          `json:"name"`
				InputSchema json.RawMessage `json:"inputSchema"`
			} `json:"tools"`
			NextCursor *string `json:"nextCursor"`
		}
		if err := json.Unmarshal(page, &p); err != nil {
			t.Fatalf("page is not JSON: %v", err)
		}
		pages++
		for _, tl := range p.Tools {
			names = append(names, tl.Name)
		}
		if p.NextCursor == nil {
			break
		}
		if *p.NextCursor != c.tools[indexOf(c, *p.NextCursor)].name || *p.NextCursor == "" {
			t.Fatalf("nextCursor %q is not a tool name", *p.NextCursor)
		}
		cursor = *p.NextCursor
	}
	if pages < 3 {
		t.Fatalf("100 extra tools fit into %d pages; want at least 3", pages)
	}
	if len(names) != 4+100 || names[0] != "self.get_device_status" {
		t.Fatalf("listed %d tools starting with %s", len(names), names[0])
	}
	for _, n := range names {
		if n == "self.reboot" {
			t.Fatal("user-only tool listed without withUserTools")
		}
	}
	all, _ := c.toolsPage("", true)
	if !strings.Contains(string(all), `"self.reboot"`) || !strings.Contains(string(all), `"annotations":{"audience":["user"]}`) {
		t.Fatalf("withUserTools page lacks user-only tools: %.300s", all)
	}
	if _, errMsg := c.toolsPage("self.no_such_tool", false); errMsg == "" {
		t.Fatal("unknown cursor accepted")
	}
}

func indexOf(c *catalog, name string) int {
	for i, t := range c.tools {
		if t.name == name {
			return i
		}
	}
	return -1
}

func TestToolSchemaShape(t *testing.T) {
	c := newCatalog(0)
	var vol struct {
		Name        string `json:"name"`
		InputSchema struct {
			Type       string `json:"type"`
			Properties map[string]struct {
				Type    string `json:"type"`
				Minimum *int   `json:"minimum"`
				Maximum *int   `json:"maximum"`
			} `json:"properties"`
			Required []string `json:"required"`
		} `json:"inputSchema"`
	}
	if err := json.Unmarshal(c.byName["self.audio_speaker.set_volume"].schema, &vol); err != nil {
		t.Fatal(err)
	}
	p := vol.InputSchema.Properties["volume"]
	if vol.InputSchema.Type != "object" || p.Type != "integer" || *p.Minimum != 0 || *p.Maximum != 100 ||
		len(vol.InputSchema.Required) != 1 || vol.InputSchema.Required[0] != "volume" {
		t.Fatalf("set_volume schema: %s", c.byName["self.audio_speaker.set_volume"].schema)
	}
	snap := string(c.byName["self.screen.snapshot"].schema)
	if !strings.Contains(snap, `"quality":{"type":"integer","default":80,"minimum":1,"maximum":100}`) || !strings.Contains(snap, `"required":["url"]`) {
		t.Fatalf("snapshot schema: %s", snap)
	}
	if strings.Contains(string(c.byName["self.get_device_status"].schema), "required") {
		t.Fatal("a tool without parameters lists required ones")
	}
}

func TestArgumentErrorsFollowTheFirmware(t *testing.T) {
	c := newCatalog(0)
	vol := c.byName["self.audio_speaker.set_volume"]
	for args, want := range map[string]string{
		`{"volume":101}`:        "Value exceeds maximum allowed: 100",
		`{"volume":-3}`:         "Value is below minimum allowed: 0",
		`{}`:                    "Missing valid argument: volume",
		`{"volume":"50"}`:       "Missing valid argument: volume",
		`{"volume":50,"x":1}`:   "",
		`{"volume":50.9}`:       "",
		`{"volume":true}`:       "Missing valid argument: volume",
		`{"volume":100,"y":[]}`: "",
	} {
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(args), &raw); err != nil {
			t.Fatal(err)
		}
		_, err := vol.bind(raw)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != want {
			t.Errorf("%s: %q, want %q", args, got, want)
		}
	}
	a, _ := c.byName["self.screen.snapshot"].bind(map[string]json.RawMessage{"url": json.RawMessage(`"http://x"`)})
	if a.int("quality") != 80 {
		t.Fatalf("default quality %d", a.int("quality"))
	}
}

func TestParseRequestDropsWhatTheFirmwareDrops(t *testing.T) {
	for payload, ok := range map[string]bool{
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`:                true,
		`{"jsonrpc":"2.0","id":7.0,"method":"tools/list","params":{}}`:  true,
		`{"jsonrpc":"2.0","id":"1","method":"tools/list"}`:              false, // string id
		`{"jsonrpc":"2.0","method":"tools/list"}`:                       false, // no id
		`{"id":1,"method":"tools/list"}`:                                false, // no jsonrpc
		`{"jsonrpc":"1.0","id":1,"method":"tools/list"}`:                false,
		`{"jsonrpc":"2.0","id":1,"result":{}}`:                          false, // a response
		`{"jsonrpc":"2.0","id":1,"method":"notifications/initialized"}`: false,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[1]}`:   false,
		`{"jsonrpc":"2.0","id":null,"method":"tools/list"}`:             false,
		`[1,2]`: false,
		`nope`:  false,
	} {
		if _, got := parseRequest([]byte(payload)); got != ok {
			t.Errorf("%s: accepted=%v, want %v", payload, got, ok)
		}
	}
}

func TestReplyShapes(t *testing.T) {
	if got := string(replyError(3, `Unknown tool: "x"`)); got != `{"jsonrpc":"2.0","id":3,"error":{"message":"Unknown tool: \"x\""}}` {
		t.Fatalf("error reply %s", got)
	}
	if got := string(callResult(true)); got != `{"content":[{"type":"text","text":"true"}],"isError":false}` {
		t.Fatalf("call result %s", got)
	}
	if got := string(callResult(42)); !strings.Contains(got, `"text":"42"`) {
		t.Fatalf("int result %s", got)
	}
}

func TestIdentitiesAreDeterministicAndDistinct(t *testing.T) {
	seen := map[string]bool{}
	for i := range 1000 {
		m := MAC(7, i)
		if seen[m] {
			t.Fatalf("MAC %s repeats", m)
		}
		seen[m] = true
	}
	if MAC(7, 1) != "02:07:00:00:00:01" || MAC(7, 1) == MAC(8, 1) {
		t.Fatalf("MAC(7,1)=%s", MAC(7, 1))
	}
	id := ClientID(7, 1)
	if id != ClientID(7, 1) || id == ClientID(7, 2) || len(id) != 36 || id[14] != '4' {
		t.Fatalf("ClientID %s", id)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []Config{
		{URL: "http//x", MAC: "aa:bb:cc:dd:ee:ff"},
		{URL: "ws://h/xiaozhi/v1/", MAC: "aabbccddeeff"},
		{URL: "ws://h/xiaozhi/v1/", MAC: "aa:bb:cc:dd:ee:ff", ExtraTools: -1},
	} {
		if _, err := NewDevice(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// FuzzHandleMCP feeds arbitrary server payloads to the device's MCP server:
// it must never panic, and every reply it sends must be a JSON object.
func FuzzHandleMCP(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":"self.sim.extra_0010","withUserTools":true}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":1e3}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":7}}`,
		`{"jsonrpc":"2.0","id":-1,"method":"tools/call","params":{"name":"self.screen.set_theme","arguments":{"theme":null}}}`,
		`{"jsonrpc":"2.0","id":1e308,"method":"x"}`,
		`{}`, `null`, `"`,
	} {
		f.Add([]byte(s))
	}
	d := newDevice(Config{MAC: "02:00:00:00:00:01"}, newCatalog(30))
	f.Fuzz(func(t *testing.T, payload []byte) {
		req, ok := parseRequest(payload)
		if !ok {
			return
		}
		reply, call := d.respond(req)
		if call != nil {
			reply = d.run(req.id, call)
		}
		if !json.Valid(reply) || reply[0] != '{' {
			t.Fatalf("invalid reply %s", reply)
		}
	})
}
