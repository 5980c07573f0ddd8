package toolcall

import (
	"encoding/json"
	"testing"
)

// BenchmarkParse measures Parse on the invoke path, beside a plain
// encoding/json decode of the same params into a struct (what reading
// only name and arguments costs with the standard library) as the
// reference.
func BenchmarkParse(b *testing.B) {
	call := []byte(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":50,"fade":{"ms":200,"curve":"linear"}}}`)
	v1 := []byte(`{"server":"xiaozhi","tool":"self.audio_speaker.set_volume","arguments":{"volume":50,"fade":{"ms":200,"curve":"linear"}}}`)
	b.Run("mcp.tools.call", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Parse(CommandCall, call); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("mcp.tools.call.v1", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Parse(CommandCallV1, v1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json-reference", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var tc struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			}
			if err := json.Unmarshal(call, &tc); err != nil {
				b.Fatal(err)
			}
		}
	})
}
