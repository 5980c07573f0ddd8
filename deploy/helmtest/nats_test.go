package helmtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// natsAuthSecret is the default natsAuth.secretName.
const natsAuthSecret = "xiaoclaw-nats-auth"

// TestEachServiceHasItsOwnNATSUser: every service container connects as
// its own NATS user with its password from the NATS auth Secret, which
// the chart generates with one strong password per service.
func TestEachServiceHasItsOwnNATSUser(t *testing.T) {
	forEachScenario(t, func(t *testing.T, r rendering) {
		deps := r.deployments(t)
		for _, component := range []string{"gateway", "shim", "devicehub"} {
			d := deps[component]
			if d == nil {
				t.Fatalf("no %s Deployment", component)
			}
			var user string
			var pass *corev1.EnvVarSource
			for _, e := range d.Spec.Template.Spec.Containers[0].Env {
				switch e.Name {
				case "XIAOCLAW_NATS_USER":
					user = e.Value
				case "XIAOCLAW_NATS_PASSWORD":
					pass = e.ValueFrom
				}
			}
			if user != component {
				t.Errorf("%s connects to NATS as %q, want its own user", component, user)
			}
			if pass == nil || pass.SecretKeyRef == nil || pass.SecretKeyRef.Name != natsAuthSecret || pass.SecretKeyRef.Key != component {
				t.Errorf("%s: NATS password %+v, want Secret %s key %s", component, pass, natsAuthSecret, component)
			}
		}
		if r.name != "default" {
			return
		}
		m, ok := r.find("Secret", natsAuthSecret)
		if !ok {
			t.Fatal("the NATS auth Secret is not rendered")
		}
		s := into[corev1.Secret](t, m)
		seen := map[string]bool{}
		for _, k := range []string{"gateway", "shim", "devicehub"} {
			if p := string(s.Data[k]); len(p) < 32 || seen[p] {
				t.Errorf("password of %s: %d bytes (or shared), want 32 or more of its own", k, len(p))
			} else {
				seen[p] = true
			}
		}
	})
	off := renderScenario(t, stagedChart(t), scenario{name: "off", args: []string{"--set", "natsAuth.enabled=false"}})
	if _, ok := off.find("Secret", natsAuthSecret); ok || strings.Contains(string(off.yaml), "XIAOCLAW_NATS_PASSWORD") {
		t.Error("natsAuth.enabled=false still renders NATS credentials")
	}
}

type natsUser struct {
	User        string `json:"user"`
	Password    string `json:"password"`
	Permissions struct {
		Publish struct {
			Allow []string `json:"allow"`
			Deny  []string `json:"deny"`
		} `json:"publish"`
		Subscribe struct {
			Allow []string `json:"allow"`
		} `json:"subscribe"`
		AllowResponses bool `json:"allow_responses"`
	} `json:"permissions"`
}

// TestBundledNATSEnforcesServicePermissions: the bundled nats chart gets
// the services' users, each password read from the NATS auth Secret, and
// permissions that let only the gateway publish node.invoke. (A test in
// cmd/xiaoclaw/internal/devstack runs the system on a real server with
// these permissions.)
func TestBundledNATSEnforcesServicePermissions(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "helm", "xiaoclaw", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Nats struct {
			Config struct {
				Merge struct {
					Authorization struct {
						Users []natsUser `json:"users"`
					} `json:"authorization"`
				} `json:"merge"`
			} `json:"config"`
			Container struct {
				Env map[string]corev1.EnvVar `json:"env"`
			} `json:"container"`
		} `json:"nats"`
	}
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	users := map[string]natsUser{}
	for _, u := range v.Nats.Config.Merge.Authorization.Users {
		users[u.User] = u
		envName := strings.TrimSuffix(strings.TrimPrefix(u.Password, "<< $"), " >>")
		ref := v.Nats.Container.Env[envName].ValueFrom
		if ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != natsAuthSecret || ref.SecretKeyRef.Key != u.User {
			t.Errorf("user %s: password %q is not read from Secret %s key %s", u.User, u.Password, natsAuthSecret, u.User)
		}
	}
	for _, c := range []struct {
		user, subject string
		publish, want bool
	}{
		{"gateway", "xc.acme.node.invoke", true, true},
		{"shim", "xc.acme.node.invoke", false, true}, // serves it
		{"devicehub", "xc.acme.node.invoke", true, false},
		{"shim", "xc.acme.node.invoke", true, false},
		{"devicehub", "xc.acme.dev.a1b2c3d4e5f6.rpc", true, false},
		{"gateway", "xc.acme.dev.a1b2c3d4e5f6.rpc", true, false}, // only through the shim
		{"devicehub", "xc._sys.tenancy.changed", true, false},
		{"devicehub", "_INBOX_gateway.x", false, false},
		{"gateway", "$KV.xc_upstreams.acme.lab", true, true}, // writes the stored upstreams
		{"shim", "$KV.xc_upstreams.acme.lab", true, false},   // only reads them
		{"shim", "xc.acme.node.event", false, true},          // forwards them upstream
	} {
		u, ok := users[c.user]
		if !ok {
			t.Fatalf("no NATS user %s", c.user)
		}
		allow := u.Permissions.Subscribe.Allow
		if c.publish {
			allow = u.Permissions.Publish.Allow
		}
		got := anyMatch(allow, c.subject)
		if c.publish && anyMatch(u.Permissions.Publish.Deny, c.subject) {
			got = false
		}
		if got != c.want {
			t.Errorf("%s may %s %s: %v, want %v", c.user, map[bool]string{true: "publish", false: "subscribe"}[c.publish], c.subject, got, c.want)
		}
	}
}

// The devicehub's JetStream API access stops at the stored upstreams'
// bucket: no info, message, direct get or consumer request on it.
func TestOnlyGatewayAndShimReadStoredUpstreams(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "helm", "xiaoclaw", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Nats struct {
			Config struct {
				Merge struct {
					Authorization struct {
						Users []natsUser `json:"users"`
					} `json:"authorization"`
				} `json:"merge"`
			} `json:"config"`
		} `json:"nats"`
	}
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	for _, u := range v.Nats.Config.Merge.Authorization.Users {
		for _, subj := range []string{"$JS.API.STREAM.INFO.KV_xc_upstreams", "$JS.API.STREAM.MSG.GET.KV_xc_upstreams",
			"$JS.API.DIRECT.GET.KV_xc_upstreams.$KV.xc_upstreams.acme.lab", "$JS.API.CONSUMER.CREATE.KV_xc_upstreams.c.$KV.xc_upstreams.>",
			"$JS.API.CONSUMER.DURABLE.CREATE.KV_xc_upstreams.c"} {
			p := u.Permissions.Publish
			may := anyMatch(p.Allow, subj) && !anyMatch(p.Deny, subj)
			if may != (u.User != "devicehub") {
				t.Errorf("%s may publish %s: %v", u.User, subj, may)
			}
		}
	}
}

// anyMatch reports whether a NATS subject matches one of the patterns
// ("*" one token, ">" the rest).
func anyMatch(patterns []string, subject string) bool {
	for _, p := range patterns {
		pt, st := strings.Split(p, "."), strings.Split(subject, ".")
		ok := true
		for i, tok := range pt {
			if tok == ">" {
				ok = len(st) > i
				break
			}
			if i >= len(st) || (tok != "*" && tok != st[i]) {
				ok = false
				break
			}
			if i == len(pt)-1 && len(st) != len(pt) {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// TestGatewayTrustsTheConfiguredProxies: gateway.trustedProxies reaches
// the gateway (failed authentications are throttled per client behind the
// Ingress, not per Ingress pod).
func TestGatewayTrustsTheConfiguredProxies(t *testing.T) {
	forEachScenario(t, func(t *testing.T, r rendering) {
		m, ok := r.find("ConfigMap", releaseName+"-xiaoclaw-gateway")
		if !ok {
			t.Fatal("no gateway ConfigMap")
		}
		got := into[corev1.ConfigMap](t, m).Data["XIAOCLAW_TRUSTED_PROXIES"]
		want := map[string]string{"production": "10.0.0.0/8"}[r.name]
		if got != want {
			t.Errorf("XIAOCLAW_TRUSTED_PROXIES %q, want %q", got, want)
		}
	})
}
