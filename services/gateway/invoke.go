package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/toolcall"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/idempotency"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/protocol"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/registry"
)

// invokeOrigin is who asked for a node.invoke: an operator's WebSocket
// connection or an MCP session (mcp.go). From Service.invoke on, both take
// one path: params, size cap, node, declared command, tool-call parser,
// policy, in-flight cap, idempotency, attempt and outcome audit, tracing
// and the NATS request.
type invokeOrigin struct {
	principal   access.Principal
	protocol    int             // WebSocket protocol version (the shape of a denial)
	ctx         context.Context // parent of the call's span
	requestID   string
	traceparent string
	via         string // the audit's Via: "" (WebSocket) or ViaMCP
	client      string // the MCP client's name/version, for the audit
	// admit counts the call against the origin's requests in flight:
	// overCap past its cap (the call is refused), !ok when the origin is
	// gone (the call is dropped unanswered). release undoes it.
	admit   func() (overCap, ok bool)
	release func()
	// answer is called once per admitted call: with the result payload,
	// or with the error (e != nil).
	answer func(result []byte, e *protocol.Error)
}

// invokeCall is one node.invoke on its way through the gateway.
type invokeCall struct {
	s        *Service
	o        *invokeOrigin
	inv      protocol.NodeInvoke
	node     *registry.Node
	subject  string
	body     []byte
	deadline time.Time
	areq     access.Request // the policy question, asked on the call's goroutine
	overCap  bool           // the connection had MaxInflightPerConn calls in flight
	audit    InvokeAudit
	// ctx carries span, the call's node.invoke span.
	ctx  context.Context
	span *telemetry.Span
}

// handleNodeInvoke answers node.invoke on the connection.
func (c *conn) handleNodeInvoke(req protocol.Request) {
	c.s.invoke(&invokeOrigin{principal: c.principal, protocol: c.protocol, ctx: c.ctx, requestID: req.ID,
		traceparent: req.Traceparent, admit: c.admit, release: func() { c.inflight.Add(-1) },
		answer: func(result []byte, e *protocol.Error) {
			if e != nil {
				c.send(protocol.AppendErrorResponse(nil, req.ID, e))
				return
			}
			c.send(protocol.AppendResponse(make([]byte, 0, len(result)+len(req.ID)+40), req.ID, result))
		}}, req.Params)
}

// invoke runs the checks that need neither network nor storage (params,
// node, declared command) on the caller's goroutine (a connection's read
// loop), then hands the call to a goroutine: the policy decision (which
// may load the tenant's policy), the audit records, the idempotency claim
// and the NATS request all wait on other services, and the read loop must
// stay free for the next frame.
func (s *Service) invoke(o *invokeOrigin, params json.RawMessage) {
	call := &invokeCall{s: s, o: o}
	if !call.admit() {
		return
	}
	call.audit = InvokeAudit{Time: time.Now(), Instance: s.cfg.Instance, RequestID: o.requestID, Principal: o.principal,
		CallID: newID(), Via: o.via, Client: o.client}
	call.ctx, call.span = telemetry.StartOperatorRequest(o.ctx, s.tracer, protocol.MethodNodeInvoke, o.traceparent,
		telemetry.CallInfo{Tenant: o.principal.Tenant, Principal: o.principal.ID})
	call.audit.TraceID, call.audit.SpanID = telemetry.TraceIDs(call.ctx)
	inv, perr := protocol.ParseNodeInvoke(params)
	if perr != nil {
		call.reject(perr, OutcomeRejected)
		return
	}
	call.inv = inv
	call.audit.NodeID, call.audit.Command, call.audit.IdempotencyKey = inv.NodeID, inv.Command, inv.IdempotencyKey
	if len(inv.Params) > s.cfg.MaxInvokeParams {
		call.reject(protocol.PayloadTooLarge(len(inv.Params), s.cfg.MaxInvokeParams), OutcomeRejected)
		return
	}
	if protocol.IsExecApprovalsCommand(inv.Command) {
		call.reject(protocol.ExecApprovalsNotInvokable(inv.Command), OutcomeRejected)
		return
	}
	n := s.reg.Get(o.principal.Tenant, inv.NodeID)
	if n == nil { // also another tenant's node: it must look the same
		call.reject(protocol.UnknownNodeID(), OutcomeRejected)
		return
	}
	if !n.Connected {
		call.reject(protocol.NodeNotConnected(), OutcomeRejected)
		return
	}
	call.node = n
	call.audit.NodeKind = n.Kind
	if len(n.Commands) == 0 {
		call.reject(protocol.CommandNotAllowed(protocol.ReasonNoCommands, n.Platform, inv.Command), OutcomeRejected)
		return
	}
	if !n.HasCommand(inv.Command) {
		call.reject(protocol.CommandNotAllowed(protocol.ReasonNotDeclared, n.Platform, inv.Command), OutcomeRejected)
		return
	}
	areq := access.Request{Principal: o.principal, NodeID: n.NodeID, Command: inv.Command}
	call.audit.Args = inv.Params
	if toolcall.IsToolCall(inv.Command) {
		// The shim reads the call with the same parser: the policy decides
		// on the tool and arguments the device will get.
		tc, err := toolcall.Parse(inv.Command, inv.Params)
		if err != nil {
			call.reject(protocol.InvalidRequest("invalid "+inv.Command+" params: "+err.Error()), OutcomeRejected)
			return
		}
		areq.Tool, areq.Args = tc.Tool, tc.Arguments
		call.audit.Tool, call.audit.Args = tc.Tool, tc.Arguments
	}
	call.span.AddInfo(telemetry.CallInfo{Node: n.NodeID, Command: inv.Command, Tool: areq.Tool})
	call.areq = areq

	timeout := s.cfg.DefaultInvokeTimeout
	if inv.TimeoutMs > 0 {
		timeout = time.Duration(inv.TimeoutMs) * time.Millisecond
	}
	timeout = min(timeout, s.cfg.MaxInvokeTimeout)
	call.deadline = call.audit.Time.Add(timeout)
	if n.Kind == wire.NodeKindOpenClaw {
		call.subject = wire.OpenClawNodeInvoke(n.Tenant, n.NodeID)
	} else {
		call.subject = wire.NodeInvoke(n.Tenant)
	}
	call.body = encodeInvokeRequest(&inv)
	s.workers.Go(call.run)
}

// admit counts the call against the origin's requests in flight
// (conn.admit for a connection) and the gateway's shutdown wait; the call's
// goroutine releases both. It reports whether the call goes on.
func (call *invokeCall) admit() bool {
	o, s := call.o, call.s
	overCap, ok := o.admit()
	if !ok {
		return false
	}
	call.overCap = overCap
	// Registering under the lock orders this Add before shutdown's Wait.
	s.mu.RLock()
	if s.draining.Load() {
		s.mu.RUnlock()
		o.release()
		o.answer(nil, protocol.Unavailable("gateway shutting down; retry on another replica", true))
		return false
	}
	s.inflightWG.Add(1)
	s.mu.RUnlock()
	return true
}

// release ends what admit began.
func (call *invokeCall) release() {
	call.o.release()
	call.s.inflightWG.Done()
}

// encodeInvokeRequest builds a wire.InvokeRequest without re-validating the
// params, which the frame decoder already checked.
func encodeInvokeRequest(inv *protocol.NodeInvoke) []byte {
	b := make([]byte, 0, 96+len(inv.NodeID)+len(inv.Command)+len(inv.Params)+len(inv.IdempotencyKey))
	b = append(b, `{"nodeId":`...)
	b = protocol.AppendString(b, inv.NodeID)
	b = append(b, `,"command":`...)
	b = protocol.AppendString(b, inv.Command)
	if len(inv.Params) > 0 {
		b = append(b, `,"params":`...)
		b = append(b, inv.Params...)
	}
	if inv.IdempotencyKey != "" {
		b = append(b, `,"idempotencyKey":`...)
		b = protocol.AppendString(b, inv.IdempotencyKey)
	}
	return append(b, '}')
}

// run asks the policy, claims the idempotency key, records the attempt,
// sends the request and answers.
func (call *invokeCall) run() {
	o, s := call.o, call.s
	defer call.release()
	dec := s.cfg.Authorizer.Authorize(call.ctx, call.areq)
	call.audit.Decision = dec
	if dec.Allowed {
		s.metrics.allowed.Inc()
	} else {
		s.metrics.denied.Inc()
		call.span.SetDenyingRule(dec.RuleID)
	}
	if !dec.Allowed {
		call.refuse(protocol.PolicyDenied(o.protocol, call.inv.Command, call.areq.Tool, dec.RuleID, dec.Reason), OutcomeDenied)
		return
	}
	if call.overCap {
		call.refuse(protocol.Unavailable("too many node.invoke calls in flight on this connection or session", true), OutcomeRejected)
		return
	}
	ctx, cancel := context.WithDeadline(s.runCtx, call.deadline)
	defer cancel()

	fp := idempotency.Fingerprint(call.inv.NodeID, call.inv.Command, call.inv.Params)
	claim, prior, err := s.idem.Begin(ctx, idempotency.Key(o.principal.Tenant, call.inv.IdempotencyKey), fp, s.cfg.Instance)
	switch {
	case errors.Is(err, idempotency.ErrConflict):
		call.refuse(protocol.IdempotencyConflict(), OutcomeRejected)
		return
	case err != nil && ctx.Err() != nil:
		call.refuse(protocol.InvokeTimedOut(false), OutcomeTimeout)
		return
	case err != nil:
		s.log.Warn("idempotency store", "err", err)
		call.refuse(protocol.Unavailable("idempotency store unavailable; retry", true), OutcomeError)
		return
	case prior != nil:
		call.replay(prior)
		return
	}

	// Fail closed before the node acts: a call the trail does not hold is
	// never sent.
	attempt := call.audit
	attempt.Attempt = true
	attempt.Latency = time.Since(call.audit.Time)
	if err := s.cfg.Auditor.AuditInvoke(ctx, attempt); err != nil {
		s.log.WarnContext(call.ctx, "node.invoke not audited", "request", o.requestID, "err", err)
		if err := s.idem.Abandon(claim); err != nil {
			s.log.Warn("idempotency record", "err", err)
		}
		call.answer(nil, protocol.Unavailable("audit unavailable: "+err.Error(), true))
		call.finish(OutcomeError, wire.FaultUnavailable, err)
		return
	}
	call.audit.Sent = true

	// The subject names the tenant; the deadline and the trace context are
	// all the headers a call needs.
	msg := &nats.Msg{Subject: call.subject, Data: call.body, Header: make(nats.Header, 2)}
	wire.SetTimeout(msg.Header, call.deadline)
	if call.node.Kind != wire.NodeKindOpenClaw {
		s.setInflightLimits(ctx, msg.Header, o.principal.Tenant)
	}
	telemetry.InjectMsg(call.ctx, msg)
	sent := time.Now()
	reply, err := s.nc.RequestMsgWithContext(ctx, msg)
	s.metrics.hopShim.Observe(time.Since(sent).Seconds())

	var payload []byte
	var perr *protocol.Error
	outcome, keep := OutcomeOK, true
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		perr, outcome, keep = protocol.NodeNotConnected(), OutcomeError, false
	case errors.Is(err, nats.ErrMaxPayload):
		perr, outcome, keep = protocol.InvalidRequest("node.invoke params too large for the bus (max "+
			strconv.FormatInt(s.nc.MaxPayload(), 10)+" bytes)"), OutcomeRejected, false
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
		perr, outcome, keep = protocol.InvokeTimedOut(true), OutcomeTimeout, false
	case err != nil:
		s.log.Warn("node.invoke request", "subject", call.subject, "err", err)
		perr, outcome, keep = protocol.Unavailable("failed to send invoke to node", true), OutcomeError, false
	default:
		var fault *wire.Fault
		payload, fault = decodeInvokeReply(reply)
		switch {
		case fault == nil:
		case fault.Code == wire.FaultNotConnected:
			perr, outcome, keep = protocol.NodeNotConnected(), OutcomeError, false
		case fault.Code == wire.FaultRateLimited || fault.Code == wire.FaultBusy:
			// Refused before the device: the key stays free for the retry.
			perr, outcome, keep = refusedByLimit(fault), OutcomeError, false
		default:
			perr, outcome = protocol.NodeFailed(fault.Code, fault.Message, true), OutcomeError
			if fault.Code == wire.FaultTimeout {
				outcome = OutcomeTimeout
			}
		}
	}

	var result []byte
	code := ""
	if perr == nil {
		result = invokeOKPayload(call.inv.NodeID, call.inv.Command, call.audit.TraceID, payload)
		call.answer(result, nil)
	} else {
		result = protocol.AppendError(nil, perr)
		code = errorCode(perr)
		call.answer(nil, perr)
	}
	call.audit.Outcome, call.audit.ErrorCode = outcome, code
	call.audit.Latency = time.Since(call.audit.Time)
	call.finish(outcome, code, nil)

	// The answer is out; record the outcome for retries with the same key.
	if keep {
		err = s.idem.Complete(claim, fp, perr == nil, result)
	} else {
		err = s.idem.Abandon(claim)
	}
	if err != nil {
		s.log.Warn("idempotency record", "err", err)
	}

	// The node has acted and its attempt is on record: the answer stands
	// whatever becomes of the outcome record.
	if err := s.cfg.Auditor.AuditInvoke(context.WithoutCancel(call.ctx), call.audit); err != nil {
		s.log.WarnContext(call.ctx, "node.invoke outcome not audited; its attempt is", "request", o.requestID, "outcome", outcome, "err", err)
	}
}

// replay answers with the outcome of an earlier call with the same key.
func (call *invokeCall) replay(prior *idempotency.Record) {
	call.audit.Replayed = true
	if prior.OK {
		call.answerAudited(prior.Result, nil, OutcomeOK)
		return
	}
	var e protocol.Error
	_ = json.Unmarshal(prior.Result, &e) // written by AppendError: encodes back to the same bytes
	call.answerAudited(nil, &e, OutcomeError)
}

// reject refuses a call from the read loop: its goroutine records the
// refusal and answers.
func (call *invokeCall) reject(e *protocol.Error, outcome string) {
	call.s.workers.Go(func() {
		defer call.release()
		call.refuse(e, outcome)
	})
}

// refuse answers a call refused before (or instead of) reaching the node.
func (call *invokeCall) refuse(e *protocol.Error, outcome string) {
	call.answerAudited(nil, e, outcome)
}

// answerAudited answers a call that never reached the node (refused or
// replayed): its one audit record first, then the answer. Fail closed: no
// answer the audit trail does not hold.
func (call *invokeCall) answerAudited(result []byte, e *protocol.Error, outcome string) {
	s := call.s
	code := ""
	if e != nil {
		code = errorCode(e)
	}
	call.audit.Outcome, call.audit.ErrorCode = outcome, code
	call.audit.Latency = time.Since(call.audit.Time)
	var failure error
	if err := s.cfg.Auditor.AuditInvoke(call.ctx, call.audit); err != nil {
		s.log.WarnContext(call.ctx, "node.invoke not audited", "request", call.o.requestID, "err", err)
		result, e = nil, protocol.Unavailable("audit unavailable: "+err.Error(), true)
		outcome, code, failure = OutcomeError, wire.FaultUnavailable, err
	}
	call.answer(result, e)
	call.finish(outcome, code, failure)
}

// answer answers the call once its span has started. The reply names the
// call's trace, as its audit row and log lines do: in the payload
// (invokeOKPayload) or in the error's details.
func (call *invokeCall) answer(result []byte, e *protocol.Error) {
	if e != nil && call.audit.TraceID != "" {
		e = e.WithTraceID(call.audit.TraceID)
	}
	call.o.answer(result, e)
}

// finish ends the call's span and metrics once its answer is sent.
func (call *invokeCall) finish(outcome, code string, failure error) {
	s := call.s
	tcode := traceCode(outcome, code)
	s.metrics.hopInvoke.Observe(time.Since(call.audit.Time).Seconds())
	call.span.End(tcode, failure)
	s.metrics.invokes.WithLabelValues(telemetry.LabelGateway, telemetry.CommandLabel(call.inv.Command), telemetry.OutcomeOf(tcode)).Inc()
}

// traceCode is the error code a call's span and metrics record: "" for
// success, telemetry.CodeDenied for a policy denial, TIMEOUT for a deadline,
// else the call's most specific error code.
func traceCode(outcome, code string) string {
	switch outcome {
	case OutcomeOK:
		return ""
	case OutcomeDenied:
		return telemetry.CodeDenied
	case OutcomeTimeout:
		return wire.FaultTimeout
	}
	if code == "" {
		return wire.FaultUnavailable
	}
	return code
}

// errorCode is the most specific code of an error: the node's error code,
// else details.code, else the ErrorShape code.
func errorCode(e *protocol.Error) string {
	var d struct {
		Code      string `json:"code"`
		NodeError struct {
			Code string `json:"code"`
		} `json:"nodeError"`
	}
	if len(e.Details) > 0 {
		_ = json.Unmarshal(e.Details, &d)
	}
	switch {
	case d.NodeError.Code != "":
		return d.NodeError.Code
	case d.Code != "":
		return d.Code
	}
	return e.Code
}

// invokeOKPayload is node.invoke's success payload, as OpenClaw sends it:
// the result parsed (payload) and as a JSON string (payloadJSON); xiaoclaw
// adds the call's traceId ("" omits it).
func invokeOKPayload(nodeID, command, traceID string, payload []byte) []byte {
	b := make([]byte, 0, 96+len(nodeID)+len(command)+2*len(payload))
	b = append(b, `{"ok":true,"nodeId":`...)
	b = protocol.AppendString(b, nodeID)
	b = append(b, `,"command":`...)
	b = protocol.AppendString(b, command)
	if traceID != "" {
		b = append(b, `,"traceId":`...)
		b = protocol.AppendString(b, traceID)
	}
	if len(payload) > 0 {
		b = append(b, `,"payload":`...)
		b = append(b, payload...)
		b = append(b, `,"payloadJSON":`...)
		b = protocol.AppendStringBytes(b, payload)
	}
	return append(b, '}')
}

// invokeReply decodes both reply forms on the invoke subjects: a
// wire.InvokeReply, or a bare wire.Fault marked with the Xc-Fault header.
type invokeReply struct {
	OK      bool            `json:"ok"`
	Payload json.RawMessage `json:"payload"`
	Error   *wire.Fault     `json:"error"`
	Code    string          `json:"code"`
	Message string          `json:"message"`
}

// decodeInvokeReply returns the result payload, or the fault.
func decodeInvokeReply(m *nats.Msg) (json.RawMessage, *wire.Fault) {
	var r invokeReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "malformed reply: " + err.Error()}
	}
	if r.Error != nil {
		return nil, r.Error
	}
	if h := m.Header.Get(wire.HeaderFault); h != "" {
		code := r.Code
		if code == "" {
			code = h
		}
		return nil, &wire.Fault{Code: code, Message: r.Message}
	}
	if !r.OK {
		return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "node invoke failed"}
	}
	if len(r.Payload) == 4 && string(r.Payload) == "null" {
		r.Payload = nil
	}
	return r.Payload, nil
}

// setInflightLimits tells the shim the tenant's in-flight limits, when they
// differ from the shim's defaults. When the tenancy store cannot be asked
// the call goes on under the shim's defaults: limits share capacity, they
// are not an authorization.
func (s *Service) setInflightLimits(ctx context.Context, h nats.Header, tenant string) {
	if s.cfg.Limits == nil {
		return
	}
	l, err := s.cfg.Limits.InflightLimits(ctx, tenant)
	if err != nil {
		s.log.Warn("tenant limits unavailable; the shim's defaults apply", "tenant", tenant, "err", err)
		return
	}
	wire.SetInflightLimits(h, l)
}

// refusedByLimit maps a BUSY or RATE_LIMITED fault, with its limit details
// when the sender gave them (the shim does, a devicehub's BUSY does not).
func refusedByLimit(f *wire.Fault) *protocol.Error {
	var d wire.LimitDetails
	if len(f.Details) > 0 && json.Unmarshal(f.Details, &d) != nil {
		d = wire.LimitDetails{}
	}
	return protocol.NodeRefused(f.Code, f.Message, d.Limit, d.Max, d.RetryAfterMs)
}
