// Package policy decides, per tenant, which principal may run which command
// or tool on which node. Rules are Casbin policies (RBAC with domains, the
// tenant being the domain; allow and deny effects, deny wins) with optional
// argument predicates on tool calls. Engine implements access.Authorizer.
//
// Each tenant gets its own Casbin enforcer, built from the store through a
// persist.Adapter, so a decision only ever looks at its tenant's rules. The
// tenant's rules are also indexed by action and subject: a first-time
// question hands Casbin only the few rules that can match it (see
// candidates), so its cost does not grow with the tenant's rule count. On
// top sits a decision cache keyed by (subject, role, node, action), so a
// repeated question costs a map lookup plus the evaluation of any argument
// predicates that could apply. A change notification (wire.ChangeRule,
// ChangeGroup, ChangeTenant, ChangeResync) drops the tenant's enforcer and
// cache; the next decision rebuilds them. docs/policy.md is the user guide.
package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/casbin/casbin/v2"
	"github.com/casbin/casbin/v2/model"
	"golang.org/x/sync/singleflight"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// modelText is the Casbin model: role-based, one enforcer per tenant (the
// domain). A request is (principal id, "role:<role>", node id, action,
// evaluation context); a policy line is (subject, object, action, effect,
// rule id, predicate). Deny wins over allow. xcObj matches a node against
// a node id glob or a "group:<name>" of the tenant; xcWhen hands rules with
// argument predicates to the engine (see evalCtx).
const modelText = `
[request_definition]
r = sub, role, obj, act, ctx

[policy_definition]
p = sub, obj, act, eft, id, cond

[policy_effect]
e = some(where (p.eft == allow)) && !some(where (p.eft == deny))

[matchers]
m = (p.sub == "*" || p.sub == r.sub || p.sub == r.role) && xcGlob(p.act, r.act) && xcObj(p.obj, r.obj, r.ctx) && xcWhen(p.id, r.ctx)
`

// Config configures an Engine.
type Config struct {
	Store tenancy.Store
	// CacheEntries bounds each tenant's decision cache; 0 means 10,000.
	CacheEntries int
	Log          *slog.Logger
}

// Engine is the policy decision point. It implements access.Authorizer and
// tenancy.ChangeHandler.
type Engine struct {
	store    tenancy.Store
	log      *slog.Logger
	maxCache int
	model    model.Model

	scratch *scratchEnforcers

	mu      sync.RWMutex
	tenants map[string]*tenantPolicy
	gens    map[string]uint64 // bumped per change; a load that raced one is not kept
	sf      singleflight.Group
}

var _ access.Authorizer = (*Engine)(nil)

// New returns an Engine reading rules from cfg.Store.
func New(cfg Config) (*Engine, error) {
	if cfg.Store == nil || cfg.Log == nil {
		return nil, errors.New("policy: a store and a logger are required")
	}
	if cfg.CacheEntries <= 0 {
		cfg.CacheEntries = 10_000
	}
	m, err := model.NewModelFromString(modelText)
	if err != nil {
		return nil, fmt.Errorf("policy: model: %w", err)
	}
	return &Engine{store: cfg.Store, log: cfg.Log, maxCache: cfg.CacheEntries, model: m,
		scratch: newScratchEnforcers(m), tenants: map[string]*tenantPolicy{}, gens: map[string]uint64{}}, nil
}

// tenantPolicy is one tenant's compiled policy; immutable once built
// except for its decision cache.
type tenantPolicy struct {
	tenant   tenancy.Tenant
	enforcer *casbin.Enforcer
	rules    map[string]*compiledRule
	groups   map[string]map[string]bool
	index    ruleIndex
	scratch  *scratchEnforcers
	maxCache int

	cacheMu sync.RWMutex
	cache   map[cacheKey]*verdict
	bySet   map[string]*verdict // candidate rule set (see evaluate) -> Casbin's verdict
}

type compiledRule struct {
	tenancy.Rule
	pred *Predicate
}

type cacheKey struct{ sub, role, node, act string }

// verdict is what Casbin says for one (subject, role, node, action),
// before argument predicates: the decision of the rules without predicates,
// and the rules with predicates that match and must be evaluated per call.
type verdict struct {
	uncond     *compiledRule // deciding rule without a predicate, or nil
	denyPreds  []*compiledRule
	allowPreds []*compiledRule
}

// evalCtx is passed to Casbin as the last request value; xcWhen uses it
// to collect rules with predicates instead of evaluating them (the
// verdict is then cacheable), or, for Explain, to collect every match.
type evalCtx struct {
	rules    map[string]*compiledRule
	groups   map[string]map[string]bool // group name -> node ids
	traceAll bool
	matched  []*compiledRule
}

// Explanation says how a request was decided.
type Explanation struct {
	access.Decision
	// Default is true when no rule applied and the tenant's default decided.
	Default bool `json:"default"`
	// Matched lists every rule whose subject, object and action match, in
	// rule order, with the outcome of its predicate.
	Matched []MatchedRule `json:"matched"`
}

// MatchedRule is one rule in an Explanation.
type MatchedRule struct {
	tenancy.Rule
	// Applies is false only for a rule whose predicate is false for the
	// given arguments.
	Applies bool `json:"applies"`
}

// Authorize decides r. It fails closed: a store failure or an unknown or
// suspended tenant denies, with the reason.
func (e *Engine) Authorize(ctx context.Context, r access.Request) access.Decision {
	tp, d, ok := e.usable(ctx, r.Principal.Tenant)
	if !ok {
		return d
	}
	key := cacheKey{sub: r.Principal.ID, role: r.Principal.Role, node: r.NodeID, act: Action(r.Command, r.Tool)}
	v, err := tp.verdictFor(key)
	if err != nil {
		e.log.Error("policy evaluation failed", "tenant", tp.tenant.ID, "err", err)
		return access.Decision{Reason: "policy evaluation failed"}
	}
	var args Args
	decoded := false
	argsFn := func() Args {
		if !decoded {
			args, decoded = DecodeArgs(r.Args), true
		}
		return args
	}
	return tp.decide(v, argsFn)
}

// RequiresToolApproval reports whether the tenant hides and refuses the
// tools its nodes gain until an admin approves them. It fails closed: a
// tenant whose settings cannot be read requires approval.
func (e *Engine) RequiresToolApproval(ctx context.Context, tenant string) bool {
	tp, err := e.policyFor(ctx, tenant)
	return err != nil || tp.tenant.RequireToolApproval
}

// usable returns the tenant's policy, or the decision to return when there
// is none to use.
func (e *Engine) usable(ctx context.Context, tenant string) (*tenantPolicy, access.Decision, bool) {
	tp, err := e.policyFor(ctx, tenant)
	switch {
	case errors.Is(err, tenancy.ErrNotFound):
		return nil, access.Decision{Reason: "unknown tenant"}, false
	case err != nil:
		e.log.Error("policy unavailable", "tenant", tenant, "err", err)
		return nil, access.Decision{Reason: "policy unavailable"}, false
	case tp.tenant.Status != tenancy.StatusActive:
		return nil, access.Decision{Reason: "tenant suspended"}, false
	}
	return tp, access.Decision{}, true
}

// decide applies deny-wins to a verdict: a deny rule without a predicate,
// then deny rules whose predicate holds, then an allow rule without a
// predicate, then allow rules whose predicate holds, then the tenant's
// default.
func (tp *tenantPolicy) decide(v *verdict, args func() Args) access.Decision {
	if v.uncond != nil && v.uncond.Effect == tenancy.EffectDeny {
		return ruleDecision(v.uncond)
	}
	for _, r := range v.denyPreds {
		if r.pred.Eval(args()) {
			return ruleDecision(r)
		}
	}
	if v.uncond != nil {
		return ruleDecision(v.uncond)
	}
	for _, r := range v.allowPreds {
		if r.pred.Eval(args()) {
			return ruleDecision(r)
		}
	}
	return access.Decision{Allowed: tp.tenant.DefaultEffect == tenancy.EffectAllow,
		Reason: "no rule matched; tenant default is " + tp.tenant.DefaultEffect}
}

func ruleDecision(r *compiledRule) access.Decision {
	verb := "allowed"
	if r.Effect == tenancy.EffectDeny {
		verb = "denied"
	}
	reason := fmt.Sprintf("%s by rule %s (%s %s %s %s", verb, r.ID, r.Effect, r.Subject, r.Object, r.Action)
	if r.When != "" {
		reason += " when " + r.When
	}
	return access.Decision{Allowed: r.Effect == tenancy.EffectAllow, RuleID: r.ID, Reason: reason + ")"}
}

// verdictFor answers from the cache or asks Casbin.
func (tp *tenantPolicy) verdictFor(k cacheKey) (*verdict, error) {
	tp.cacheMu.RLock()
	v, ok := tp.cache[k]
	tp.cacheMu.RUnlock()
	if ok {
		return v, nil
	}
	v, err := tp.evaluate(k)
	if err != nil {
		return nil, err
	}
	tp.cacheMu.Lock()
	if len(tp.cache) >= tp.maxCache {
		clear(tp.cache) // bounded; refills with what is asked now
	}
	tp.cache[k] = v
	tp.cacheMu.Unlock()
	return v, nil
}

// enforce asks the tenant's enforcer, which holds all of its rules.
func (tp *tenantPolicy) enforce(k cacheKey, ec *evalCtx) (*compiledRule, error) {
	ok, explain, err := tp.enforcer.EnforceEx(k.sub, RolePrefix+k.role, k.node, k.act, ec)
	return tp.deciding(ok, explain, err)
}

// deciding turns Casbin's answer into the rule that decided, or nil when
// no rule without a predicate matched.
func (tp *tenantPolicy) deciding(ok bool, explain []string, err error) (*compiledRule, error) {
	if err != nil {
		return nil, err
	}
	if len(explain) < 5 {
		if ok {
			return nil, errors.New("casbin allowed without naming a rule")
		}
		return nil, nil // no rule without a predicate matched
	}
	return tp.rules[explain[4]], nil
}

// noRuleMatches is the verdict when no rule can match: the default decides.
var noRuleMatches = &verdict{}

// evaluate asks Casbin about the rules that can match k only, through a
// scratch enforcer. The candidates match k's subject, object and action,
// so Casbin's verdict depends on which rules they are and nothing else: it
// is kept per candidate set, and a new question whose candidates were seen
// before costs no Casbin call.
func (tp *tenantPolicy) evaluate(k cacheKey) (*verdict, error) {
	var buf [64]byte
	lines, set := tp.index.candidates(k, buf[:0])
	if len(lines) == 0 {
		return noRuleMatches, nil
	}
	tp.cacheMu.RLock()
	v, ok := tp.bySet[string(set)]
	tp.cacheMu.RUnlock()
	if ok {
		return v, nil
	}
	ec := &evalCtx{rules: tp.rules, groups: tp.groups}
	uncond, err := tp.deciding(tp.scratch.enforce(lines, k.sub, RolePrefix+k.role, k.node, k.act, ec))
	if err != nil {
		return nil, err
	}
	v = &verdict{uncond: uncond}
	for _, r := range ec.matched {
		if r.Effect == tenancy.EffectDeny {
			v.denyPreds = append(v.denyPreds, r)
		} else {
			v.allowPreds = append(v.allowPreds, r)
		}
	}
	tp.cacheMu.Lock()
	if len(tp.bySet) >= tp.maxCache {
		clear(tp.bySet)
	}
	tp.bySet[string(set)] = v
	tp.cacheMu.Unlock()
	return v, nil
}

// Explain decides like Authorize, without the cache, and lists every rule
// whose subject, object and action match. role may be empty when the
// subject is a role or "*".
func (e *Engine) Explain(ctx context.Context, tenant string, p access.Principal, node, action string, rawArgs []byte) (Explanation, error) {
	tp, d, ok := e.usable(ctx, tenant)
	if !ok {
		if d.Reason == "policy unavailable" {
			return Explanation{}, errors.New("policy unavailable")
		}
		return Explanation{Decision: d}, nil
	}
	if a, err := canonicalAction(action); err == nil && a != ToolActionPrefix+"*" {
		action = a // the v1 spelling of a tool call
	}
	k := cacheKey{sub: p.ID, role: p.Role, node: node, act: action}
	v, err := tp.evaluate(k)
	if err != nil {
		return Explanation{}, err
	}
	args := DecodeArgs(rawArgs)
	ex := Explanation{Decision: tp.decide(v, func() Args { return args }), Matched: []MatchedRule{}}
	ex.Default = ex.RuleID == ""
	// A second pass collects every match (Casbin stops at the first deny),
	// over all of the tenant's rules.
	all := &evalCtx{rules: tp.rules, groups: tp.groups, traceAll: true}
	if _, err := tp.enforce(k, all); err != nil {
		return Explanation{}, err
	}
	for _, r := range all.matched {
		ex.Matched = append(ex.Matched, MatchedRule{Rule: r.Rule, Applies: r.pred.Eval(args)})
	}
	return ex, nil
}

// policyFor returns the tenant's compiled policy, building it on first use
// (one build per tenant however many callers wait for it).
func (e *Engine) policyFor(ctx context.Context, tenant string) (*tenantPolicy, error) {
	e.mu.RLock()
	tp, ok := e.tenants[tenant]
	gen := e.gens[tenant]
	e.mu.RUnlock()
	if ok {
		return tp, nil
	}
	if err := wire.ValidTenant(tenant); err != nil {
		return nil, tenancy.ErrNotFound
	}
	ch := e.sf.DoChan(tenant, func() (any, error) {
		e.mu.RLock()
		tp, ok := e.tenants[tenant]
		e.mu.RUnlock()
		if ok {
			return tp, nil
		}
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		tp, err := e.build(lctx, tenant)
		if err != nil {
			return nil, err
		}
		e.mu.Lock()
		if e.gens[tenant] == gen {
			e.tenants[tenant] = tp
		}
		e.mu.Unlock()
		return tp, nil
	})
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*tenantPolicy), nil
	}
}

// build loads a tenant's rules and groups through the Casbin adapter.
func (e *Engine) build(ctx context.Context, tenant string) (*tenantPolicy, error) {
	t, err := e.store.Tenant(ctx, tenant)
	if err != nil {
		return nil, err
	}
	ad := &storeAdapter{ctx: ctx, store: e.store, tenant: tenant}
	enf, err := casbin.NewEnforcer(e.model.Copy(), ad)
	if err != nil {
		return nil, fmt.Errorf("policy: load tenant %s: %w", tenant, err)
	}
	enf.EnableAutoSave(false)
	addFunctions(enf)
	lines, err := enf.GetPolicy()
	if err != nil {
		return nil, err
	}
	tp := &tenantPolicy{tenant: t, enforcer: enf, rules: make(map[string]*compiledRule, len(lines)),
		groups: ad.groups, index: newRuleIndex(lines, ad.groups), scratch: e.scratch, maxCache: e.maxCache,
		cache: map[cacheKey]*verdict{}, bySet: map[string]*verdict{}}
	for _, l := range lines {
		r := &compiledRule{Rule: ad.rules[l[4]]}
		if r.pred, err = ParseWhen(r.When); err != nil {
			// CheckRule accepted it when it was added; refuse to guess now.
			return nil, fmt.Errorf("policy: rule %s: %w", r.ID, err)
		}
		tp.rules[r.ID] = r
	}
	return tp, nil
}

// addFunctions registers the model's matcher functions with enf.
func addFunctions(enf *casbin.Enforcer) {
	enf.AddFunction("xcGlob", func(args ...any) (any, error) {
		return globMatch(args[0].(string), args[1].(string)), nil
	})
	enf.AddFunction("xcObj", xcObj)
	enf.AddFunction("xcWhen", xcWhen)
}

// xcObj(pattern, node, ctx): the node matches a node id glob, or belongs
// to the tenant's group for a "group:<name>" pattern.
func xcObj(args ...any) (any, error) {
	pattern, _ := args[0].(string)
	node, _ := args[1].(string)
	if g, ok := strings.CutPrefix(pattern, GroupPrefix); ok {
		ec, ok := args[2].(*evalCtx)
		if !ok {
			return false, errors.New("xcObj: no evaluation context")
		}
		return ec.groups[g][node], nil
	}
	return globMatch(pattern, node), nil
}

// xcWhen(ruleID, ctx): true for a rule without a predicate, so Casbin
// decides those; a rule with a predicate is recorded and reported as no
// match. In trace mode every rule is recorded and none matches.
func xcWhen(args ...any) (any, error) {
	id, _ := args[0].(string)
	ec, ok := args[1].(*evalCtx)
	if !ok {
		return false, errors.New("xcWhen: no evaluation context")
	}
	r := ec.rules[id]
	if r == nil {
		return false, fmt.Errorf("xcWhen: unknown rule %s", id)
	}
	if ec.traceAll || r.pred != nil {
		ec.matched = append(ec.matched, r)
		return false, nil
	}
	return true, nil
}

// TenancyChanged drops the tenant's compiled policy when its rules, groups
// or settings may have changed.
func (e *Engine) TenancyChanged(c wire.TenancyChange) {
	switch c.Kind {
	case wire.ChangeRule, wire.ChangeGroup, wire.ChangeTenant, wire.ChangeResync:
	default:
		return
	}
	e.mu.Lock()
	e.gens[c.Tenant]++
	delete(e.tenants, c.Tenant)
	e.mu.Unlock()
	e.sf.Forget(c.Tenant)
}

// Loaded reports how many tenants have a compiled policy in memory.
func (e *Engine) Loaded() int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return len(e.tenants)
}
