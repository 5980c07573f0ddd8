package devstack

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"

	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
)

// chartNATSUsers reads the services' NATS users and permissions from the
// Helm chart's values (nats.config.merge.authorization), exactly what the
// bundled NATS server is configured with, and gives each the password
// "pw-<user>".
func chartNATSUsers(t *testing.T) []*server.User {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "deploy", "helm", "xiaoclaw", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	type subjects struct {
		Allow []string `yaml:"allow"`
		Deny  []string `yaml:"deny"`
	}
	var values struct {
		Nats struct {
			Config struct {
				Merge struct {
					Authorization struct {
						Users []struct {
							User        string `yaml:"user"`
							Password    string `yaml:"password"`
							Permissions struct {
								Publish        subjects `yaml:"publish"`
								Subscribe      subjects `yaml:"subscribe"`
								AllowResponses bool     `yaml:"allow_responses"`
							} `yaml:"permissions"`
						} `yaml:"users"`
					} `yaml:"authorization"`
				} `yaml:"merge"`
			} `yaml:"config"`
		} `yaml:"nats"`
	}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	var users []*server.User
	for _, u := range values.Nats.Config.Merge.Authorization.Users {
		if !strings.HasPrefix(u.Password, "<< $XIAOCLAW_NATS_PASSWORD_") {
			t.Fatalf("user %s: password %q is not read from the environment", u.User, u.Password)
		}
		p := u.Permissions
		perm := &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: p.Publish.Allow, Deny: p.Publish.Deny},
			Subscribe: &server.SubjectPermission{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny},
		}
		if p.AllowResponses {
			perm.Response = &server.ResponsePermission{MaxMsgs: server.DEFAULT_ALLOW_RESPONSE_MAX_MSGS,
				Expires: server.DEFAULT_ALLOW_RESPONSE_EXPIRATION}
		}
		users = append(users, &server.User{Username: u.User, Password: "pw-" + u.User, Permissions: perm})
	}
	if len(users) != 3 {
		t.Fatalf("chart NATS users: %d, want gateway, shim and devicehub", len(users))
	}
	return users
}

// serviceUser is the chart's NATS user of a stack component: the
// devicehub's, the shim's, or the gateway's (which also runs the audit
// workers, the tenancy watcher and the admin API in production).
func serviceUser(component string) string {
	switch {
	case strings.HasPrefix(component, "hub-"):
		return "devicehub"
	case strings.HasPrefix(component, "shim-"), strings.HasPrefix(component, "upstream-"):
		return "shim"
	}
	return "gateway"
}

// asyncErrors collects the asynchronous errors (permission violations)
// of NATS connections.
type asyncErrors struct {
	mu   sync.Mutex
	errs []string
}

func (a *asyncErrors) handler(who string) nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		a.mu.Lock()
		a.errs = append(a.errs, who+": "+err.Error())
		a.mu.Unlock()
	})
}

func (a *asyncErrors) list() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.errs...)
}

func userOptions(user string) []nats.Option {
	return []nats.Option{nats.UserInfo(user, "pw-"+user), nats.CustomInboxPrefix(natsauth.InboxPrefix(user))}
}

// The whole system runs with each service on its own NATS user under the
// chart's subject permissions: a device boots through OTA, an operator
// calls its tool, the call is audited, and no service hits a denied
// subject. A client holding the devicehub's credentials cannot publish
// node.invoke nor read the gateway's replies.
func TestServicesWorkUnderTheChartsNATSPermissions(t *testing.T) {
	var violations asyncErrors
	st := startStack(t, Config{
		MQTTAddr: "127.0.0.1:0", AutoActivate: true,
		NATSUsers: chartNATSUsers(t),
		NATSOptions: func(component string) []nats.Option {
			return append(userOptions(serviceUser(component)), violations.handler(component))
		},
	})
	d := connectDevices(t, st, 0, 1, 21, func(c *xzsim.Config) { c.OTAURL = st.OTAURL(0) })[0]
	op := operator(t, st.GatewayURL(0))
	waitNodes(t, op, true, nodeID(d))
	if _, err := callTool(context.Background(), op, nodeID(d), "self.audio_speaker.set_volume", map[string]int{"volume": 42}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if d.Volume() != 42 {
		t.Fatalf("volume %d", d.Volume())
	}
	var err error
	if !eventually.Until(waitLimit, func() bool {
		var p audit.Page
		p, err = st.Tenancy.AuditStore.Query(context.Background(), audit.Query{Tenant: DevTenant, Kind: audit.KindInvoke})
		return err == nil && len(p.Events) > 0
	}) {
		t.Fatalf("the call was not audited under the gateway's permissions (%v)", err)
	}
	if v := violations.list(); len(v) > 0 {
		t.Fatalf("services hit denied subjects: %v", v)
	}

	// The devicehub's credentials: node.invoke is refused by the server.
	nc, err := st.Connect("hub-intruder") // connects as the devicehub's user
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_, err = nc.Request("xc.dev.node.invoke", []byte(`{"nodeId":"`+nodeID(d)+`","command":"mcp.tools.call"}`), time.Second)
	if err == nil {
		t.Fatal("the devicehub user's node.invoke was answered")
	}
	if _, err := nc.SubscribeSync("_INBOX_gateway.>"); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush() // the violations arrive asynchronously
	var got string
	if !eventually.Until(waitLimit, func() bool {
		got = strings.Join(violations.list(), "\n")
		return strings.Contains(got, `Publish to "xc.dev.node.invoke"`) && strings.Contains(got, `Subscription to "_INBOX_gateway.>"`)
	}) {
		t.Fatalf("permission violations seen: %q", got)
	}
	if d.Volume() != 42 {
		t.Fatalf("the device obeyed a call from the devicehub's credentials: volume %d", d.Volume())
	}
}

// Stored upstreams run under the chart's NATS permissions: the gateway
// writes the bucket, the shims' workers read it and publish the device to
// the upstream, the gateway shows the link from the lease bucket in
// node.list, all without hitting a denied subject, and the devicehub's
// credentials cannot read the entry (secrets and caller token).
func TestStoredUpstreamsUnderTheChartsNATSPermissions(t *testing.T) {
	var violations asyncErrors
	up := startStack(t, Config{})
	home := startStack(t, Config{
		AdminToken: upstreamAdminToken,
		NATSUsers:  chartNATSUsers(t),
		NATSOptions: func(component string) []nats.Option {
			return append(userOptions(serviceUser(component)), violations.handler(component))
		},
	})
	if status, raw := adminCall(t, home, "POST", "/api/tenants/"+DevTenant+"/upstreams",
		map[string]any{"name": "lab", "url": up.GatewayURL(0), "token": testOperatorToken}); status != 201 {
		t.Fatalf("add upstream: %d %s", status, raw)
	}
	connectDevices(t, home, 0, 1, 9, nil)
	waitUpstreamNode(t, operator(t, up.GatewayURL(0)))
	// The gateway's user reads the links' leases for node.list.
	local := operator(t, home.GatewayURL(0))
	eventually.Within(t, waitLimit, "node.list shows the link online", func() bool {
		raw, err := local.Call(context.Background(), "node.list", map[string]any{})
		if err != nil {
			t.Fatal(err)
		}
		var res struct {
			Nodes []upstreamLinks `json:"nodes"`
		}
		_ = json.Unmarshal(raw, &res)
		return len(res.Nodes) == 1 && len(res.Nodes[0].Upstreams) == 1 && res.Nodes[0].Upstreams[0].State == wire.UpstreamOnline
	})
	if v := violations.list(); len(v) > 0 {
		t.Fatalf("services hit denied subjects: %v", v)
	}

	nc, err := home.Connect("hub-reader") // the devicehub's user
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// A refused request gets no answer: a short wait is enough.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if kv, err := js.KeyValue(ctx, wire.BucketUpstreams); err == nil {
		if _, err := kv.Get(ctx, wire.UpstreamKey(DevTenant, "lab")); err == nil {
			t.Fatal("the devicehub's user read a stored upstream")
		}
	}
	eventually.Within(t, waitLimit, "the server refused the devicehub's user", func() bool {
		return strings.Contains(strings.Join(violations.list(), "\n"), "hub-reader: nats: permissions violation")
	})
}
