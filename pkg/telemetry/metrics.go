package telemetry

// This file declares every Prometheus metric xiaoclaw exports: names, help,
// labels and buckets live here and nowhere else. Each constructor registers
// on the registerer it is given; registering the same metric again returns
// the collector already registered, so services sharing one registry (as in
// `xiaoclaw dev`) share the metric and tell themselves apart by labels.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metric names.
const (
	MetricDevicesConnected = "xiaoclaw_devices_connected"
	MetricInvokes          = "xiaoclaw_invokes_total"
	MetricInvokesRefused   = "xiaoclaw_invokes_refused_total"
	MetricHopDuration      = "xiaoclaw_hop_duration_seconds"
	MetricPolicyDecisions  = "xiaoclaw_policy_decisions_total"
	MetricAuditBacklog     = "xiaoclaw_audit_backlog"
	MetricAuditLag         = "xiaoclaw_audit_lag_seconds"
	MetricNATSConnected    = "xiaoclaw_nats_connected"
	MetricDBConnected      = "xiaoclaw_db_connected"
	MetricUpstreamLinks    = "xiaoclaw_upstream_links"
	MetricUpstreamChanges  = "xiaoclaw_upstream_link_transitions_total"
)

// Label names.
const (
	LabelTenant    = "tenant"
	LabelTransport = "transport"
	LabelService   = "service"
	LabelCommand   = "command"
	LabelOutcome   = "outcome"
	LabelHop       = "hop"
	LabelEffect    = "effect"
	LabelLimit     = "limit"
	LabelUpstream  = "upstream"
	LabelState     = "state"
)

// Values of the "service" label.
const (
	LabelGateway   = "gateway"
	LabelShim      = "shim"
	LabelDevicehub = "devicehub"
)

// Values of the "hop" label of MetricHopDuration: each measures one leg of a
// node.invoke, at the side that starts it.
const (
	// HopInvoke: the whole call at the gateway, operator frame in to response out.
	HopInvoke = "invoke"
	// HopGatewayShim: the gateway's NATS request to a shim, until its reply.
	HopGatewayShim = "gateway_shim"
	// HopShimDevicehub: the shim's NATS request to the devicehub, until its reply.
	HopShimDevicehub = "shim_devicehub"
	// HopDevicehubDevice: the devicehub's JSON-RPC request to the device, until its reply.
	HopDevicehubDevice = "devicehub_device"
)

// Values of the "effect" label of MetricPolicyDecisions.
const (
	EffectAllow = "allow"
	EffectDeny  = "deny"
)

// HopBuckets are the latency buckets of MetricHopDuration, 250 µs to 30 s:
// a loopback hop takes well under a millisecond, a device on Wi-Fi tens to
// hundreds, and the invoke timeout reaches 30 s.
var HopBuckets = []float64{.00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15, 30}

// NewRegistry returns a registry of its own (never the default registerer)
// with the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	// Registering on a fresh registry cannot fail.
	_ = reg.Register(collectors.NewGoCollector())
	_ = reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// NewDevicesConnected declares xiaoclaw_devices_connected{tenant,transport}:
// device sessions a devicehub holds now (transport "websocket" or "mqtt").
func NewDevicesConnected(reg prometheus.Registerer) (*prometheus.GaugeVec, error) {
	return Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: MetricDevicesConnected,
		Help: "Device sessions held now, by tenant and transport.",
	}, []string{LabelTenant, LabelTransport}))
}

// NewInvokes declares xiaoclaw_invokes_total{service,command,outcome}:
// node.invoke calls finished by each service. Use CommandLabel for command
// and an Outcome* constant (OutcomeOf) for outcome.
func NewInvokes(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	return Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricInvokes,
		Help: "node.invoke calls finished, by service, command and outcome.",
	}, []string{LabelService, LabelCommand, LabelOutcome}))
}

// NewInvokesRefused declares
// xiaoclaw_invokes_refused_total{service,tenant,limit}: node.invoke calls a
// service refused because a limit was reached; limit is one of
// wire.LimitTenant, wire.LimitDevice and wire.LimitReplica.
func NewInvokesRefused(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	return Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricInvokesRefused,
		Help: "node.invoke calls refused because a limit was reached, by service, tenant and limit (tenant, device or replica).",
	}, []string{LabelService, LabelTenant, LabelLimit}))
}

// NewHopDuration declares xiaoclaw_hop_duration_seconds{hop}: the latency
// of each leg of a call (Hop* constants).
func NewHopDuration(reg prometheus.Registerer) (*prometheus.HistogramVec, error) {
	return Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    MetricHopDuration,
		Help:    "Latency of each leg of a node.invoke, measured where the leg starts.",
		Buckets: HopBuckets,
	}, []string{LabelHop}))
}

// NewPolicyDecisions declares xiaoclaw_policy_decisions_total{effect}.
func NewPolicyDecisions(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	return Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricPolicyDecisions,
		Help: "Policy decisions of the gateway, by effect (allow or deny).",
	}, []string{LabelEffect}))
}

// NewAuditBacklog declares xiaoclaw_audit_backlog: audit events published
// but not yet written to the database.
func NewAuditBacklog(reg prometheus.Registerer) (prometheus.Gauge, error) {
	return Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: MetricAuditBacklog,
		Help: "Audit events waiting to be written to the database.",
	}))
}

// NewAuditLag declares xiaoclaw_audit_lag_seconds: the age of the oldest
// audit event not yet written (0 when none waits).
func NewAuditLag(reg prometheus.Registerer) (prometheus.Gauge, error) {
	return Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: MetricAuditLag,
		Help: "Age in seconds of the oldest audit event not yet written to the database.",
	}))
}

// NewUpstreamLinks declares xiaoclaw_upstream_links{tenant,upstream,state}:
// the upstream links a shim worker holds now, by state (connecting,
// pairing, online, backoff, disabled).
func NewUpstreamLinks(reg prometheus.Registerer) (*prometheus.GaugeVec, error) {
	return Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: MetricUpstreamLinks,
		Help: "Links of devices to upstream OpenClaw gateways held now, by tenant, upstream and state.",
	}, []string{LabelTenant, LabelUpstream, LabelState}))
}

// NewUpstreamChanges declares
// xiaoclaw_upstream_link_transitions_total{tenant,upstream,state}: the
// state changes of upstream links, by the state entered; the rate into
// backoff, pairing and disabled is the rate of failed connects by cause.
func NewUpstreamChanges(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	return Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricUpstreamChanges,
		Help: "State changes of links to upstream OpenClaw gateways, by tenant, upstream and the state entered.",
	}, []string{LabelTenant, LabelUpstream, LabelState}))
}

// RegisterNATSConnected declares xiaoclaw_nats_connected{service}: 1 while
// nc is connected, read at scrape time. service is a Label* service value.
func RegisterNATSConnected(reg prometheus.Registerer, service string, nc *nats.Conn) error {
	_, err := Register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        MetricNATSConnected,
		Help:        "1 while the service's NATS connection is up, else 0.",
		ConstLabels: prometheus.Labels{LabelService: service},
	}, func() float64 { return boolGauge(nc.IsConnected()) }))
	return err
}

// RegisterDBConnected declares xiaoclaw_db_connected{service}: 1 while
// connected() reports the database usable, read at scrape time. connected
// should return a cached state (e.g. the last health ping), not dial.
func RegisterDBConnected(reg prometheus.Registerer, service string, connected func() bool) error {
	_, err := Register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        MetricDBConnected,
		Help:        "1 while the service's database is reachable, else 0.",
		ConstLabels: prometheus.Labels{LabelService: service},
	}, func() float64 { return boolGauge(connected()) }))
	return err
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Register registers c, or returns the equal collector already registered.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if reg == nil {
		var zero C
		return zero, errors.New("telemetry: a prometheus.Registerer is required")
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		var zero C
		return zero, fmt.Errorf("telemetry: register metric: %w", err)
	}
	return c, nil
}

// knownCommands are the node commands that get a label value of their own;
// any other command counts as "other", because a node host may declare
// commands without limit.
var knownCommands = map[string]bool{
	"mcp.tools.call": true, "mcp.tools.list": true, "mcp.initialize": true, "mcp.ping": true,
	"system.run": true, "system.run.prepare": true, "system.which": true, "system.notify": true,
	"system.execApprovals.get": true, "system.execApprovals.set": true,
	"browser.proxy": true, "camera.snap": true, "camera.list": true, "screen.record": true,
	"screen.snapshot": true, "location.get": true, "canvas.present": true,
}

// CommandLabel returns command when it is a known node command, else "other",
// keeping the "command" label bounded.
func CommandLabel(command string) string {
	if knownCommands[command] {
		return command
	}
	return "other"
}

// MCPCommand names the node command behind an MCP method, for the command
// label at the devicehub: "tools/call" is "mcp.tools.call", "initialize" is
// "mcp.initialize".
func MCPCommand(method string) string {
	switch method { // the devicehub's every call: no allocation for these
	case "tools/call":
		return "mcp.tools.call"
	case "tools/list":
		return "mcp.tools.list"
	case "initialize":
		return "mcp.initialize"
	case "ping":
		return "mcp.ping"
	}
	return "mcp." + strings.ReplaceAll(method, "/", ".")
}

// Poll calls sample at once and then every interval until ctx is done: the
// loop of a gauge read from somewhere else (a database ping, a stream's
// backlog).
func Poll(ctx context.Context, interval time.Duration, sample func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		sample()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
