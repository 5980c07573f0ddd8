package gateway

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/protocol"
)

// scopeSet holds the operator scopes the gateway checks.
type scopeSet uint8

const (
	scopeRead scopeSet = 1 << iota
	scopeWrite
	scopeAdmin
	scopePairing
)

// allows reports whether the set satisfies required: admin satisfies
// everything, write satisfies read.
func (s scopeSet) allows(required string) bool {
	if s&scopeAdmin != 0 {
		return true
	}
	switch required {
	case protocol.ScopeRead:
		return s&(scopeRead|scopeWrite) != 0
	case protocol.ScopeWrite:
		return s&scopeWrite != 0
	case protocol.ScopePairing:
		return s&scopePairing != 0
	case "":
		return true
	}
	return false
}

// grantScopes caps the requested scopes by the principal's role: an admin
// gets every scope it asks for, an operator only operator.read and
// operator.write (and operator.pairing, which only lists nodes here), a
// viewer only operator.read. The order is the request's.
func grantScopes(role string, requested []string) ([]string, scopeSet) {
	granted := make([]string, 0, len(requested))
	var set scopeSet
	for _, sc := range requested {
		ok := false
		switch role {
		case access.RoleAdmin:
			ok = sc != ""
		case access.RoleOperator:
			ok = sc == protocol.ScopeRead || sc == protocol.ScopeWrite || sc == protocol.ScopePairing
		case access.RoleViewer:
			ok = sc == protocol.ScopeRead
		}
		if !ok || slices.Contains(granted, sc) {
			continue
		}
		granted = append(granted, sc)
		switch sc {
		case protocol.ScopeRead:
			set |= scopeRead
		case protocol.ScopeWrite:
			set |= scopeWrite
		case protocol.ScopeAdmin:
			set |= scopeAdmin
		case protocol.ScopePairing:
			set |= scopePairing
		}
	}
	return granted, set
}

// handleConnect runs the connect handshake in OpenClaw's order: params,
// protocol, role, token, device identity, then hello-ok.
func (c *conn) handleConnect(req protocol.Request) {
	audit := ConnectAudit{Time: time.Now(), Instance: c.s.cfg.Instance, ConnID: c.id, RemoteIP: c.remoteIP}
	source := authguard.Source(c.remoteIP)
	// refuse records the refusal and ends the handshake. A refusal before
	// a token was accepted spends the source's failure budget and is
	// folded with the source's others into one audit record per interval.
	refuse := func(e *protocol.Error, code int, reason string) {
		audit.ErrorCode, audit.Reason = e.DetailCode(), e.Message
		if audit.ErrorCode == "" {
			audit.ErrorCode = e.Code
		}
		if audit.Principal.Tenant == "" && !e.Retryable {
			c.s.authFails.Failed(source, audit)
		} else { // accepted token, or a store outage: not the client's failure
			c.s.auditConnect(audit)
		}
		c.failHandshake(req.ID, e, code, reason)
	}
	if wait := c.s.authFails.RetryAfter(source); wait > 0 {
		e := protocol.RateLimited(wait)
		audit.ErrorCode, audit.Reason = e.DetailCode(), e.Message
		c.s.authFails.Throttled(source, audit)
		c.s.log.Info("connect throttled", "conn", c.id, "remote", c.remoteIP, "retry_after", wait)
		c.failHandshake(req.ID, e, protocol.ClosePolicyViolation, e.Message)
		return
	}
	p, why := protocol.ParseConnect(req.Params)
	if p == nil {
		msg := "invalid connect params: " + why
		refuse(protocol.InvalidRequest(msg), protocol.ClosePolicyViolation, msg)
		return
	}
	audit.Role, audit.ClientID, audit.ClientMode = p.RoleOrDefault(), protocol.Str(p.Client.ID), protocol.Str(p.Client.Mode)
	proto, ok := protocol.Negotiate(*p.MinProtocol, *p.MaxProtocol)
	if !ok {
		refuse(protocol.ProtocolMismatch(*p.MinProtocol, *p.MaxProtocol),
			protocol.CloseProtocolError, protocol.ReasonProtocolMismatch)
		return
	}
	role := p.RoleOrDefault()
	if role != protocol.RoleOperator && role != protocol.RoleNode {
		refuse(protocol.InvalidRole(), protocol.ClosePolicyViolation, protocol.ReasonInvalidRole)
		return
	}
	scopes := p.ScopesOrEmpty()

	authClient := protocol.AuthClient{
		ID: protocol.Str(p.Client.ID), Mode: protocol.Str(p.Client.Mode), Local: c.local, Device: p.Device != nil,
	}
	token := ""
	if p.Auth != nil {
		token = protocol.Str(p.Auth.Token)
		authClient.HasToken = token != ""
		authClient.HasDevTk = protocol.Str(p.Auth.DeviceToken) != ""
	}
	rejectAuth := func(reason string) {
		e := protocol.AuthFailed(reason, authClient)
		if reason == protocol.AuthUnavailable {
			e.Retryable = true
		}
		c.s.log.Info("connect unauthorized", "conn", c.id, "remote", c.remoteIP, "client", authClient.ID, "reason", reason)
		refuse(e, protocol.ClosePolicyViolation, e.Message)
	}
	if token == "" {
		if authClient.HasDevTk {
			// xiaoclaw issues no device tokens, so none can match.
			rejectAuth(protocol.AuthDeviceTokenInvalid)
		} else {
			rejectAuth(protocol.AuthTokenMissing)
		}
		return
	}
	actx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	principal, err := c.s.cfg.Auth.AuthenticateOperator(actx, token)
	cancel()
	if c.closing.Load() {
		return // the handshake timed out while the credential was checked
	}
	switch {
	case errors.Is(err, access.ErrUnauthenticated):
		rejectAuth(protocol.AuthTokenMismatch)
		return
	case err != nil:
		c.s.log.Warn("operator authentication failed", "conn", c.id, "err", err)
		rejectAuth(protocol.AuthUnavailable)
		return
	case wire.ValidTenant(principal.Tenant) != nil:
		c.s.log.Error("authenticator returned an invalid tenant", "tenant", principal.Tenant)
		rejectAuth(protocol.AuthUnavailable)
		return
	}
	audit.Principal = principal

	if p.Device == nil {
		if role == protocol.RoleNode {
			refuse(protocol.DeviceIdentityRequired(), protocol.ClosePolicyViolation, protocol.ReasonDeviceRequired)
			return
		}
	} else if _, fail := protocol.VerifyDevice(protocol.DeviceCheck{
		Params: p, Role: role, Scopes: scopes, Nonce: c.nonce, NowMs: time.Now().UnixMilli(),
	}); fail != nil {
		c.s.log.Info("device proof refused", "conn", c.id, "remote", c.remoteIP, "reason", fail.Reason)
		refuse(protocol.DeviceAuthFailed(*fail), protocol.ClosePolicyViolation, fail.Message)
		return
	}

	var granted []string
	var set scopeSet
	if role == protocol.RoleNode {
		if principal.Role != access.RoleAdmin && principal.Role != access.RoleOperator {
			rejectAuth(protocol.AuthRoleNotAllowed)
			return
		}
		nodeID := protocol.Str(p.Device.ID)
		if err := wire.ValidNodeID(nodeID); err != nil {
			refuse(protocol.DeviceAuthFailed(protocol.DeviceIDMismatch), protocol.ClosePolicyViolation, protocol.DeviceIDMismatch.Message)
			return
		}
		c.nodeID, audit.NodeID = nodeID, nodeID
		granted = []string{}
	} else {
		granted, set = grantScopes(principal.Role, scopes)
	}
	c.protocol, c.role, c.principal, c.scopes, c.token = proto, role, principal, set, token
	if e := c.s.takeConnSlot(c); e != nil {
		c.s.log.Info("connect refused: connection cap", "conn", c.id, "tenant", principal.Tenant, "principal", principal.ID)
		refuse(e, protocol.ClosePolicyViolation, e.Message)
		return
	}

	hello := c.s.hello(c, granted)
	if role == protocol.RoleOperator {
		// hello-ok is queued and the connection joins its tenant's event
		// fan-out under one lock: an event fanned out before is one the
		// client could not have caused after its hello.
		c.s.mu.Lock()
		c.respond(req.ID, hello)
		c.helloDone.Store(true)
		set := c.s.operators[principal.Tenant]
		if set == nil {
			set = map[*conn]struct{}{}
			c.s.operators[principal.Tenant] = set
		}
		set[c] = struct{}{}
		c.s.mu.Unlock()
	} else {
		// A node host gets hello-ok before it can receive any invoke: the
		// invoke subscription and the registry record come after.
		c.s.mu.Lock()
		c.respond(req.ID, hello)
		c.helloDone.Store(true)
		c.s.mu.Unlock()
		if err := c.s.attachNodeHost(c, p); err != nil {
			c.s.log.Warn("register node host", "conn", c.id, "node", c.nodeID, "err", err)
			c.closeWith(protocol.CloseServiceRestart, "node registration failed")
			return
		}
	}
	audit.Accepted = true
	c.s.auditConnect(audit)
	c.s.log.Debug("connected", "conn", c.id, "tenant", principal.Tenant, "principal", principal.ID, "role", role,
		"protocol", proto, "client", authClient.ID, "scopes", granted)
}

// hello builds hello-ok for a connection.
func (s *Service) hello(c *conn, granted []string) []byte {
	h := protocol.Hello{
		Type:     "hello-ok",
		Protocol: c.protocol,
		Server:   protocol.HelloServer{Version: s.cfg.Version, ConnID: c.id},
		Features: protocol.Features{Methods: methodNames, Events: eventNames},
		Snapshot: protocol.Snapshot{UptimeMs: time.Since(s.started).Milliseconds()},
		Auth:     protocol.HelloAuth{Role: c.role, Scopes: granted},
		Policy: protocol.Policy{
			MaxPayload:       s.cfg.MaxPayload,
			MaxBufferedBytes: s.cfg.MaxBufferedBytes,
			TickIntervalMs:   s.cfg.TickInterval.Milliseconds(),
		},
	}
	if c.protocol >= protocol.V4 {
		h.Auth.Method = "token"
		h.Snapshot.AuthMode = "token"
	}
	return h.Encode()
}

// auditConnect hands a to the ConnectAuditor, if any.
func (s *Service) auditConnect(a ConnectAudit) {
	if s.cfg.ConnectAuditor != nil {
		s.cfg.ConnectAuditor.AuditConnect(a)
	}
}
