package devstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/activation"
	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/adminapi"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/backend"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// Tenancy is the gateway backend the replicas share (the stores, the
// operator authenticator with the dev tenant's static tokens first, the
// policy engine, the admin and audit APIs) with the devices' side of it: the
// dev tenant's static device token, then the store's keys.
type Tenancy struct {
	*backend.Backend
	DeviceAuth deviceauth.Authenticator // static dev token, then the store
	// DeviceMinter mints the credentials OTA hands out: from the static dev
	// token for the dev tenant, from the tenant's device keys otherwise.
	DeviceMinter devicehub.CredentialMinter
}

// openTenancy opens the backend (Postgres when cfg.DatabaseURL is set, else
// SQLite in cfg.DataDir) and seeds the dev tenant.
func openTenancy(ctx context.Context, cfg Config, upstreamToken string, nc *nats.Conn, acts activation.Store, log *slog.Logger) (*Tenancy, error) {
	static := access.StaticTokens{cfg.OperatorToken: devOperator}
	if upstreamToken != "" {
		static[upstreamToken] = access.Principal{Tenant: DevTenant, ID: upstream.Principal(cfg.Upstream.Name),
			Name: "upstream " + cfg.Upstream.Name, Role: access.RoleOperator}
	}
	devCreds := devicehub.StaticCredentials{Token: cfg.DeviceToken, Tenant: DevTenant}
	be, err := backend.Open(ctx, backend.Config{DatabaseURL: cfg.DatabaseURL, SQLiteDir: cfg.DataDir, Static: static,
		AdminToken: cfg.AdminToken, Activations: acts, Log: log,
		DeviceTokens: func(keys *tenancy.DeviceAuth) adminapi.DeviceTokenMinter {
			return minterByTenant{dev: devCreds, other: keys}
		}}, nc)
	if err != nil {
		return nil, err
	}
	t := &Tenancy{Backend: be, DeviceAuth: tenancy.DeviceChain{devCreds, be.Devices},
		DeviceMinter: minterByTenant{dev: devCreds, other: be.Devices}}
	if _, err := be.Manager.CreateTenant(ctx, tenancy.TenantSpec{ID: DevTenant, DisplayName: "development"}); err != nil &&
		!errors.Is(err, tenancy.ErrConflict) {
		be.Close()
		return nil, fmt.Errorf("seed tenant %q: %w", DevTenant, err)
	}
	return t, nil
}

// minterByTenant mints the dev tenant's credentials from its static token
// and every other tenant's from its device keys.
type minterByTenant struct {
	dev   devicehub.StaticCredentials
	other devicehub.CredentialMinter
}

func (m minterByTenant) pick(tenant string) devicehub.CredentialMinter {
	if tenant == m.dev.Tenant {
		return m.dev
	}
	return m.other
}

func (m minterByTenant) MintDeviceToken(ctx context.Context, tenant, clientID, deviceID string) (string, error) {
	return m.pick(tenant).MintDeviceToken(ctx, tenant, clientID, deviceID)
}

func (m minterByTenant) MintMQTTCredentials(ctx context.Context, tenant, clientID string) (string, string, error) {
	return m.pick(tenant).MintMQTTCredentials(ctx, tenant, clientID)
}

// DefaultUpstreamName names the dev tenant's upstream when none is given;
// its calls are the principal "upstream:openclaw".
const DefaultUpstreamName = "openclaw"

// randomSecret returns 128 random bits, hex-encoded.
func randomSecret() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// devOperator is the principal of the dev tenant's static operator token:
// an admin of the tenant, which may do everything until a deny rule says
// otherwise.
var devOperator = access.Principal{Tenant: DevTenant, ID: "dev-operator", Name: "dev operator", Role: access.RoleAdmin}
