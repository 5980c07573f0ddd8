package tenancy

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"strings"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
)

// UpstreamCallerPrefix starts an upstream's caller token:
// xcu_<tenant>_<upstream name>_<secret>, <secret> being 52 characters of
// base32 (256 random bits). The shim presents it to xiaoclaw's gateway for
// the calls an upstream OpenClaw gateway sends; its principal is
// "upstream:<name>" of the tenant, with the operator role.
const UpstreamCallerPrefix = "xcu_"

// upstreamPrincipalPrefix is policy.UpstreamPrefix (pkg/policy imports
// this package).
const upstreamPrincipalPrefix = "upstream:"

// upstreamCallerName is the Name of a caller token's principal. It tells
// Recheck the principal is one of the store's upstreams, not a static
// principal of the same id (the dev tenant's upstream).
func upstreamCallerName(name string) string { return "caller token of upstream " + name }

func newUpstreamCallerToken(tenant, name string) string {
	return UpstreamCallerPrefix + tenant + "_" + name + "_" + randomB32(32)
}

// ParseUpstreamCallerToken returns the tenant and upstream name of a caller
// token. It checks the form only, not the secret. Tenant ids hold no '_'
// and the secret has a fixed length, so the name is what lies between.
func ParseUpstreamCallerToken(token string) (tenant, name string, err error) {
	bad := fmt.Errorf("%w: upstream caller token is not %s<tenant>_<name>_<secret>", ErrInvalid, UpstreamCallerPrefix)
	rest, ok := strings.CutPrefix(token, UpstreamCallerPrefix)
	if !ok || len(rest) < secretChars+1 {
		return "", "", bad
	}
	head, secret := rest[:len(rest)-secretChars-1], rest[len(rest)-secretChars-1:]
	if secret[0] != '_' || !isB32(secret[1:], secretChars) {
		return "", "", bad
	}
	tenant, name, ok = strings.Cut(head, "_")
	if !ok || tenant == "" || !ValidUpstreamName(name) {
		return "", "", bad
	}
	return tenant, name, nil
}

// authenticateUpstream resolves an upstream caller token to the principal
// "upstream:<name>" of its tenant.
func (a *OperatorAuth) authenticateUpstream(ctx context.Context, token string) (access.Principal, error) {
	tenant, name, err := ParseUpstreamCallerToken(token)
	if err != nil {
		return access.Principal{}, access.ErrUnauthenticated
	}
	u, err := a.store.Upstream(ctx, tenant, name)
	found := err == nil
	if err != nil && !errors.Is(err, ErrNotFound) {
		return access.Principal{}, fmt.Errorf("tenancy: upstream lookup: %w", err)
	}
	sum := hashToken(token)
	if !found || subtle.ConstantTimeCompare([]byte(sum), []byte(u.CallerHash)) != 1 {
		return access.Principal{}, access.ErrUnauthenticated
	}
	if err := a.tenantActive(ctx, tenant); err != nil {
		return access.Principal{}, err
	}
	return access.Principal{Tenant: tenant, ID: upstreamPrincipalPrefix + name, Name: upstreamCallerName(name), Role: access.RoleOperator}, nil
}

// recheckUpstream fails once the upstream of an "upstream:<name>"
// principal is removed.
func (a *OperatorAuth) recheckUpstream(ctx context.Context, p access.Principal, name string) error {
	_, err := a.store.Upstream(ctx, p.Tenant, name)
	switch {
	case errors.Is(err, ErrNotFound):
		return access.ErrUnauthenticated
	case err != nil:
		return fmt.Errorf("tenancy: upstream lookup: %w", err)
	}
	return nil
}
