package audit

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeMessage: a stream message (anyone allowed to publish on the
// audit subjects can write one) is either refused or yields storable events.
func FuzzDecodeMessage(f *testing.F) {
	one, _ := json.Marshal(Event{ID: "a", Kind: KindInvoke, Tenant: "acme", Outcome: "ok"})
	f.Add(one)
	f.Add([]byte(`[` + string(one) + `,{"id":"a-attempt","time":"2026-01-01T00:00:00Z","kind":"node.invoke.attempt","tenant":"acme"}]`))
	f.Add([]byte(`[]`))
	f.Add([]byte(` [{"id":"x"}]`))
	f.Add([]byte(`{"id":"b","time":"2026-01-01T00:00:00Z","kind":"node.invoke","tenant":"_unknown","args":"\u0000"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		events, err := decodeMessage(data)
		if err != nil {
			return
		}
		if len(events) == 0 {
			t.Fatal("no events and no error")
		}
		for i := range events {
			if err := events[i].Validate(); err != nil {
				t.Fatalf("decoded an event no store takes: %v", err)
			}
		}
	})
}
