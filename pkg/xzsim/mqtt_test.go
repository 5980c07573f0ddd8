package xzsim

import (
	"encoding/json"
	"testing"
)

const goodUDPHello = `{"type":"hello","transport":"udp","session_id":"s1","audio_params":{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60},"udp":{"server":"10.0.0.1","port":8884,"key":"000102030405060708090a0b0c0d0e0f","nonce":"f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff","encryption":"aes-128-ctr"}}`

func TestParseUDPHelloRequiresEveryField(t *testing.T) {
	h, err := ParseUDPHello([]byte(goodUDPHello))
	if err != nil || h.SessionID != "s1" || h.Server != "10.0.0.1" || h.Port != 8884 || h.Key[15] != 0x0f || h.Nonce[0] != 0xf0 {
		t.Fatalf("%+v %v", h, err)
	}
	var full map[string]any
	_ = json.Unmarshal([]byte(goodUDPHello), &full)
	for _, drop := range []string{"type", "transport", "session_id", "audio_params", "udp", "udp.server", "udp.port", "udp.key", "udp.nonce", "udp.encryption"} {
		var m map[string]any
		_ = json.Unmarshal([]byte(goodUDPHello), &m)
		if len(drop) > 4 && drop[:4] == "udp." {
			delete(m["udp"].(map[string]any), drop[4:])
		} else {
			delete(m, drop)
		}
		b, _ := json.Marshal(m)
		if _, err := ParseUDPHello(b); err == nil {
			t.Errorf("hello without %s accepted", drop)
		}
	}
	short := []byte(`{"type":"hello","transport":"udp","session_id":"s","audio_params":{"sample_rate":24000,"frame_duration":60},"udp":{"server":"h","port":1,"key":"00","nonce":"f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff","encryption":"aes-128-ctr"}}`)
	if _, err := ParseUDPHello(short); err == nil {
		t.Error("1-byte key accepted")
	}
}

func FuzzParseUDPHello(f *testing.F) {
	f.Add([]byte(goodUDPHello))
	f.Add([]byte(`{"type":"hello","transport":"websocket"}`))
	f.Add([]byte(`{"type":"hello","transport":"udp","udp":{"port":70000}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseUDPHello(b)
		if err != nil {
			return
		}
		if !json.Valid(b) || h.Server == "" || h.Port < 1 || h.Port > 65535 || h.SessionID == "" {
			t.Fatalf("accepted %q as %+v", b, h)
		}
	})
}
