// Package deviceauth defines how a devicehub authenticates a device: the
// credentials a device presents on a transport and the Authenticator that
// maps them to a tenant. StaticTokens serves the dev tenant's fixed device
// token; the tenancy store implements per-tenant HMAC device keys.
package deviceauth

import (
	"context"
	"crypto/subtle"
	"errors"
)

// Credentials are what a device presents when it connects.
type Credentials struct {
	Transport  string // wire.TransportWebSocket or wire.TransportMQTT
	Token      string // WebSocket bearer token, without the "Bearer " prefix
	DeviceID   string // Device-Id as sent, e.g. aa:bb:cc:dd:ee:ff
	ClientID   string // Client-Id (WebSocket) or MQTT client id
	Username   string // MQTT username
	Password   string // MQTT password
	RemoteAddr string
}

// ErrUnauthenticated is returned for missing or wrong credentials; callers
// log the reason but never tell the device which part was wrong.
var ErrUnauthenticated = errors.New("device unauthenticated")

// Authenticator maps device credentials to the tenant they belong to.
type Authenticator interface {
	AuthenticateDevice(ctx context.Context, c Credentials) (tenant string, err error)
}

// StaticTokens accepts fixed bearer tokens, each bound to a tenant.
type StaticTokens map[string]string

// AuthenticateDevice checks c.Token against every entry in constant time.
func (s StaticTokens) AuthenticateDevice(_ context.Context, c Credentials) (string, error) {
	tenant := ""
	for tok, t := range s {
		if subtle.ConstantTimeCompare([]byte(tok), []byte(c.Token)) == 1 {
			tenant = t
		}
	}
	if tenant == "" || c.Token == "" {
		return "", ErrUnauthenticated
	}
	return tenant, nil
}
