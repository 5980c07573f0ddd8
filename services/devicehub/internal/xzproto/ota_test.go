package xzproto

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"
)

func firmwareHeaders() http.Header {
	return http.Header{"Device-Id": {"aa:bb:cc:dd:ee:ff"}, "Client-Id": {"3f1c2b7e-0000-4000-8000-000000000001"},
		"Activation-Version": {"1"}, "User-Agent": {"bread-compact-wifi/1.8.9"}}
}

func TestParseOTARequest(t *testing.T) {
	r, err := ParseOTARequest(firmwareHeaders(), []byte(`{"mac_address":"AA:BB:CC:DD:EE:FF","uuid":"x","application":{"name":"xiaozhi","version":"1.9.0"},"board":{"type":"bread-compact-wifi"}}`))
	if err != nil || r.DeviceID != "aa:bb:cc:dd:ee:ff" || r.ClientID != "3f1c2b7e-0000-4000-8000-000000000001" ||
		r.FirmwareVersion != "1.9.0" || r.Board != "bread-compact-wifi" || r.ActivationVersion != 1 {
		t.Fatalf("firmware request: %+v %v", r, err)
	}
	// Body fallbacks; version from the User-Agent.
	r, err = ParseOTARequest(http.Header{"User-Agent": {"board/2.0.1"}}, []byte(`{"mac_address":"11:22:33:44:55:66","uuid":"u-1"}`))
	if err != nil || r.DeviceID != "11:22:33:44:55:66" || r.ClientID != "u-1" || r.FirmwareVersion != "2.0.1" {
		t.Fatalf("body fallback: %+v %v", r, err)
	}
	for name, body := range map[string]string{
		"empty": ``, "array": `[]`, "truncated": `{"a":`, "mac not string": `{"mac_address":1}`,
		"mac disagrees": `{"mac_address":"11:22:33:44:55:66"}`, "version not string": `{"application":{"version":1}}`,
		"application not object": `{"application":"x"}`,
	} {
		if _, err := ParseOTARequest(firmwareHeaders(), []byte(body)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s accepted", name)
		}
	}
	h := firmwareHeaders()
	h.Set("Client-Id", "a@@@b")
	if _, err := ParseOTARequest(h, []byte(`{}`)); !errors.Is(err, ErrMalformed) {
		t.Error("client id with @@@ accepted")
	}
}

func TestParseActivateRequest(t *testing.T) {
	for _, body := range []string{``, `{}`, `{"Payload":{}}`} {
		if r, err := ParseActivateRequest([]byte(body)); err != nil || r != (ActivateRequest{}) {
			t.Errorf("%q: %+v %v", body, r, err)
		}
	}
	want := ActivateRequest{Algorithm: "hmac-sha256", SerialNumber: "SN1", Challenge: "c", HMAC: "ab"}
	for _, body := range []string{
		`{"algorithm":"hmac-sha256","serial_number":"SN1","challenge":"c","hmac":"ab"}`,
		`{"Payload":{"algorithm":"hmac-sha256","serial_number":"SN1","challenge":"c","hmac":"ab"}}`,
	} {
		if r, err := ParseActivateRequest([]byte(body)); err != nil || r != want {
			t.Errorf("%s: %+v %v", body, r, err)
		}
	}
	for _, body := range []string{`[]`, `{"challenge":1}`, `{"Payload":"x"}`, `{"Payload":{"hmac":[]}}`, `nul`} {
		if _, err := ParseActivateRequest([]byte(body)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s accepted", body)
		}
	}
}

func FuzzParseOTARequest(f *testing.F) {
	f.Add("aa:bb:cc:dd:ee:ff", "u-1", "1", []byte(`{"mac_address":"aa:bb:cc:dd:ee:ff","application":{"version":"1.0"},"board":{"type":"b"}}`))
	f.Add("", "", "", []byte(`{"mac_address":"AA_BB_CC_DD_EE_FF","uuid":"x"}`))
	f.Add("d", "c", "2", []byte(`{"application":null,"board":{"type":null}}`))
	f.Add("x", "y", "z", []byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, device, client, actVersion string, body []byte) {
		h := http.Header{"Device-Id": {device}, "Client-Id": {client}, "Activation-Version": {actVersion}}
		r, err := ParseOTARequest(h, body)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		if !json.Valid(body) || !validToken(r.DeviceID, 64) || !validToken(r.ClientID, 64) || len(r.FirmwareVersion) > 64 {
			t.Fatalf("accepted %q/%q %q as %+v", device, client, body, r)
		}
	})
}

func FuzzParseActivateRequest(f *testing.F) {
	for _, s := range []string{``, `{}`, `{"Payload":{"challenge":"c"}}`, `{"algorithm":"hmac-sha256","hmac":"00"}`, `{"Payload":[]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseActivateRequest(body)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		if len(r.Challenge) > 256 || len(r.HMAC) > 256 || firstByte(body) != 0 && !json.Valid(body) {
			t.Fatalf("accepted %q as %+v", body, r)
		}
	})
}
