package policy

import (
	"context"
	"errors"

	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
)

// GroupMembers returns the ids of the nodes in a tenant's group, from the
// same compiled policy that decides "group:<name>" rules, so a scope by
// group (the gateway's /mcp/groups/{group}) and a rule on that group always
// agree. ok is false for a group (or tenant) that does not exist. The map
// is shared: callers must not modify it.
func (e *Engine) GroupMembers(ctx context.Context, tenant, group string) (members map[string]bool, ok bool, err error) {
	tp, err := e.policyFor(ctx, tenant)
	if errors.Is(err, tenancy.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	members, ok = tp.groups[group]
	return members, ok, nil
}
