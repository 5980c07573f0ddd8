package protocol

import "encoding/json"

// Roles a connection can claim.
const (
	RoleOperator = "operator"
	RoleNode     = "node"
)

// ConnectParams are the params of the first request. Pointers tell a
// missing field from an empty one; unknown fields (current clients add
// buildId, timeZone, computerUse, ...) are ignored.
type ConnectParams struct {
	MinProtocol *int64          `json:"minProtocol"`
	MaxProtocol *int64          `json:"maxProtocol"`
	Client      *ClientInfo     `json:"client"`
	Caps        []string        `json:"caps"`
	Commands    []string        `json:"commands"`
	Permissions map[string]bool `json:"permissions"`
	PathEnv     *string         `json:"pathEnv"`
	Role        *string         `json:"role"`
	Scopes      []string        `json:"scopes"`
	Auth        *ConnectAuth    `json:"auth"`
	Device      *DeviceProof    `json:"device"`
	Locale      *string         `json:"locale"`
	UserAgent   *string         `json:"userAgent"`
}

// ClientInfo identifies the client program.
type ClientInfo struct {
	ID              *string `json:"id"`
	DisplayName     *string `json:"displayName"`
	Version         *string `json:"version"`
	Platform        *string `json:"platform"`
	DeviceFamily    *string `json:"deviceFamily"`
	ModelIdentifier *string `json:"modelIdentifier"`
	Mode            *string `json:"mode"`
	InstanceID      *string `json:"instanceId"`
}

// ConnectAuth carries the credentials.
type ConnectAuth struct {
	Token          *string `json:"token"`
	BootstrapToken *string `json:"bootstrapToken"`
	DeviceToken    *string `json:"deviceToken"`
	Password       *string `json:"password"`
}

// DeviceProof is the signed device identity.
type DeviceProof struct {
	ID        *string `json:"id"`
	PublicKey *string `json:"publicKey"`
	Signature *string `json:"signature"`
	SignedAt  *int64  `json:"signedAt"`
	Nonce     *string `json:"nonce"`
}

// Str returns *p or "".
func Str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// ParseConnect decodes and validates connect params as OpenClaw's
// ConnectParams schema does (required fields, non-empty strings, integer
// ranges). The message is the "invalid connect params: ..." suffix.
func ParseConnect(params json.RawMessage) (*ConnectParams, string) {
	if firstByte(params) != '{' {
		return nil, "must be object"
	}
	var p ConnectParams
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, DescribeJSONError(err)
	}
	if msg := p.validate(); msg != "" {
		return nil, msg
	}
	return &p, ""
}

func required(name string) string { return "must have required property '" + name + "'" }

func nonEmpty(path string, v *string) string {
	if v != nil && *v == "" {
		return "at " + path + ": must NOT have fewer than 1 characters"
	}
	return ""
}

func (p *ConnectParams) validate() string {
	switch {
	case p.MinProtocol == nil:
		return required("minProtocol")
	case p.MaxProtocol == nil:
		return required("maxProtocol")
	case *p.MinProtocol < 1:
		return "at /minProtocol: must be >= 1"
	case *p.MaxProtocol < 1:
		return "at /maxProtocol: must be >= 1"
	case p.Client == nil:
		return required("client")
	}
	c := p.Client
	for _, f := range []struct {
		name string
		v    *string
	}{{"id", c.ID}, {"version", c.Version}, {"platform", c.Platform}, {"mode", c.Mode}} {
		if f.v == nil {
			return "at /client: " + required(f.name)
		}
	}
	for _, f := range []struct {
		path string
		v    *string
	}{
		{"/client/id", c.ID}, {"/client/version", c.Version}, {"/client/platform", c.Platform},
		{"/client/mode", c.Mode}, {"/client/displayName", c.DisplayName},
		{"/client/deviceFamily", c.DeviceFamily}, {"/client/modelIdentifier", c.ModelIdentifier},
		{"/client/instanceId", c.InstanceID}, {"/role", p.Role},
	} {
		if msg := nonEmpty(f.path, f.v); msg != "" {
			return msg
		}
	}
	if d := p.Device; d != nil {
		for _, f := range []struct {
			name string
			v    *string
		}{{"id", d.ID}, {"publicKey", d.PublicKey}, {"signature", d.Signature}} {
			if f.v == nil {
				return "at /device: " + required(f.name)
			}
			if msg := nonEmpty("/device/"+f.name, f.v); msg != "" {
				return msg
			}
		}
		if d.SignedAt == nil {
			return "at /device: " + required("signedAt")
		}
		if *d.SignedAt < 0 {
			return "at /device/signedAt: must be >= 0"
		}
	}
	return ""
}

// RoleOrDefault is the claimed role; a missing role means operator.
func (p *ConnectParams) RoleOrDefault() string {
	if p.Role == nil {
		return RoleOperator
	}
	return *p.Role
}

// ScopesOrEmpty is the requested scopes; missing means none.
func (p *ConnectParams) ScopesOrEmpty() []string {
	if p.Scopes == nil {
		return []string{}
	}
	return p.Scopes
}

// IsNodeClient reports role node with client mode node.
func (p *ConnectParams) IsNodeClient() bool {
	return p.RoleOrDefault() == RoleNode && Str(p.Client.Mode) == RoleNode
}

// Negotiate picks the protocol for a client's range: 4 when the range holds
// it, else 3 (accepted from node hosts as OpenClaw does, and from S-era
// clients generally). ok is false on a mismatch.
func Negotiate(minProtocol, maxProtocol int64) (protocol int, ok bool) {
	if minProtocol <= V4 && V4 <= maxProtocol {
		return V4, true
	}
	if minProtocol <= V3 && V3 <= maxProtocol {
		return V3, true
	}
	return 0, false
}

// SignatureToken is the token bound into the device signature: the first
// present of auth.token, auth.deviceToken, auth.bootstrapToken.
func (p *ConnectParams) SignatureToken() string {
	if a := p.Auth; a != nil {
		switch {
		case a.Token != nil:
			return *a.Token
		case a.DeviceToken != nil:
			return *a.DeviceToken
		case a.BootstrapToken != nil:
			return *a.BootstrapToken
		}
	}
	return ""
}
