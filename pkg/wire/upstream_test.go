package wire_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

func goodEntry() wire.UpstreamEntry {
	return wire.UpstreamEntry{Tenant: "acme", Name: "lab", URL: "wss://gw.example:18789", Auth: wire.UpstreamAuthToken,
		Secret: "s3cret", Publish: wire.PublishNodes, Nodes: []string{"xz-1"}, CallerToken: "xcu_acme_lab_x"}
}

func TestUpstreamEntryRoundTripAndRefusals(t *testing.T) {
	b, _ := json.Marshal(goodEntry())
	e, err := wire.ParseUpstreamEntry(b)
	if err != nil || !e.Publishes("xz-1") || e.Publishes("xz-2") {
		t.Fatalf("parse %+v: %v", e, err)
	}
	for name, mut := range map[string]func(*wire.UpstreamEntry){
		"http url":          func(e *wire.UpstreamEntry) { e.URL = "http://gw" },
		"no secret":         func(e *wire.UpstreamEntry) { e.Secret = "" },
		"bad auth":          func(e *wire.UpstreamEntry) { e.Auth = "cert" },
		"ca on ws":          func(e *wire.UpstreamEntry) { e.URL, e.CACert = "ws://gw", "PEM" },
		"bad node":          func(e *wire.UpstreamEntry) { e.Nodes = []string{"a.b"} },
		"all with nodes":    func(e *wire.UpstreamEntry) { e.Publish = wire.PublishAll },
		"no caller token":   func(e *wire.UpstreamEntry) { e.CallerToken = "" },
		"bad tenant":        func(e *wire.UpstreamEntry) { e.Tenant = "A.B" },
		"name with a dot":   func(e *wire.UpstreamEntry) { e.Name = "a.b" },
		"unknown publish":   func(e *wire.UpstreamEntry) { e.Publish = "some" },
		"control in secret": func(e *wire.UpstreamEntry) { e.Secret = "a\nb" },
	} {
		e := goodEntry()
		mut(&e)
		b, _ := json.Marshal(e)
		if _, err := wire.ParseUpstreamEntry(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := wire.ParseUpstreamEntry([]byte("{")); err == nil {
		t.Error("truncated JSON accepted")
	}
}

func TestUpstreamEntryNeverPrintsItsSecrets(t *testing.T) {
	e := goodEntry()
	for _, s := range []string{fmt.Sprint(e), fmt.Sprintf("%+v", e), fmt.Sprintf("%#v", e)} {
		if strings.Contains(s, "s3cret") || strings.Contains(s, "xcu_") {
			t.Fatalf("secret printed: %s", s)
		}
	}
}

// FuzzParseUpstreamEntry: shims parse bucket entries; whatever is accepted
// is valid and keys cleanly.
func FuzzParseUpstreamEntry(f *testing.F) {
	b, _ := json.Marshal(goodEntry())
	f.Add(b)
	f.Add([]byte(`{"tenant":"a","name":"b","url":"ws://h","auth":"password","secret":"p","publish":"all","callerToken":"t"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := wire.ParseUpstreamEntry(b)
		if err != nil {
			return
		}
		if e.Validate() != nil || strings.Count(wire.UpstreamKey(e.Tenant, e.Name), ".") != 1 {
			t.Fatalf("accepted an invalid entry %q", b)
		}
	})
}
