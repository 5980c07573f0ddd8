package policy

import (
	"context"
	"errors"

	"github.com/casbin/casbin/v2/model"
	"github.com/casbin/casbin/v2/persist"

	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
)

// storeAdapter is a read-only Casbin persist.Adapter over one tenant of a
// tenancy.Store: one policy line "p, sub, obj, act, eft, id, cond" per rule,
// in the order the rules were added. It also keeps the tenant's node groups
// for xcObj: Casbin's role manager would hold them too, but costs tens of
// kilobytes per tenant for a hundred nodes and memoises every lookup
// without bound, where a map of sets is small and fast. Rules are written
// through tenancy.Manager, which validates them and notifies every
// replica, so the write methods refuse.
type storeAdapter struct {
	ctx    context.Context // of the one load this adapter serves
	store  tenancy.Store
	tenant string
	// Filled by LoadPolicy.
	rules  map[string]tenancy.Rule
	groups map[string]map[string]bool
}

var _ persist.Adapter = (*storeAdapter)(nil)

var errReadOnly = errors.New("policy: rules are written through tenancy.Manager, not the Casbin adapter")

// LoadPolicy loads the tenant's rules and groups into m.
func (a *storeAdapter) LoadPolicy(m model.Model) error {
	rules, err := a.store.Rules(a.ctx, a.tenant)
	if err != nil {
		return err
	}
	a.rules = make(map[string]tenancy.Rule, len(rules))
	for _, r := range rules {
		a.rules[r.ID] = r
		if err := m.AddPolicy("p", "p", []string{r.Subject, r.Object, r.Action, r.Effect, r.ID, r.When}); err != nil {
			return err
		}
	}
	groups, err := a.store.Groups(a.ctx, a.tenant)
	if err != nil {
		return err
	}
	a.groups = make(map[string]map[string]bool, len(groups))
	for g, nodes := range groups {
		set := make(map[string]bool, len(nodes))
		for _, n := range nodes {
			set[n] = true
		}
		a.groups[g] = set
	}
	return nil
}

// SavePolicy refuses: see storeAdapter.
func (a *storeAdapter) SavePolicy(model.Model) error { return errReadOnly }

// AddPolicy refuses: see storeAdapter.
func (a *storeAdapter) AddPolicy(string, string, []string) error { return errReadOnly }

// RemovePolicy refuses: see storeAdapter.
func (a *storeAdapter) RemovePolicy(string, string, []string) error { return errReadOnly }

// RemoveFilteredPolicy refuses: see storeAdapter.
func (a *storeAdapter) RemoveFilteredPolicy(string, string, int, ...string) error { return errReadOnly }
