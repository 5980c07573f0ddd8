package policy_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
)

// memStore serves generated rules from memory: the benchmarks measure
// decisions, not the database.
type memStore struct {
	tenancy.Store
	rules  map[string][]tenancy.Rule
	groups map[string][]string
}

func (m *memStore) Tenant(_ context.Context, id string) (tenancy.Tenant, error) {
	if _, ok := m.rules[id]; !ok {
		return tenancy.Tenant{}, tenancy.ErrNotFound
	}
	return tenancy.Tenant{ID: id, Status: tenancy.StatusActive, DefaultEffect: tenancy.EffectAllow}, nil
}

func (m *memStore) Rules(_ context.Context, id string) ([]tenancy.Rule, error) {
	return m.rules[id], nil
}

func (m *memStore) Groups(context.Context, string) (map[string][]string, error) { return m.groups, nil }

const (
	rulesPerTenant = 100
	benchTools     = 40
	benchNodes     = 200
)

func tenantName(i int) string { return "t" + strconv.Itoa(i) }

// genRules makes 100 rules of the shapes a fleet uses: role and token
// subjects, node globs and groups, tool and command actions, a tenth of
// them with argument predicates.
func genRules(rng *rand.Rand, tenant string) []tenancy.Rule {
	out := make([]tenancy.Rule, 0, rulesPerTenant)
	for i := range rulesPerTenant {
		r := tenancy.Rule{ID: fmt.Sprintf("rul_%s%d", tenant, i), Tenant: tenant, Effect: "allow"}
		if rng.IntN(3) == 0 {
			r.Effect = "deny"
		}
		switch rng.IntN(4) {
		case 0:
			r.Subject = "*"
		case 1:
			r.Subject = "role:" + []string{"admin", "operator", "viewer"}[rng.IntN(3)]
		default:
			r.Subject = "tok_p" + strconv.Itoa(rng.IntN(20))
		}
		switch rng.IntN(4) {
		case 0:
			r.Object = "xz-" + strconv.Itoa(rng.IntN(benchNodes))
		case 1:
			r.Object = "xz-" + strconv.Itoa(rng.IntN(10)) + "*"
		case 2:
			r.Object = "group:g" + strconv.Itoa(rng.IntN(5))
		default:
			r.Object = "*"
		}
		switch rng.IntN(5) {
		case 0:
			r.Action = "system.*"
		case 1:
			r.Action = "mcp.tools.list"
		default:
			r.Action = "mcp.tools.call:self.tool" + strconv.Itoa(rng.IntN(benchTools))
			if rng.IntN(4) == 0 {
				r.When = "volume > " + strconv.Itoa(rng.IntN(100))
			}
		}
		if err := policy.CheckRule(&r); err != nil {
			panic(err)
		}
		out = append(out, r)
	}
	return out
}

func newBenchEngine(tb testing.TB, tenants int) (*policy.Engine, time.Duration, uint64) {
	rng := rand.New(rand.NewPCG(7, uint64(tenants)))
	st := &memStore{rules: map[string][]tenancy.Rule{}, groups: map[string][]string{}}
	for g := range 5 {
		for n := range 20 {
			st.groups["g"+strconv.Itoa(g)] = append(st.groups["g"+strconv.Itoa(g)], "xz-"+strconv.Itoa(g*20+n))
		}
	}
	for i := range tenants {
		st.rules[tenantName(i)] = genRules(rng, tenantName(i))
	}
	e, err := policy.New(policy.Config{Store: st, Log: quiet})
	if err != nil {
		tb.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	for i := range tenants { // build every tenant's enforcer up front
		e.Authorize(context.Background(), access.Request{Principal: access.Principal{Tenant: tenantName(i), ID: "tok_p0", Role: "operator"}, NodeID: "xz-0", Command: "system.which"})
	}
	build := time.Since(start) / time.Duration(tenants)
	runtime.GC()
	runtime.ReadMemStats(&after)
	return e, build, (after.HeapAlloc - before.HeapAlloc) / uint64(tenants)
}

func randomRequest(rng *rand.Rand, tenants int) access.Request {
	p := access.Principal{Tenant: tenantName(rng.IntN(tenants)), ID: "tok_p" + strconv.Itoa(rng.IntN(20)),
		Role: []string{"admin", "operator", "viewer"}[rng.IntN(3)]}
	r := access.Request{Principal: p, NodeID: "xz-" + strconv.Itoa(rng.IntN(benchNodes))}
	if rng.IntN(4) == 0 {
		r.Command = "system.which"
	} else {
		r.Command, r.Tool = "mcp.tools.call", "self.tool"+strconv.Itoa(rng.IntN(benchTools))
		r.Args = []byte(`{"volume":` + strconv.Itoa(rng.IntN(100)) + `}`)
	}
	return r
}

// measure times each decision of reqs (cycling) n times and returns p50
// and p99.
func measure(e *policy.Engine, reqs []access.Request, n int) (p50, p99 time.Duration) {
	ctx := context.Background()
	lat := make([]time.Duration, n)
	for i := range n {
		r := reqs[i%len(reqs)]
		t := time.Now()
		e.Authorize(ctx, r)
		lat[i] = time.Since(t)
	}
	slices.Sort(lat)
	return lat[n/2], lat[n*99/100]
}

// BenchmarkDecision measures Authorize at 10 and 1,000 tenants × 100 rules
// in one run and reports p50/p99 per size and the p99 ratio.
//
//   - cached: a working set of 20,000 (principal, node, action) questions
//     spread over the tenants, asked again and again with varying
//     arguments (predicates are still evaluated per call);
//   - uncached: questions never asked before, answered by the tenant's
//     Casbin enforcer.
func BenchmarkDecision(b *testing.B) {
	type result struct {
		p50, p99, missP50, missP99, build time.Duration
		heap                              uint64
	}
	results := map[int]result{}
	for _, tenants := range []int{10, 1000} {
		e, build, heap := newBenchEngine(b, tenants)
		rng := rand.New(rand.NewPCG(11, 13))
		hot := make([]access.Request, 20_000)
		for i := range hot {
			hot[i] = randomRequest(rng, tenants)
		}
		measure(e, hot, len(hot)) // warm the caches
		n := max(b.N, 50_000)
		p50, p99 := measure(e, hot, n)
		cold := make([]access.Request, 5_000)
		for i := range cold {
			cold[i] = randomRequest(rng, tenants)
			cold[i].NodeID = "xz-cold" + strconv.Itoa(i) // never cached
		}
		mp50, mp99 := measure(e, cold, len(cold))
		results[tenants] = result{p50, p99, mp50, mp99, build, heap}
	}
	small, large := results[10], results[1000]
	b.ReportMetric(float64(small.p50.Nanoseconds()), "p50-ns@10")
	b.ReportMetric(float64(small.p99.Nanoseconds()), "p99-ns@10")
	b.ReportMetric(float64(large.p50.Nanoseconds()), "p50-ns@1000")
	b.ReportMetric(float64(large.p99.Nanoseconds()), "p99-ns@1000")
	b.ReportMetric(float64(large.p99)/float64(small.p99), "p99-ratio")
	b.ReportMetric(float64(small.missP99.Nanoseconds()), "uncached-p99-ns@10")
	b.ReportMetric(float64(large.missP99.Nanoseconds()), "uncached-p99-ns@1000")
	b.ReportMetric(float64(large.missP99)/float64(small.missP99), "uncached-p99-ratio")
	b.ReportMetric(float64(large.build.Microseconds()), "build-us/tenant")
	b.ReportMetric(float64(large.heap)/1024, "heap-KiB/tenant")
	b.Logf("10 tenants: p50 %s p99 %s, uncached p50 %s p99 %s", small.p50, small.p99, small.missP50, small.missP99)
	b.Logf("1000 tenants: p50 %s p99 %s, uncached p50 %s p99 %s; build %s and %d KiB per tenant",
		large.p50, large.p99, large.missP50, large.missP99, large.build, large.heap/1024)
}

// BenchmarkAuthorizeCached is the plain throughput of a cached decision.
func BenchmarkAuthorizeCached(b *testing.B) {
	e, _, _ := newBenchEngine(b, 10)
	r := access.Request{Principal: access.Principal{Tenant: "t1", ID: "tok_p1", Role: "operator"}, NodeID: "xz-5",
		Command: "mcp.tools.call", Tool: "self.tool3", Args: []byte(`{"volume":70}`)}
	e.Authorize(context.Background(), r)
	b.ReportAllocs()
	for b.Loop() {
		e.Authorize(context.Background(), r)
	}
}

// BenchmarkAuthorizeFirstTime is the cost of a question never asked
// before (no cached verdict): the rule index plus Casbin over the
// candidate rules.
func BenchmarkAuthorizeFirstTime(b *testing.B) {
	e, _, _ := newBenchEngine(b, 10)
	rng := rand.New(rand.NewPCG(3, 5))
	reqs := make([]access.Request, 8192)
	for i := range reqs {
		reqs[i] = randomRequest(rng, 10)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r := reqs[i%len(reqs)]
		r.NodeID = "xz-" + strconv.Itoa(i) // a node never asked about
		e.Authorize(context.Background(), r)
		i++
	}
}
