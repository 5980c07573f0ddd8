package shim

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/jsonobj"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/inflight"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/translate"
)

// onInvoke takes a node.invoke request off the subscription and runs it on
// a worker of its own, so one slow device never holds up the others.
func (s *Service) onInvoke(msg *nats.Msg) {
	ctx, span := telemetry.StartNATSHandler(context.Background(), s.tracer, msg, telemetry.CallInfo{})
	if len(msg.Data) > s.cfg.MaxRequestBytes {
		s.finish(msg, span, "", nil, &wire.Fault{Code: wire.FaultTooLarge, Message: "node.invoke request exceeds " + strconv.Itoa(s.cfg.MaxRequestBytes) + " bytes"})
		return
	}
	tenant, ok := wire.TenantFromSubject(msg.Subject)
	if !ok {
		s.finish(msg, span, "", nil, &wire.Fault{Code: wire.FaultInvalidRequest, Message: "invalid tenant"})
		return
	}
	limits, err := wire.ParseInflightLimits(msg.Header.Get(wire.HeaderInflightLimits))
	if err != nil {
		s.finish(msg, span, "", nil, &wire.Fault{Code: wire.FaultInvalidRequest, Message: err.Error()})
		return
	}
	// The tenant's share first: a tenant over it is refused without
	// touching the replica's slots, which stay for the others.
	share := cmp.Or(limits.Tenant, s.cfg.TenantMaxInFlight)
	tc := s.tenants.Tenant(tenant)
	if !tc.Acquire(share) {
		s.finish(msg, span, "", nil, s.refuse(tenant, wire.LimitTenant, share))
		return
	}
	select {
	case s.sem <- struct{}{}:
	default:
		tc.Release()
		s.finish(msg, span, "", nil, s.refuse(tenant, wire.LimitReplica, s.cfg.MaxInFlight))
		return
	}
	s.inflight.Add(1)
	s.workers.Go(func() {
		defer func() {
			<-s.sem
			tc.Release()
			s.inflight.Done()
		}()
		command, payload, fault := s.invoke(ctx, span, msg, tc, cmp.Or(limits.Device, s.cfg.DeviceMaxInFlight))
		s.finish(msg, span, command, payload, fault)
	})
}

// refuse counts a call refused by a limit and returns its fault: BUSY for
// the replica's and a device's limit, RATE_LIMITED for the tenant's share,
// with the limit and a retry hint in the details (wire.LimitDetails).
func (s *Service) refuse(tenant, limit string, max int) *wire.Fault {
	s.refused.WithLabelValues(telemetry.LabelShim, tenant, limit).Inc()
	f := &wire.Fault{Code: wire.FaultBusy}
	switch limit {
	case wire.LimitTenant:
		f.Code = wire.FaultRateLimited
		f.Message = "tenant has " + strconv.Itoa(max) + " invokes in flight, its limit on this shim replica"
	case wire.LimitDevice:
		f.Message = "device has " + strconv.Itoa(max) + " invokes in flight, the tenant's limit per device"
	default:
		f.Message = "shim replica has " + strconv.Itoa(max) + " invokes in flight, its limit"
	}
	d := make([]byte, 0, 64)
	d = append(d, `{"limit":"`...)
	d = append(d, limit...)
	d = append(d, `","max":`...)
	d = strconv.AppendInt(d, int64(max), 10)
	d = append(d, `,"retryAfterMs":`...)
	d = strconv.AppendInt(d, s.cfg.RetryAfter.Milliseconds(), 10)
	f.Details = append(d, '}')
	return f
}

// finish answers the invoke, ends its span and counts it.
func (s *Service) finish(msg *nats.Msg, span *telemetry.Span, command string, payload json.RawMessage, fault *wire.Fault) {
	s.respond(msg, payload, fault)
	code := ""
	var err error
	if fault != nil {
		code, err = fault.Code, fault
	}
	span.End(code, err)
	s.invokes.WithLabelValues(telemetry.LabelShim, telemetry.CommandLabel(command), telemetry.OutcomeOf(code)).Inc()
}

// deadline is the invoke's deadline: the caller's remaining time capped at
// MaxTimeout, or DefaultTimeout when the caller sent none.
func (s *Service) deadline(h nats.Header) time.Time {
	if ms, err := strconv.ParseInt(h.Get(wire.HeaderTimeout), 10, 64); err != nil || ms <= 0 {
		return time.Now().Add(s.cfg.DefaultTimeout) // absent or unreadable
	}
	return wire.Deadline(h, s.cfg.MaxTimeout)
}

// invoke runs one node.invoke: decode, find the node, translate, one request
// to the device's hub, map the answer. It returns the command ("" when the
// request is unreadable) with the result. span is the invoke's handler span
// and ctx carries it; tc counts the tenant's calls, of which at most
// deviceMax may be in flight to one device.
func (s *Service) invoke(ctx context.Context, span *telemetry.Span, msg *nats.Msg, tc *inflight.Tenant, deviceMax int) (string, json.RawMessage, *wire.Fault) {
	deadline := s.deadline(msg.Header)
	tenant, req, fault := parseInvoke(msg.Subject, msg.Data)
	if fault != nil {
		return "", nil, fault
	}
	span.AddInfo(telemetry.CallInfo{Node: req.NodeID, Command: req.Command})
	node, ok := s.reg.Lookup(tenant, req.NodeID)
	if !ok {
		fctx, cancel := context.WithDeadline(context.Background(), deadline)
		n, found, err := s.reg.Fetch(fctx, tenant, req.NodeID)
		cancel()
		if err != nil {
			return req.Command, nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "node registry unavailable"}
		}
		if !found {
			return req.Command, nil, &wire.Fault{Code: wire.FaultInvalidRequest, Message: "unknown nodeId"}
		}
		node = n
	}
	rec := &node.Record
	if !slices.Contains(rec.Commands, req.Command) {
		return req.Command, nil, &wire.Fault{Code: wire.FaultInvalidRequest, Message: "command not declared by node: " + req.Command}
	}
	call, fault := translate.Prepare(req.Command, req.Params, translate.Target{Catalog: node.Catalog, Board: rec.ModelIdentifier})
	if fault != nil {
		return req.Command, nil, fault
	}
	device := cmp.Or(rec.Device, rec.NodeID) // the registry's copy, stable as a map key
	if !tc.AcquireDevice(device, deviceMax) {
		return req.Command, nil, s.refuse(tenant, wire.LimitDevice, deviceMax)
	}
	defer tc.ReleaseDevice(device)

	// The hub learns tenant and device from the subject; the headers carry
	// the deadline and the handler span's trace context (InjectMsg below).
	out := &nats.Msg{Subject: wire.DeviceRPC(tenant, rec.Device), Header: make(nats.Header, 2), Data: call.Request}
	wire.SetTimeout(out.Header, deadline)
	wait := time.Until(deadline)
	if wait <= 0 {
		return req.Command, nil, timeoutFault()
	}
	telemetry.InjectMsg(ctx, out)
	start := time.Now()
	reply, err := s.nc.RequestMsg(out, wait)
	s.hopShimHub.Observe(time.Since(start).Seconds())
	switch {
	case err == nil:
	case errors.Is(err, nats.ErrNoResponders):
		// No hub holds the device: it is offline whatever the record says.
		s.inflight.Add(1)
		go func() {
			defer s.inflight.Done()
			ctx, cancel := context.WithTimeout(context.Background(), registryTimeout)
			defer cancel()
			s.reg.MarkUnreachable(ctx, tenant, rec.NodeID, rec.Owner, rec.SessionID)
		}()
		return req.Command, nil, &wire.Fault{Code: wire.FaultNotConnected, Message: "node not connected"}
	case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return req.Command, nil, timeoutFault()
	default:
		s.log.WarnContext(ctx, "device request failed", "tenant", tenant, "node", rec.NodeID, "err", err)
		return req.Command, nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "could not reach the device's hub"}
	}
	payload, fault := call.Reply(reply.Header.Get(wire.HeaderFault), reply.Data)
	if fault != nil && s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.DebugContext(ctx, "invoke failed", "tenant", tenant, "node", rec.NodeID, "command", req.Command, "tool", call.Tool, "code", fault.Code, "message", fault.Message)
	}
	return req.Command, payload, fault
}

// parseInvoke reads the tenant from a node.invoke subject and picks nodeId,
// command and params out of the request; params stay a slice of data for
// translate.Prepare (the idempotency key is the gateway's business).
func parseInvoke(subject string, data []byte) (string, wire.InvokeRequest, *wire.Fault) {
	var req wire.InvokeRequest
	tenant, ok := wire.TenantFromSubject(subject)
	if !ok {
		return "", req, &wire.Fault{Code: wire.FaultInvalidRequest, Message: "invalid tenant"}
	}
	var nodeRaw, commandRaw []byte
	err := jsonobj.Walk(data, func(m jsonobj.Member) bool {
		switch {
		case m.Is("nodeId"):
			nodeRaw = m.Value
		case m.Is("command"):
			commandRaw = m.Value
		case m.Is("params"):
			req.Params = m.Value
		}
		return true
	})
	if err != nil {
		return "", req, &wire.Fault{Code: wire.FaultInvalidRequest, Message: "node.invoke request is not a JSON object"}
	}
	if req.NodeID, ok = jsonobj.String(nodeRaw); !ok || req.NodeID == "" {
		return "", req, &wire.Fault{Code: wire.FaultInvalidRequest, Message: "nodeId must be a non-empty string"}
	}
	if req.Command, ok = jsonobj.String(commandRaw); !ok || req.Command == "" {
		return "", req, &wire.Fault{Code: wire.FaultInvalidRequest, Message: "command must be a non-empty string"}
	}
	return tenant, req, nil
}

// timeoutFault is what OpenClaw reports when a node does not answer in time.
func timeoutFault() *wire.Fault {
	return &wire.Fault{Code: wire.FaultTimeout, Message: "node invoke timed out"}
}

// respond sends the InvokeReply. A successful payload is spliced in as raw
// bytes instead of going through the encoder again.
func (s *Service) respond(msg *nats.Msg, payload json.RawMessage, fault *wire.Fault) {
	if msg.Reply == "" {
		return
	}
	var data []byte
	if fault == nil {
		data = make([]byte, 0, len(payload)+len(`{"ok":true,"payload":}`))
		data = append(data, `{"ok":true,"payload":`...)
		data = append(data, payload...)
		data = append(data, '}')
	} else {
		var err error
		data, err = json.Marshal(wire.InvokeReply{OK: false, Error: fault})
		if err != nil {
			data = []byte(`{"ok":false,"error":{"code":"UNAVAILABLE","message":"could not encode the fault"}}`)
		}
	}
	if err := msg.Respond(data); err != nil {
		s.log.Warn("could not answer node.invoke", "err", err)
	}
}
