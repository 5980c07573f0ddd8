package tenancy_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

func FuzzParseOperatorToken(f *testing.F) {
	f.Add("xco_aaaaaaaaaaaaaaaa_" + strings.Repeat("b", 52))
	f.Add("xco_")
	f.Add("xco_aaaaaaaaaaaaaaaa_")
	f.Add("xco__" + strings.Repeat("b", 52))
	f.Add("tok_aaaaaaaaaaaaaaaa")
	f.Add("xco_AAAAAAAAAAAAAAAA_" + strings.Repeat("B", 52))
	f.Fuzz(func(t *testing.T, s string) {
		id, err := tenancy.ParseOperatorToken(s)
		if err != nil {
			if !errors.Is(err, tenancy.ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		if !tenancy.ValidTokenID(id) || !strings.HasPrefix(s, "xco_"+strings.TrimPrefix(id, "tok_")+"_") {
			t.Fatalf("%q parsed to id %q", s, id)
		}
	})
}

func FuzzParseDeviceToken(f *testing.F) {
	at := time.Unix(1_790_000_000, 0)
	f.Add(tenancy.FormatDeviceToken("dk_aaaaaaaaaaaaaaaa", "secret", "c", "d", at))
	f.Add(tenancy.FormatDeviceToken("", "secret", "c", "d", at))
	f.Add("a.b.c.d")
	f.Add(".")
	f.Add("dk_aaaaaaaaaaaaaaaa..1")
	f.Add("sig.-5")
	f.Add("sig.+5")
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := tenancy.ParseDeviceToken(s)
		if err != nil {
			if !errors.Is(err, tenancy.ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		if tok.TS <= 0 || len(tok.Sig) != 32 || (tok.KeyID != "" && !tenancy.ValidDeviceKeyID(tok.KeyID)) {
			t.Fatalf("%q parsed to %+v", s, tok)
		}
	})
}

func FuzzParseMQTTCredentials(f *testing.F) {
	f.Add(tenancy.FormatMQTTUsername("dk_aaaaaaaaaaaaaaaa"), tenancy.MQTTPassword("s", "GID_g@@@aa_bb@@@u", "x"), "GID_g@@@aa_bb@@@u")
	f.Add("eyJpcCI6IjEuMi4zLjQifQ==", "", "GID_test@@@aa_bb_cc_dd_ee_ff@@@uuid") // {"ip":"1.2.3.4"}
	f.Add("eyJraWQiOjF9", "AAAA", "@@@@@@")                                      // {"kid":1}
	f.Add("bnVsbA==", "====", "a@@@b@@@c@@@d")                                   // null
	f.Fuzz(func(t *testing.T, username, password, clientID string) {
		kid, err := tenancy.ParseMQTTUsername(username)
		if err == nil && kid != "" && !tenancy.ValidDeviceKeyID(kid) {
			t.Fatalf("username %q gave kid %q", username, kid)
		}
		if err == nil && kid != "" && tenancy.FormatMQTTUsername(kid) != username {
			// Other members are allowed, so only check the kid survives a round trip.
			if k2, err := tenancy.ParseMQTTUsername(tenancy.FormatMQTTUsername(kid)); err != nil || k2 != kid {
				t.Fatalf("kid %q does not round-trip", kid)
			}
		}
		if sig, err := tenancy.ParseMQTTPassword(password); err == nil && len(sig) != 32 {
			t.Fatalf("password %q gave a %d-byte HMAC", password, len(sig))
		}
		if d := tenancy.DeviceFromMQTTClientID(clientID); d != "" && !strings.Contains(clientID, "@@@"+d+"@@@") {
			t.Fatalf("client id %q gave device %q", clientID, d)
		}
	})
}

// FuzzAuthenticateDevice throws arbitrary credentials at a real DeviceAuth:
// it must never panic, and must refuse everything but the exact credentials
// it minted.
func FuzzAuthenticateDevice(f *testing.F) {
	ctx := context.Background()
	fx := newFixture(f, "acme")
	if _, err := fx.mgr.CreateTenant(ctx, tenancy.TenantSpec{ID: "acme"}); err != nil {
		f.Fatal(err)
	}
	if _, err := fx.mgr.CreateDeviceKey(ctx, "acme"); err != nil {
		f.Fatal(err)
	}
	good, _ := fx.devs.MintDeviceToken(ctx, "acme", "c1", "d1")
	user, pass, _ := fx.devs.MintMQTTCredentials(ctx, "acme", "GID_g@@@aa_bb@@@u")
	f.Add(false, good, "c1", "d1", "", "")
	f.Add(true, "", "GID_g@@@aa_bb@@@u", "", user, pass)
	f.Add(false, good[:len(good)-1], "c1", "d1", "", "")
	f.Add(true, "", "GID_g@@@aa_bb@@@v", "", user, pass)
	f.Fuzz(func(t *testing.T, mqtt bool, token, clientID, deviceID, username, password string) {
		c := deviceauth.Credentials{Transport: wire.TransportWebSocket, Token: token, ClientID: clientID, DeviceID: deviceID}
		if mqtt {
			c = deviceauth.Credentials{Transport: wire.TransportMQTT, ClientID: clientID, DeviceID: deviceID, Username: username, Password: password}
		}
		tenant, err := fx.devs.AuthenticateDevice(ctx, c)
		if err != nil {
			if !errors.Is(err, deviceauth.ErrUnauthenticated) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		minted := (!mqtt && clientID == "c1" && deviceID == "d1" && tokenSig(token) == tokenSig(good)) ||
			(mqtt && clientID == "GID_g@@@aa_bb@@@u" && bytes.Equal(mqttSig(password), mqttSig(pass)))
		if tenant != "acme" || !minted {
			t.Fatalf("accepted %+v as tenant %q", c, tenant)
		}
	})
}

func tokenSig(tok string) string {
	p, err := tenancy.ParseDeviceToken(tok)
	if err != nil {
		return "bad"
	}
	return string(p.Sig) + "|" + p.KeyID
}

func mqttSig(pw string) []byte {
	b, _ := tenancy.ParseMQTTPassword(pw)
	return b
}
