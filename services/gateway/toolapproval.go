package gateway

import (
	"context"
	"slices"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
)

// toolApprovalPolicy is implemented by an Authorizer that knows which
// tenants require an admin's approval of the tools a node gains
// (policy.Engine).
type toolApprovalPolicy interface {
	RequiresToolApproval(ctx context.Context, tenant string) bool
}

// approvalGate refuses a tool its node gained after its first catalog and
// no admin approved yet (NodeRecord.PendingTools), when the tenant requires
// approval; everything else goes to the policy. Since node.list and
// node.describe show only the tools the caller may call, such a tool is
// hidden as well as refused.
type approvalGate struct {
	next    access.Authorizer
	tenants toolApprovalPolicy
	s       *Service // its registry is opened before the first connection is served
}

func (g approvalGate) Authorize(ctx context.Context, r access.Request) access.Decision {
	if r.Tool != "" && g.s.reg != nil {
		if n := g.s.reg.Get(r.Principal.Tenant, r.NodeID); n != nil && slices.Contains(n.PendingTools, r.Tool) &&
			g.tenants.RequiresToolApproval(ctx, r.Principal.Tenant) {
			return access.Decision{Reason: "tool " + r.Tool + " awaits an admin's approval (xiaoclaw node approve-tools " + r.NodeID + ")"}
		}
	}
	return g.next.Authorize(ctx, r)
}
