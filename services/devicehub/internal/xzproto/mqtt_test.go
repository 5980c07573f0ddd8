package xzproto

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestParseMQTTClientID(t *testing.T) {
	id, err := ParseMQTTClientID("GID_test@@@aa_bb_cc_dd_ee_ff@@@3f1c2b7e-0000-4000-8000-000000000001")
	if err != nil || id != (MQTTClientID{Group: "test", Device: "aa_bb_cc_dd_ee_ff", UUID: "3f1c2b7e-0000-4000-8000-000000000001"}) {
		t.Fatalf("firmware client id: %+v %v", id, err)
	}
	if id, err := ParseMQTTClientID("GID_@@@d1@@@"); err != nil || id.Device != "d1" {
		t.Fatalf("empty group and uuid: %+v %v", id, err)
	}
	for _, bad := range []string{"", "aa_bb", "GID_x@@@aa", "GID_x@@@@@@u", "x@@@aa@@@u", "GID_x@@@a@@@b@@@c",
		"GID_" + strings.Repeat("g", 300) + "@@@aa@@@u"} {
		if _, err := ParseMQTTClientID(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestServerHelloUDPHasEveryFieldTheFirmwareNeeds(t *testing.T) {
	u := UDPEndpoint{Server: "10.0.0.5", Port: 8884}
	for i := range u.Key {
		u.Key[i], u.Nonce[i] = byte(i), byte(0xf0+i)
	}
	var h struct {
		Type        string `json:"type"`
		Transport   string `json:"transport"`
		SessionID   string `json:"session_id"`
		AudioParams struct {
			Format        string `json:"format"`
			SampleRate    int    `json:"sample_rate"`
			Channels      int    `json:"channels"`
			FrameDuration int    `json:"frame_duration"`
		} `json:"audio_params"`
		UDP struct {
			Server, Key, Nonce, Encryption string
			Port                           int
		} `json:"udp"`
	}
	raw := ServerHelloUDP("s\"1", u)
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	key, _ := hex.DecodeString(h.UDP.Key)
	nonce, _ := hex.DecodeString(h.UDP.Nonce)
	if h.Type != "hello" || h.Transport != "udp" || h.SessionID != "s\"1" || h.AudioParams.Format != "opus" ||
		h.AudioParams.SampleRate != 24000 || h.AudioParams.Channels != 1 || h.AudioParams.FrameDuration != 60 ||
		h.UDP.Server != "10.0.0.5" || h.UDP.Port != 8884 || h.UDP.Encryption != "aes-128-ctr" ||
		string(key) != string(u.Key[:]) || string(nonce) != string(u.Nonce[:]) {
		t.Fatalf("server hello: %s", raw)
	}
	var g struct {
		Type      string `json:"type"`
		SessionID string `json:"session_id"`
	}
	if err := json.Unmarshal(Goodbye("abc"), &g); err != nil || g.SessionID != "abc" || g.Type != "goodbye" {
		t.Fatalf("goodbye: %s", Goodbye("abc"))
	}
}

func FuzzParseMQTTClientID(f *testing.F) {
	for _, s := range []string{"GID_test@@@aa_bb_cc_dd_ee_ff@@@u", "GID_@@@@@@", "@@@@@@", "GID_a@@@b", "GID_\x00@@@\xff@@@x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseMQTTClientID(s)
		if err != nil {
			return
		}
		if id.Device == "" || len(s) > MaxMQTTClientID || "GID_"+id.Group+"@@@"+id.Device+"@@@"+id.UUID != s {
			t.Fatalf("%q parsed to %+v", s, id)
		}
	})
}
