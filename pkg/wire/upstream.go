package wire

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
)

// Upstream authentication kinds and publish modes of an UpstreamEntry (the
// same words as the admin API's).
const (
	UpstreamAuthToken    = "token"
	UpstreamAuthPassword = "password"

	PublishAll   = "all"   // every node of the tenant
	PublishGroup = "group" // the members of Group, resolved into Nodes
	PublishNodes = "nodes" // the node ids in Nodes
)

// Bounds of an UpstreamEntry: an entry is at most a few hundred KB.
const (
	maxUpstreamName   = 64
	maxUpstreamURL    = 2048
	maxUpstreamSecret = 4096
	maxUpstreamCACert = 64 << 10
	maxUpstreamNodes  = 1000
	maxCallerToken    = 256
)

// UpstreamEntry is the value of a BucketUpstreams entry: everything a shim
// needs to publish a tenant's nodes to one OpenClaw gateway.
type UpstreamEntry struct {
	Tenant string `json:"tenant"`
	Name   string `json:"name"` // [A-Za-z0-9_-]{1,64}; the principal is "upstream:<name>"
	URL    string `json:"url"`  // ws:// or wss://
	// Auth says what Secret is: UpstreamAuthToken or UpstreamAuthPassword.
	Auth   string `json:"auth"`
	Secret string `json:"secret"`
	// CACert is a PEM bundle trusted on top of the system roots for a
	// wss:// URL; InsecureSkipVerify accepts any certificate.
	CACert             string `json:"caCert,omitempty"`
	InsecureSkipVerify bool   `json:"insecureSkipVerify,omitempty"`
	// Publish is PublishAll, PublishGroup or PublishNodes. For a group,
	// Group names it and Nodes holds its members as the gateway resolved
	// them (the entry is rendered again when the group changes).
	Publish string   `json:"publish"`
	Group   string   `json:"group,omitempty"`
	Nodes   []string `json:"nodes,omitempty"`
	// CallerToken is the xiaoclaw operator token (xcu_…) of the upstream's
	// calls through xiaoclaw's gateway; the tenancy store keeps its hash.
	CallerToken string `json:"callerToken"`
}

// UpstreamKey is the BucketUpstreams key of a tenant's upstream.
func UpstreamKey(tenant, name string) string { return tenant + "." + name }

// String leaves the secrets out, so that %v and %+v never show them.
func (e UpstreamEntry) String() string {
	return "upstream " + e.Name + " of tenant " + e.Tenant + " at " + e.URL
}

// GoString implements fmt.GoStringer without the secrets.
func (e UpstreamEntry) GoString() string { return e.String() }

// LogValue implements slog.LogValuer without the secrets.
func (e UpstreamEntry) LogValue() slog.Value {
	return slog.GroupValue(slog.String("tenant", e.Tenant), slog.String("name", e.Name), slog.String("url", e.URL))
}

// Publishes reports whether the upstream sees node.
func (e UpstreamEntry) Publishes(node string) bool {
	if e.Publish == PublishAll {
		return true
	}
	for _, n := range e.Nodes {
		if n == node {
			return true
		}
	}
	return false
}

// Validate reports an entry a shim cannot use.
func (e UpstreamEntry) Validate() error {
	if err := ValidTenant(e.Tenant); err != nil {
		return err
	}
	if len(e.Name) > maxUpstreamName || ValidNodeID(e.Name) != nil {
		return fmt.Errorf("upstream name %q must be 1-%d characters of [A-Za-z0-9_-]", e.Name, maxUpstreamName)
	}
	u, err := url.Parse(e.URL)
	if err != nil || len(e.URL) > maxUpstreamURL || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return fmt.Errorf("upstream %s: url must be ws://… or wss://…", e.Name)
	}
	switch e.Auth {
	case UpstreamAuthToken, UpstreamAuthPassword:
	default:
		return fmt.Errorf("upstream %s: auth must be %q or %q, not %q", e.Name, UpstreamAuthToken, UpstreamAuthPassword, e.Auth)
	}
	if e.Secret == "" || len(e.Secret) > maxUpstreamSecret || hasControl(e.Secret) {
		return fmt.Errorf("upstream %s: the gateway's %s must be 1-%d bytes without control characters", e.Name, e.Auth, maxUpstreamSecret)
	}
	if len(e.CACert) > maxUpstreamCACert {
		return fmt.Errorf("upstream %s: caCert must be at most %d bytes", e.Name, maxUpstreamCACert)
	}
	if (e.CACert != "" || e.InsecureSkipVerify) && u.Scheme != "wss" {
		return fmt.Errorf("upstream %s: caCert and insecureSkipVerify apply to wss:// urls only", e.Name)
	}
	switch e.Publish {
	case PublishAll:
		if len(e.Nodes) > 0 {
			return fmt.Errorf("upstream %s: publish all takes no nodes", e.Name)
		}
	case PublishGroup, PublishNodes:
		if len(e.Nodes) > maxUpstreamNodes {
			return fmt.Errorf("upstream %s: at most %d nodes", e.Name, maxUpstreamNodes)
		}
		for _, n := range e.Nodes {
			if err := ValidNodeID(n); err != nil {
				return fmt.Errorf("upstream %s: %w", e.Name, err)
			}
		}
	default:
		return fmt.Errorf("upstream %s: publish must be %q, %q or %q, not %q", e.Name, PublishAll, PublishGroup, PublishNodes, e.Publish)
	}
	if e.CallerToken == "" || len(e.CallerToken) > maxCallerToken || hasControl(e.CallerToken) ||
		strings.ContainsAny(e.CallerToken, " ") {
		return fmt.Errorf("upstream %s: caller token missing or malformed", e.Name)
	}
	return nil
}

// ParseUpstreamEntry decodes and validates a BucketUpstreams value.
func ParseUpstreamEntry(b []byte) (UpstreamEntry, error) {
	var e UpstreamEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return UpstreamEntry{}, fmt.Errorf("upstream entry: %w", err)
	}
	if err := e.Validate(); err != nil {
		return UpstreamEntry{}, fmt.Errorf("upstream entry: %w", err)
	}
	return e, nil
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return true
		}
	}
	return false
}
