package policy_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy/tenancytest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type fixture struct {
	t      testing.TB
	store  tenancy.Store
	mgr    *tenancy.Manager
	engine *policy.Engine
}

// newFixture: one SQLite store, a manager whose notifications go straight
// to the engine (the NATS path is tested separately).
func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{t: t, store: tenancytest.SQLite(t)}
	var err error
	if f.engine, err = policy.New(policy.Config{Store: f.store, Log: quiet}); err != nil {
		t.Fatal(err)
	}
	f.mgr, err = tenancy.NewManager(tenancy.ManagerConfig{Store: f.store, CheckRule: policy.CheckRule, Log: quiet,
		Notify: func(_ context.Context, c wire.TenancyChange) error { f.engine.TenancyChanged(c); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) tenant(id, def string) {
	f.t.Helper()
	if _, err := f.mgr.CreateTenant(context.Background(), tenancy.TenantSpec{ID: id, DefaultEffect: def}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) rule(tenant, effect, sub, obj, act, when string) string {
	f.t.Helper()
	r, err := f.mgr.AddRule(context.Background(), tenancy.Rule{Tenant: tenant, Effect: effect, Subject: sub, Object: obj, Action: act, When: when})
	if err != nil {
		f.t.Fatalf("add rule %s %s %s %s %q: %v", effect, sub, obj, act, when, err)
	}
	return r.ID
}

var (
	opAlice  = access.Principal{Tenant: "acme", ID: "tok_aliceaaaaaaaaaaa", Role: access.RoleOperator}
	adminBob = access.Principal{Tenant: "acme", ID: "tok_bobbbbbbbbbbbbbb", Role: access.RoleAdmin}
)

func toolCall(p access.Principal, node, tool, args string) access.Request {
	r := access.Request{Principal: p, NodeID: node, Command: "mcp.tools.call", Tool: tool}
	if args != "" {
		r.Args = json.RawMessage(args)
	}
	return r
}

func (f *fixture) expect(r access.Request, allowed bool, ruleID string) {
	f.t.Helper()
	d := f.engine.Authorize(context.Background(), r)
	if d.Allowed != allowed || d.RuleID != ruleID {
		f.t.Fatalf("%+v: got %+v, want allowed=%v rule=%q", r, d, allowed, ruleID)
	}
}

const setVolume = "self.audio_speaker.set_volume"

func TestDefaultsAndDenyWins(t *testing.T) {
	f := newFixture(t)
	f.tenant("acme", "")
	req := toolCall(opAlice, "xz-a1b2c3d4e5f6", setVolume, `{"volume":30}`)
	// No rules: the default (allow) decides, and says so.
	d := f.engine.Authorize(context.Background(), req)
	if !d.Allowed || d.RuleID != "" || !strings.Contains(d.Reason, "default") {
		t.Fatalf("no rules: %+v", d)
	}
	allow := f.rule("acme", "allow", "*", "*", "*", "")
	f.expect(req, true, allow)
	deny := f.rule("acme", "deny", "operator", "xz-*", "mcp.tools.call:"+setVolume, "")
	f.expect(req, false, deny)
	// A later, more specific allow does not beat the deny.
	f.rule("acme", "allow", opAlice.ID, "xz-a1b2c3d4e5f6", "mcp.tools.call:"+setVolume, "")
	f.expect(req, false, deny)
	// Other tools and other roles are untouched by the deny.
	f.expect(toolCall(opAlice, "xz-a1b2c3d4e5f6", "self.get_device_status", ""), true, allow)
	f.expect(toolCall(adminBob, "xz-a1b2c3d4e5f6", setVolume, ""), true, allow)
	// Removing the deny restores the allow.
	if err := f.mgr.RemoveRule(context.Background(), "acme", deny); err != nil {
		t.Fatal(err)
	}
	f.expect(req, true, allow)

	// A default-deny tenant denies what no rule allows.
	f.tenant("strict", tenancy.EffectDeny)
	p := access.Principal{Tenant: "strict", ID: "tok_x", Role: access.RoleOperator}
	d = f.engine.Authorize(context.Background(), access.Request{Principal: p, NodeID: "xz-1", Command: "system.which"})
	if d.Allowed || d.RuleID != "" {
		t.Fatalf("default deny: %+v", d)
	}
	ok := f.rule("strict", "allow", "role:operator", "*", "system.*", "")
	f.expect(access.Request{Principal: p, NodeID: "xz-1", Command: "system.which"}, true, ok)
	f.expect(access.Request{Principal: p, NodeID: "xz-1", Command: "mcp.tools.list"}, false, "")
}

func TestSubjectsObjectsGroups(t *testing.T) {
	f := newFixture(t)
	f.tenant("acme", tenancy.EffectDeny)
	byToken := f.rule("acme", "allow", opAlice.ID, "xz-kitchen-?", "mcp.tools.list", "")
	byGroup := f.rule("acme", "allow", "role:admin", "group:lab", "mcp.tools.call", "")
	if err := f.mgr.SetGroup(context.Background(), "acme", "lab", []string{"xz-111111111111", "oc-node"}); err != nil {
		t.Fatal(err)
	}
	list := func(p access.Principal, node string) access.Request {
		return access.Request{Principal: p, NodeID: node, Command: "mcp.tools.list"}
	}
	f.expect(list(opAlice, "xz-kitchen-1"), true, byToken)
	f.expect(list(opAlice, "xz-kitchen-12"), false, "") // ? is one character
	f.expect(list(adminBob, "xz-kitchen-1"), false, "") // another principal
	f.expect(toolCall(adminBob, "xz-111111111111", "anything", ""), true, byGroup)
	f.expect(toolCall(adminBob, "oc-node", "x", ""), true, byGroup)
	f.expect(toolCall(adminBob, "xz-222222222222", "x", ""), false, "")
	f.expect(toolCall(opAlice, "xz-111111111111", "x", ""), false, "") // role mismatch
	// Group membership changes take effect.
	if err := f.mgr.SetGroup(context.Background(), "acme", "lab", []string{"xz-222222222222"}); err != nil {
		t.Fatal(err)
	}
	f.expect(toolCall(adminBob, "xz-111111111111", "x", ""), false, "")
	f.expect(toolCall(adminBob, "xz-222222222222", "x", ""), true, byGroup)
	// The v1 command is the same action.
	v1 := toolCall(adminBob, "xz-222222222222", "x", "")
	v1.Command = "mcp.tools.call.v1"
	f.expect(v1, true, byGroup)
}

func TestArgumentPredicates(t *testing.T) {
	f := newFixture(t)
	f.tenant("acme", "")
	loud := f.rule("acme", "deny", "*", "*", "mcp.tools.call:"+setVolume, "volume>60")
	night := f.rule("acme", "deny", "role:operator", "*", "mcp.tools.call.v1:self.set_mode", `mode in [night, "do not disturb"] && level >= 2`)
	named := f.rule("acme", "deny", "*", "*", "mcp.tools.call:self.rename", `name ~ /^admin/`)
	for _, c := range []struct {
		tool, args string
		allowed    bool
		rule       string
	}{
		{setVolume, `{"volume":61}`, false, loud},
		{setVolume, `{"volume":60}`, true, ""},
		{setVolume, `{"volume":30}`, true, ""},
		{setVolume, `{"volume":"99"}`, true, ""}, // a string is not a number
		{setVolume, `{}`, true, ""},
		{setVolume, ``, true, ""},
		{setVolume, `[1,2]`, true, ""},
		{"self.set_mode", `{"mode":"night","level":2}`, false, night},
		{"self.set_mode", `{"mode":"do not disturb","level":5}`, false, night},
		{"self.set_mode", `{"mode":"night","level":1}`, true, ""},
		{"self.set_mode", `{"mode":"day","level":9}`, true, ""},
		{"self.rename", `{"name":"administrator"}`, false, named},
		{"self.rename", `{"name":"kitchen"}`, true, ""},
	} {
		f.expect(toolCall(opAlice, "xz-1", c.tool, c.args), c.allowed, c.rule)
	}
	// An allow with a predicate only allows when it holds (default deny tenant).
	f.tenant("strict", tenancy.EffectDeny)
	p := access.Principal{Tenant: "strict", ID: "tok_s", Role: access.RoleOperator}
	quiet := f.rule("strict", "allow", "*", "*", "mcp.tools.call:"+setVolume, "volume <= 40")
	f.expect(toolCall(p, "xz-1", setVolume, `{"volume":40}`), true, quiet)
	f.expect(toolCall(p, "xz-1", setVolume, `{"volume":41}`), false, "")
	// Bad predicates are refused and change nothing.
	for _, bad := range []string{"volume >", "volume > loud", "volume = 3", "a ~ /(/", "x in [1,", "&& a == 1"} {
		if _, err := f.mgr.AddRule(context.Background(), tenancy.Rule{Tenant: "strict", Effect: "deny", Subject: "*", Object: "*",
			Action: "mcp.tools.call:x", When: bad}); err == nil {
			t.Errorf("predicate %q accepted", bad)
		}
	}
	if _, err := f.mgr.AddRule(context.Background(), tenancy.Rule{Tenant: "strict", Effect: "deny", Subject: "*", Object: "*",
		Action: "system.which", When: "a == 1"}); err == nil {
		t.Error("a predicate on a command without arguments was accepted")
	}
	if rules, _ := f.store.Rules(context.Background(), "strict"); len(rules) != 1 {
		t.Fatalf("refused rules were stored: %+v", rules)
	}
}

func TestTenantsAreIsolated(t *testing.T) {
	f := newFixture(t)
	f.tenant("acme", "")
	f.tenant("beta", "")
	deny := f.rule("acme", "deny", "*", "*", "*", "")
	f.expect(toolCall(opAlice, "xz-1", "x", ""), false, deny)
	betaOp := access.Principal{Tenant: "beta", ID: opAlice.ID, Role: access.RoleOperator}
	f.expect(toolCall(betaOp, "xz-1", "x", ""), true, "")
	// Removing acme's rule in beta's name fails and changes nothing.
	if err := f.mgr.RemoveRule(context.Background(), "beta", deny); err == nil {
		t.Fatal("beta removed acme's rule")
	}
	f.expect(toolCall(opAlice, "xz-1", "x", ""), false, deny)
	// Unknown and suspended tenants fail closed.
	ghost := access.Principal{Tenant: "ghost", ID: "tok_g", Role: access.RoleAdmin}
	if d := f.engine.Authorize(context.Background(), toolCall(ghost, "xz-1", "x", "")); d.Allowed {
		t.Fatalf("unknown tenant allowed: %+v", d)
	}
	if d := f.engine.Authorize(context.Background(), toolCall(access.Principal{Tenant: "Bad.T"}, "xz-1", "x", "")); d.Allowed {
		t.Fatalf("invalid tenant allowed: %+v", d)
	}
	if _, err := f.mgr.SuspendTenant(context.Background(), "beta"); err != nil {
		t.Fatal(err)
	}
	if d := f.engine.Authorize(context.Background(), toolCall(betaOp, "xz-1", "x", "")); d.Allowed || d.Reason != "tenant suspended" {
		t.Fatalf("suspended tenant: %+v", d)
	}
}

func TestExplain(t *testing.T) {
	f := newFixture(t)
	f.tenant("acme", "")
	allow := f.rule("acme", "allow", "role:operator", "*", "mcp.tools.call:*", "")
	loud := f.rule("acme", "deny", "*", "xz-*", "mcp.tools.call:"+setVolume, "volume > 60")
	f.rule("acme", "deny", "role:viewer", "*", "*", "")
	ex, err := f.engine.Explain(context.Background(), "acme", access.Principal{Role: "operator"}, "xz-1",
		"mcp.tools.call.v1:"+setVolume, []byte(`{"volume":80}`))
	if err != nil {
		t.Fatal(err)
	}
	applies := func(ex policy.Explanation) map[string]bool {
		m := map[string]bool{}
		for _, r := range ex.Matched {
			m[r.ID] = r.Applies
			if r.CreatedAt.IsZero() {
				t.Errorf("matched rule %s lacks its creation time", r.ID)
			}
		}
		return m
	}
	if a := applies(ex); ex.Allowed || ex.RuleID != loud || ex.Default || len(a) != 2 || !a[allow] || !a[loud] {
		t.Fatalf("explain = %+v", ex)
	}
	ex, _ = f.engine.Explain(context.Background(), "acme", access.Principal{Role: "operator"}, "xz-1",
		"mcp.tools.call:"+setVolume, []byte(`{"volume":10}`))
	if a := applies(ex); !ex.Allowed || ex.RuleID != allow || len(a) != 2 || a[loud] {
		t.Fatalf("explain quiet = %+v", ex)
	}
	ex, _ = f.engine.Explain(context.Background(), "acme", access.Principal{ID: "tok_z"}, "oc-1", "system.run", nil)
	if !ex.Allowed || !ex.Default || len(ex.Matched) != 0 {
		t.Fatalf("explain default = %+v", ex)
	}
}

// TestMatchesReference checks the Casbin-backed engine against a direct
// reading of the rules on random rule sets and requests.
func TestMatchesReference(t *testing.T) {
	f := newFixture(t)
	rng := rand.New(rand.NewPCG(1, 2))
	subjects := []string{"*", "role:operator", "role:admin", "tok_a", "tok_b"}
	objects := []string{"*", "xz-1", "xz-2", "xz-*", "oc-?", "group:g1", "group:g2"}
	actions := []string{"*", "mcp.tools.call:*", "mcp.tools.call:t1", "mcp.tools.call:t2", "system.*", "system.which", "mcp.tools.list"}
	whens := []string{"", "", "v > 5", "m in [a, b]"}
	nodes := []string{"xz-1", "xz-2", "xz-3", "oc-1", "oc-22"}
	groups := map[string][]string{"g1": {"xz-3", "oc-22"}, "g2": {"xz-1"}}
	reqActs := []struct{ cmd, tool string }{{"mcp.tools.call", "t1"}, {"mcp.tools.call.v1", "t2"}, {"mcp.tools.call", "t3"},
		{"system.which", ""}, {"system.run", ""}, {"mcp.tools.list", ""}}
	argSets := []string{"", `{"v":9,"m":"a"}`, `{"v":1,"m":"c"}`}
	for round := range 8 {
		tenant := "t" + string(rune('a'+round))
		def := []string{tenancy.EffectAllow, tenancy.EffectDeny}[round%2]
		f.tenant(tenant, def)
		for g, nodes := range groups {
			if err := f.mgr.SetGroup(context.Background(), tenant, g, nodes); err != nil {
				t.Fatal(err)
			}
		}
		for range 1 + rng.IntN(12) {
			r := tenancy.Rule{Tenant: tenant, Effect: []string{"allow", "deny"}[rng.IntN(2)], Subject: subjects[rng.IntN(len(subjects))],
				Object: objects[rng.IntN(len(objects))], Action: actions[rng.IntN(len(actions))]}
			if strings.HasPrefix(r.Action, "mcp.tools.call:") {
				r.When = whens[rng.IntN(len(whens))]
			}
			if _, err := f.mgr.AddRule(context.Background(), r); err != nil {
				t.Fatal(err)
			}
		}
		// Rule order is the store's: by creation time, then id.
		rules, err := f.store.Rules(context.Background(), tenant)
		if err != nil {
			t.Fatal(err)
		}
		for _, sub := range []string{"tok_a", "tok_b", "tok_c"} {
			for _, role := range []string{"operator", "admin", "viewer"} {
				for _, node := range nodes {
					for _, ra := range reqActs {
						for _, args := range argSets {
							p := access.Principal{Tenant: tenant, ID: sub, Role: role}
							req := access.Request{Principal: p, NodeID: node, Command: ra.cmd, Tool: ra.tool}
							if args != "" {
								req.Args = json.RawMessage(args)
							}
							got := f.engine.Authorize(context.Background(), req)
							want := reference(rules, groups, def, req)
							if got.Allowed != want.Allowed || got.RuleID != want.RuleID {
								t.Fatalf("rules %+v\nrequest %+v args %s\ngot %+v\nwant %+v", rules, req, args, got, want)
							}
						}
					}
				}
			}
		}
	}
}

// reference is the documented semantics, read directly: an unconditional
// deny (first in order), else a deny whose predicate holds, else an
// unconditional allow, else an allow whose predicate holds, else default.
func reference(rules []tenancy.Rule, groups map[string][]string, def string, r access.Request) access.Decision {
	act := policy.Action(r.Command, r.Tool)
	args := policy.DecodeArgs(r.Args)
	matches := func(x tenancy.Rule) bool {
		subOK := x.Subject == "*" || x.Subject == r.Principal.ID || x.Subject == "role:"+r.Principal.Role
		objOK := false
		if g, ok := strings.CutPrefix(x.Object, "group:"); ok {
			for _, n := range groups[g] {
				objOK = objOK || n == r.NodeID
			}
		} else {
			objOK = policy.GlobMatchForTest(x.Object, r.NodeID)
		}
		return subOK && objOK && policy.GlobMatchForTest(x.Action, act)
	}
	holds := func(x tenancy.Rule) bool {
		p, _ := policy.ParseWhen(x.When)
		return p.Eval(args)
	}
	for _, pass := range []struct {
		effect string
		cond   bool
	}{{"deny", false}, {"deny", true}, {"allow", false}, {"allow", true}} {
		for _, x := range rules {
			if x.Effect == pass.effect && (x.When != "") == pass.cond && matches(x) && holds(x) {
				return access.Decision{Allowed: pass.effect == "allow", RuleID: x.ID}
			}
		}
	}
	return access.Decision{Allowed: def == tenancy.EffectAllow}
}

// TestConcurrentDecisionsDuringChanges asks from many goroutines while
// rules come and go; run with -race. Every answer must be one of the two
// consistent states.
func TestConcurrentDecisionsDuringChanges(t *testing.T) {
	f := newFixture(t)
	f.tenant("acme", "")
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				node := "xz-" + strconv.Itoa((g*7+i)%50)
				d := f.engine.Authorize(ctx, toolCall(opAlice, node, setVolume, `{"volume":99}`))
				if !d.Allowed && d.RuleID == "" {
					bad.Add(1)
				}
			}
		})
	}
	for range 20 {
		id := f.rule("acme", "deny", "*", "*", "mcp.tools.call:"+setVolume, "volume > 60")
		if err := f.mgr.RemoveRule(ctx, "acme", id); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d denials named no rule", bad.Load())
	}
	f.expect(toolCall(opAlice, "xz-1", setVolume, `{"volume":99}`), true, "")
}

func TestUpstreamPrincipal(t *testing.T) {
	f := newFixture(t)
	f.tenant("acme", tenancy.EffectAllow)
	up := access.Principal{Tenant: "acme", ID: "upstream:home", Name: "upstream home", Role: access.RoleOperator}
	deny := f.rule("acme", "deny", "upstream:home", "*", "mcp.tools.call:self.reboot", "")
	f.expect(toolCall(up, "xz-111111111111", "self.reboot", ""), false, deny)
	f.expect(toolCall(up, "xz-111111111111", "self.get_status", ""), true, "")
	f.expect(toolCall(opAlice, "xz-111111111111", "self.reboot", ""), true, "") // only the upstream
	for _, bad := range []string{"upstream:", "upstream:a.b", "upstream:a b"} {
		if _, err := f.mgr.AddRule(context.Background(), tenancy.Rule{Tenant: "acme", Effect: "deny", Subject: bad,
			Object: "*", Action: "*"}); err == nil {
			t.Errorf("subject %q accepted", bad)
		}
	}
}
