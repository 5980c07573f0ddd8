package tenancy

import (
	"context"
	"errors"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
)

// OperatorChain tries operator authenticators in order; the first that
// accepts the token wins. It lets the dev tenant's static token
// (access.StaticTokens) and the store's tokens work side by side.
type OperatorChain []access.Authenticator

// AuthenticateOperator returns the first principal any member accepts. If
// none does and a member failed for another reason than a bad credential
// (its store is down), that error is returned so the caller can answer
// "unavailable" rather than "unauthorized".
func (c OperatorChain) AuthenticateOperator(ctx context.Context, token string) (access.Principal, error) {
	var failure error
	for _, a := range c {
		p, err := a.AuthenticateOperator(ctx, token)
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, access.ErrUnauthenticated) && failure == nil {
			failure = err
		}
	}
	if failure != nil {
		return access.Principal{}, failure
	}
	return access.Principal{}, access.ErrUnauthenticated
}

// DeviceChain tries device authenticators in order, with the same rules as
// OperatorChain: e.g. deviceauth.StaticTokens for the dev tenant's
// --device-token, then DeviceAuth for HMAC-signed credentials.
type DeviceChain []deviceauth.Authenticator

// AuthenticateDevice returns the tenant of the first member that accepts c.
func (c DeviceChain) AuthenticateDevice(ctx context.Context, cr deviceauth.Credentials) (string, error) {
	var failure, reason error
	for _, a := range c {
		t, err := a.AuthenticateDevice(ctx, cr)
		if err == nil {
			return t, nil
		}
		switch {
		case !errors.Is(err, deviceauth.ErrUnauthenticated):
			if failure == nil {
				failure = err
			}
		case reason == nil || reason == deviceauth.ErrUnauthenticated:
			// Keep the first reason that says more than the bare error.
			reason = err
		}
	}
	if failure != nil {
		return "", failure
	}
	if reason != nil {
		return "", reason
	}
	return "", deviceauth.ErrUnauthenticated
}
