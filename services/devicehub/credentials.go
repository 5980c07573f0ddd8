package devicehub

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// CredentialMinter mints the device credentials the OTA endpoint hands
// out. *tenancy.DeviceAuth implements it with the tenant's HMAC device
// keys; StaticCredentials with one fixed token (xiaoclaw dev).
type CredentialMinter interface {
	// MintDeviceToken returns the WebSocket bearer token for the Client-Id
	// and Device-Id headers the device will send.
	MintDeviceToken(ctx context.Context, tenant, clientID, deviceID string) (string, error)
	// MintMQTTCredentials returns the MQTT username and password for the
	// MQTT client id.
	MintMQTTCredentials(ctx context.Context, tenant, clientID string) (username, password string, err error)
}

// StaticCredentials is one tenant's fixed device token, for development
// and single-tenant installs without a tenancy database. It is both the
// hub's Auth and the OTA's Credentials. It authenticates:
//   - WebSocket devices presenting Token itself, as any device id: a
//     development convenience for `xiaoclaw sim` and scripts;
//   - WebSocket devices presenting a token minted by MintDeviceToken, which
//     is bound to the Client-Id and Device-Id it was minted for (the
//     tenancy token form "<sig>.<ts>", keyed with Token, valid TokenTTL);
//   - MQTT devices whose password is base64(HMAC-SHA256(Token, client_id +
//     "|" + username)), bound to the client id and so to the device.
//
// The OTA endpoint hands out only the bound forms, never Token.
type StaticCredentials struct {
	Token  string
	Tenant string
	// TokenTTL is how long a minted WebSocket token verifies; 0 means 30
	// days (as the tenancy device keys).
	TokenTTL time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// staticTokenSkew is how far in the future a minted token's time may lie.
const staticTokenSkew = 5 * time.Minute

func (s StaticCredentials) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s StaticCredentials) ttl() time.Duration {
	if s.TokenTTL > 0 {
		return s.TokenTTL
	}
	return 30 * 24 * time.Hour
}

var (
	_ deviceauth.Authenticator = StaticCredentials{}
	_ CredentialMinter         = StaticCredentials{}
)

// staticMQTTUsername is base64 of {"kid":"static"}: the username shape of
// the tenancy keys, naming no real key.
const staticMQTTUsername = "eyJraWQiOiJzdGF0aWMifQ=="

// AuthenticateDevice checks the token (WebSocket) or the HMAC password
// (MQTT) in constant time.
func (s StaticCredentials) AuthenticateDevice(_ context.Context, c deviceauth.Credentials) (string, error) {
	if s.Token == "" {
		return "", deviceauth.ErrUnauthenticated
	}
	if c.Transport == wire.TransportMQTT {
		want := s.mqttPassword(c.ClientID, c.Username)
		if c.Password == "" || subtle.ConstantTimeCompare([]byte(want), []byte(c.Password)) != 1 {
			return "", fmt.Errorf("%w: bad MQTT password", deviceauth.ErrUnauthenticated)
		}
		return s.Tenant, nil
	}
	if subtle.ConstantTimeCompare([]byte(s.Token), []byte(c.Token)) == 1 {
		return s.Tenant, nil
	}
	tok, err := tenancy.ParseDeviceToken(c.Token)
	if err != nil || tok.KeyID != "" {
		return "", fmt.Errorf("%w: bad token", deviceauth.ErrUnauthenticated)
	}
	minted, now := time.Unix(tok.TS, 0), s.now()
	if minted.After(now.Add(staticTokenSkew)) || !now.Before(minted.Add(s.ttl())) {
		return "", fmt.Errorf("%w: device token expired or from the future", deviceauth.ErrUnauthenticated)
	}
	// The token carries the HMAC of the headers it was minted for: it
	// verifies only for that Client-Id and Device-Id.
	want, err := tenancy.ParseDeviceToken(tenancy.FormatDeviceToken("", s.Token, c.ClientID, c.DeviceID, minted))
	if err != nil || !hmac.Equal(want.Sig, tok.Sig) {
		return "", fmt.Errorf("%w: bad token", deviceauth.ErrUnauthenticated)
	}
	return s.Tenant, nil
}

// MintDeviceToken returns a token bound to the Client-Id and Device-Id
// the device will send (never Token itself).
func (s StaticCredentials) MintDeviceToken(_ context.Context, tenant, clientID, deviceID string) (string, error) {
	if tenant != s.Tenant {
		return "", fmt.Errorf("static credentials serve tenant %q only", s.Tenant)
	}
	if clientID == "" || deviceID == "" {
		return "", errors.New("client id and device id required")
	}
	return tenancy.FormatDeviceToken("", s.Token, clientID, deviceID, s.now()), nil
}

// MintMQTTCredentials returns a fixed username and the client id's HMAC
// password.
func (s StaticCredentials) MintMQTTCredentials(_ context.Context, tenant, clientID string) (string, string, error) {
	if tenant != s.Tenant {
		return "", "", fmt.Errorf("static credentials serve tenant %q only", s.Tenant)
	}
	if clientID == "" {
		return "", "", errors.New("client id required")
	}
	return staticMQTTUsername, s.mqttPassword(clientID, staticMQTTUsername), nil
}

func (s StaticCredentials) mqttPassword(clientID, username string) string {
	m := hmac.New(sha256.New, []byte(s.Token))
	m.Write([]byte(clientID + "|" + username))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}
