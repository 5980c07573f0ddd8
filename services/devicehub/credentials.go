package devicehub

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
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

// StaticCredentials is one tenant's fixed device token, for development:
// it authenticates WebSocket devices presenting Token, MQTT devices whose
// password is base64(HMAC-SHA256(Token, client_id + "|" + username)), and
// mints exactly those. It is both the hub's Auth and the OTA's Credentials.
type StaticCredentials struct {
	Token  string
	Tenant string
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
	if subtle.ConstantTimeCompare([]byte(s.Token), []byte(c.Token)) != 1 {
		return "", fmt.Errorf("%w: bad token", deviceauth.ErrUnauthenticated)
	}
	return s.Tenant, nil
}

// MintDeviceToken returns Token.
func (s StaticCredentials) MintDeviceToken(_ context.Context, tenant, _, _ string) (string, error) {
	if tenant != s.Tenant {
		return "", fmt.Errorf("static credentials serve tenant %q only", s.Tenant)
	}
	return s.Token, nil
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
