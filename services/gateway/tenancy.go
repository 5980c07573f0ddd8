package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/protocol"
)

// InflightLimiter tells a tenant's in-flight limits (tenancy.OperatorAuth);
// the gateway sends them to the shim with each node.invoke of a device.
type InflightLimiter interface {
	InflightLimits(ctx context.Context, tenant string) (wire.InflightLimits, error)
}

// TenancyChanged re-checks the live connections of the changed tenant when
// a token, an upstream (its caller token), the tenant itself or anything of
// it (resync) changed: each
// connection's token is authenticated again, and a connection whose token
// no longer holds (revoked, expired, tenant suspended) is closed with 4001
// "gateway auth changed". Policy changes need nothing here: the policy is
// asked on every call. It does not block; register it with the tenancy
// watcher after the authenticator's cache (tenancy.ChangeFunc).
func (s *Service) TenancyChanged(c wire.TenancyChange) {
	switch c.Kind {
	case wire.ChangeToken, wire.ChangeUpstream, wire.ChangeTenant, wire.ChangeResync:
	default:
		return
	}
	var affected []*conn
	s.mu.RLock()
	for cn := range s.conns {
		if cn.helloDone.Load() && cn.principal.Tenant == c.Tenant {
			affected = append(affected, cn)
		}
	}
	s.mu.RUnlock()
	if len(affected) == 0 {
		return
	}
	go func() {
		for _, cn := range affected {
			ctx, cancel := context.WithTimeout(s.runCtx, 10*time.Second)
			_, err := s.cfg.Auth.AuthenticateOperator(ctx, cn.token)
			cancel()
			switch {
			case errors.Is(err, access.ErrUnauthenticated):
				s.log.Info("closing connection: credential no longer valid", "conn", cn.id, "tenant", c.Tenant, "principal", cn.principal.ID)
				cn.closeWith(protocol.CloseAuthChanged, protocol.ReasonAuthChanged)
			case err != nil:
				// The store cannot be asked: keep the connection, the next
				// change or resync checks it again.
				s.log.Warn("re-check of a live connection failed", "conn", cn.id, "err", err)
			}
		}
	}()
}
