package tenancy

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Upstream authentication kinds: the OpenClaw gateway's shared token or
// its password.
const (
	UpstreamAuthToken    = "token"
	UpstreamAuthPassword = "password"
)

// Publish modes: which of the tenant's nodes an upstream sees.
const (
	PublishAll   = "all"   // every node of the tenant
	PublishGroup = "group" // the members of one node group
	PublishNodes = "nodes" // a list of node ids
)

// maxUpstreamSecret bounds a gateway token or password; maxCACert a PEM
// bundle.
const (
	maxUpstreamSecret = 4096
	maxCACert         = 64 << 10
)

// Upstream is an OpenClaw gateway a tenant publishes its nodes to, as
// stored. Secret (the gateway's token or password) is kept so that the
// shims can connect; it is never marshalled, printed or logged.
type Upstream struct {
	Tenant string `json:"tenant"`
	// Name is 1-64 characters of [A-Za-z0-9_-]; the calls the gateway
	// sends are the principal "upstream:<name>".
	Name string `json:"name"`
	URL  string `json:"url"` // ws:// or wss://
	// Auth says what Secret is: UpstreamAuthToken or UpstreamAuthPassword.
	Auth   string `json:"auth"`
	Secret string `json:"-"`
	// CACert is a PEM bundle trusted for a wss:// gateway on top of the
	// system roots; InsecureSkipVerify accepts any certificate (a
	// self-signed test gateway).
	CACert             string  `json:"caCert,omitempty"`
	InsecureSkipVerify bool    `json:"insecureSkipVerify,omitempty"`
	Publish            Publish `json:"publish"`
	// CallerHash is the SHA-256 of the caller token of the upstream's calls.
	CallerHash string    `json:"-"`
	CreatedAt  time.Time `json:"createdAt"`
}

// Publish selects the nodes an upstream sees: all of them, the members of
// Group, or Nodes.
type Publish struct {
	Mode  string   `json:"mode"`
	Group string   `json:"group,omitempty"`
	Nodes []string `json:"nodes,omitempty"`
}

// String leaves the secret out, so that %v and %+v never show it.
func (u Upstream) String() string {
	return "upstream " + u.Name + " of tenant " + u.Tenant + " at " + u.URL
}

// GoString implements fmt.GoStringer without the secret.
func (u Upstream) GoString() string { return u.String() }

// LogValue implements slog.LogValuer without the secret.
func (u Upstream) LogValue() slog.Value {
	return slog.GroupValue(slog.String("tenant", u.Tenant), slog.String("name", u.Name), slog.String("url", u.URL))
}

// ValidUpstreamName reports whether n may name an upstream: 1-64
// characters of [A-Za-z0-9_-].
func ValidUpstreamName(n string) bool { return ValidGroupName(n) }

// UpstreamSpec describes a new upstream: exactly one of Token and Password.
type UpstreamSpec struct {
	Name               string  `json:"name"`
	URL                string  `json:"url"`
	Token              string  `json:"token,omitempty"`
	Password           string  `json:"password,omitempty"`
	CACert             string  `json:"caCert,omitempty"`
	InsecureSkipVerify bool    `json:"insecureSkipVerify,omitempty"`
	Publish            Publish `json:"publish"`
}

// GoString leaves the secrets out.
func (s UpstreamSpec) GoString() string { return "upstream spec " + s.Name + " at " + s.URL }

func checkSecret(field, v string) error {
	if len(v) > maxUpstreamSecret {
		return invalid("%s must be at most %d bytes", field, maxUpstreamSecret)
	}
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return invalid("%s must not contain control characters", field)
		}
	}
	return nil
}

// checkUpstream validates s and returns the upstream it describes.
func checkUpstream(tenant string, s UpstreamSpec) (Upstream, error) {
	if !ValidUpstreamName(s.Name) {
		return Upstream{}, invalid("upstream name must be 1-64 characters of [A-Za-z0-9_-], not %q", s.Name)
	}
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return Upstream{}, invalid("url must be ws://host[:port][/path] or wss://…, not %q", s.URL)
	}
	if u.User != nil || u.Fragment != "" {
		return Upstream{}, invalid("url must carry no user info or fragment; give the token or password apart")
	}
	up := Upstream{Tenant: tenant, Name: s.Name, URL: s.URL, CACert: s.CACert, InsecureSkipVerify: s.InsecureSkipVerify}
	switch {
	case s.Token != "" && s.Password != "":
		return Upstream{}, invalid("give the gateway's token or its password, not both")
	case s.Token != "":
		up.Auth, up.Secret = UpstreamAuthToken, s.Token
	case s.Password != "":
		up.Auth, up.Secret = UpstreamAuthPassword, s.Password
	default:
		return Upstream{}, invalid("the gateway's token or password is required")
	}
	if err := checkSecret(up.Auth, up.Secret); err != nil {
		return Upstream{}, err
	}
	if (s.CACert != "" || s.InsecureSkipVerify) && u.Scheme != "wss" {
		return Upstream{}, invalid("caCert and insecureSkipVerify apply to wss:// urls only")
	}
	if s.CACert != "" && s.InsecureSkipVerify {
		return Upstream{}, invalid("give caCert or insecureSkipVerify, not both")
	}
	if len(s.CACert) > maxCACert {
		return Upstream{}, invalid("caCert must be at most %d bytes", maxCACert)
	}
	if s.CACert != "" && !x509.NewCertPool().AppendCertsFromPEM([]byte(s.CACert)) {
		return Upstream{}, invalid("caCert holds no PEM certificate")
	}
	p := s.Publish
	switch p.Mode {
	case "", PublishAll:
		if p.Group != "" || len(p.Nodes) > 0 {
			return Upstream{}, invalid("publish mode all takes no group or nodes")
		}
		up.Publish = Publish{Mode: PublishAll}
	case PublishGroup:
		if !ValidGroupName(p.Group) || len(p.Nodes) > 0 {
			return Upstream{}, invalid("publish mode group needs a group name (1-64 characters of [A-Za-z0-9_-]) and no nodes")
		}
		up.Publish = Publish{Mode: PublishGroup, Group: p.Group}
	case PublishNodes:
		if len(p.Nodes) == 0 || len(p.Nodes) > maxListLen || p.Group != "" {
			return Upstream{}, invalid("publish mode nodes needs 1-%d node ids and no group", maxListLen)
		}
		for _, n := range p.Nodes {
			if err := wire.ValidNodeID(n); err != nil {
				return Upstream{}, invalid("%v", err)
			}
		}
		up.Publish = Publish{Mode: PublishNodes, Nodes: dedupe(p.Nodes)}
	default:
		return Upstream{}, invalid("publish mode must be %q, %q or %q, not %q", PublishAll, PublishGroup, PublishNodes, p.Mode)
	}
	return up, nil
}

// AddUpstream checks and stores an upstream of the tenant; ErrConflict if
// the name is taken. It returns the upstream, which carries the gateway's
// secret (callers must not echo it). The caller token for its calls
// through xiaoclaw's gateway is stored hashed; with ManagerConfig.Upstreams
// it goes to the shims in the upstream's bucket entry and is returned
// empty, else it is returned, to be shown this once.
func (m *Manager) AddUpstream(ctx context.Context, tenant string, s UpstreamSpec) (Upstream, string, error) {
	up, err := checkUpstream(tenant, s)
	if err != nil {
		return Upstream{}, "", err
	}
	if err := wire.ValidTenant(tenant); err != nil {
		return Upstream{}, "", fmt.Errorf("tenant %q: %w", tenant, ErrNotFound)
	}
	caller := newUpstreamCallerToken(tenant, up.Name)
	up.CallerHash = hashToken(caller)
	up.CreatedAt = m.now()
	if err := m.cfg.Store.CreateUpstream(ctx, up); err != nil {
		return Upstream{}, "", fmt.Errorf("upstream %q: %w", up.Name, err)
	}
	if m.cfg.Upstreams != nil {
		if err := m.cfg.Upstreams.Deliver(ctx, up, caller); err != nil {
			m.cfg.Log.Warn("upstream not delivered to the shims; the gateways' sync retries", "upstream", up, "err", err)
		}
		caller = ""
	}
	m.notify(ctx, tenant, wire.ChangeUpstream, up.Name)
	return up, caller, nil
}

// RemoveUpstream deletes an upstream of the tenant.
func (m *Manager) RemoveUpstream(ctx context.Context, tenant, name string) error {
	if !ValidUpstreamName(name) {
		return fmt.Errorf("upstream %q: %w", name, ErrNotFound)
	}
	if err := m.cfg.Store.DeleteUpstream(ctx, tenant, name, m.now()); err != nil {
		return err
	}
	if m.cfg.Upstreams != nil {
		if err := m.cfg.Upstreams.Withdraw(ctx, tenant, name); err != nil {
			m.cfg.Log.Warn("upstream not withdrawn from the shims; the gateways' sync retries", "tenant", tenant, "name", name, "err", err)
		}
	}
	m.notify(ctx, tenant, wire.ChangeUpstream, name)
	return nil
}
