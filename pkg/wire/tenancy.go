package wire

// SubjectTenancyChanged carries a TenancyChange after every committed change
// of a tenant, its credentials or its policy. Every gateway and devicehub
// replica subscribes (no queue group) and drops what it cached for the
// tenant, so revocations and policy edits take effect within a second.
const SubjectTenancyChanged = "xc._sys.tenancy.changed"

// Kinds of TenancyChange.
const (
	ChangeTenant    = "tenant"    // created, suspended, resumed or updated; ID is empty
	ChangeToken     = "token"     // an operator token was created or revoked; ID is the token id
	ChangeDeviceKey = "devicekey" // a device key was created or rotated; ID is the key id
	ChangeAllowlist = "allowlist" // the tenant's device allowlist was replaced
	ChangeRule      = "rule"      // a policy rule was added or removed; ID is the rule id
	ChangeGroup     = "group"     // a node group's members were replaced; ID is the group name
	ChangeUpstream  = "upstream"  // an upstream OpenClaw gateway was added or removed; ID is its name
	// ChangeResync means "anything of this tenant may have changed": sent by
	// the resync poller when it sees a tenant version it did not hear about.
	ChangeResync = "resync"
)

// TenancyChange is the payload of SubjectTenancyChanged. It names what
// changed, never the new state: receivers reload from the store.
type TenancyChange struct {
	Tenant string `json:"tenant"`
	Kind   string `json:"kind"`
	ID     string `json:"id,omitempty"`
}
