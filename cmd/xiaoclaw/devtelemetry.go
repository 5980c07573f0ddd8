package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/devstack"
	"github.com/xiaoclaw/xiaoclaw/pkg/ops"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

// devTelemetry is the observability of `xiaoclaw dev`: one tracer provider
// per service from the same OTEL_* environment (each keeps its own
// service.name; with tracing off they still give every call a trace id),
// one metrics registry for all, and the ops endpoints the gateway serves on
// its port.
type devTelemetry struct {
	gateway, shim, hub *telemetry.TracerProvider
	reg                *prometheus.Registry
	ops                opsSlot
	log                *slog.Logger
}

func newDevTelemetry(ctx context.Context, log *slog.Logger) (*devTelemetry, error) {
	t := &devTelemetry{reg: telemetry.NewRegistry(), log: log}
	// Before the providers: the SDK reports a bad OTEL_TRACES_SAMPLER there.
	otel.SetErrorHandler(telemetry.ErrorHandler(log, time.Minute))
	cfg := telemetry.Config{Version: version, SharedProcess: true}
	var err error
	for _, p := range []struct {
		dst  **telemetry.TracerProvider
		name string
	}{
		{&t.gateway, telemetry.ServiceGateway},
		{&t.shim, telemetry.ServiceShim},
		{&t.hub, telemetry.ServiceDevicehub},
	} {
		if *p.dst, err = telemetry.NewTracerProvider(ctx, p.name, cfg); err != nil {
			t.shutdown()
			return nil, err
		}
	}
	log.Info("tracing", "config", t.gateway.String())
	return t, nil
}

// stackConfig sets the stack's tracer providers, registry and ops handler.
func (t *devTelemetry) stackConfig(c *devstack.Config) {
	c.GatewayTracerProvider, c.ShimTracerProvider, c.HubTracerProvider = t.gateway, t.shim, t.hub
	c.Registerer = t.reg
	c.Ops = &t.ops
}

// serve builds the ops endpoints once the stack runs: readiness is the
// database and every replica's NATS connection and start, metrics include
// each service's NATS gauge.
func (t *devTelemetry) serve(st *devstack.Stack, level *slog.LevelVar) error {
	checks := []ops.Check{st.DB.Check()}
	labelled := map[string]bool{}
	for _, c := range st.Components {
		nats := ops.NATSCheck(c.NATS())
		checks = append(checks,
			ops.Check{Name: "nats " + c.Name, Run: nats.Run},
			ops.ChannelCheck(c.Name, c.Ready()))
		label := serviceLabel(c.Name)
		if label != "" && !labelled[label] {
			if err := telemetry.RegisterNATSConnected(t.reg, label, c.NATS()); err != nil {
				return err
			}
			labelled[label] = true
		}
	}
	ops, err := ops.NewServer(ops.Config{Gatherer: t.reg, LogLevel: level, Checks: checks}, t.log)
	if err != nil {
		return err
	}
	h := ops.Handler()
	t.ops.h.Store(&h)
	return nil
}

// serviceLabel maps a devstack component name ("gateway-1", "shim-1",
// "hub-1") to its metric service label; "" for the others.
func serviceLabel(component string) string {
	switch {
	case strings.HasPrefix(component, "gateway"):
		return telemetry.LabelGateway
	case strings.HasPrefix(component, "shim"):
		return telemetry.LabelShim
	case strings.HasPrefix(component, "hub"):
		return telemetry.LabelDevicehub
	}
	return ""
}

// shutdown flushes and stops the tracer providers.
func (t *devTelemetry) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	for _, tp := range []*telemetry.TracerProvider{t.gateway, t.shim, t.hub} {
		if tp != nil {
			errs = append(errs, tp.Shutdown(ctx))
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.log.Warn("tracer shutdown", "err", err)
	}
}

// opsSlot serves the ops endpoints once they exist; the gateway mounts it
// before the stack (and so the readiness checks) can be built.
type opsSlot struct{ h atomic.Pointer[http.Handler] }

func (o *opsSlot) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := o.h.Load()
	if h == nil {
		http.Error(w, `{"status":"starting"}`, http.StatusServiceUnavailable)
		return
	}
	(*h).ServeHTTP(w, r)
}
