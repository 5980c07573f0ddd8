package main

import (
	"errors"
	"flag"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// upstreamFlags configure upstream mode: publishing tenants' devices as
// nodes on OpenClaw gateways (docs/openclaw.md). With --gateway-url the
// shim runs the upstreams stored through the admin API (bucket
// xc_upstreams); --upstream-url adds one configured here.
type upstreamFlags struct {
	tenant, name, url, token *string
	gatewayURL, callerToken  *string
}

func addUpstreamFlags(fs *flag.FlagSet) upstreamFlags {
	return upstreamFlags{
		tenant: fs.String("upstream-tenant", "", "tenant whose devices are published upstream"),
		name:   fs.String("upstream-name", "openclaw", "name of the upstream"),
		url:    fs.String("upstream-url", "", "OpenClaw gateway to publish the devices to (empty: no upstream mode)"),
		token: fs.String("upstream-token", "",
			"that OpenClaw gateway's token (prefer the env XIAOCLAW_UPSTREAM_TOKEN)"),
		gatewayURL: fs.String("gateway-url", "",
			"xiaoclaw gateway the upstreams' calls go through, ws://… (empty: no stored upstreams run here)"),
		callerToken: fs.String("upstream-caller-token", "",
			"xiaoclaw operator token of the tenant the upstream's calls run as (prefer the env XIAOCLAW_UPSTREAM_CALLER_TOKEN)"),
	}
}

// service builds the upstream service, or nil when upstream mode is off.
func (f upstreamFlags) service(instance string, nc *nats.Conn, reg prometheus.Registerer, log *slog.Logger) (*upstream.Service, *upstream.GatewayInvoker, error) {
	if *f.url == "" && *f.gatewayURL == "" {
		return nil, nil, nil
	}
	if *f.gatewayURL == "" || (*f.url != "" && *f.callerToken == "") {
		return nil, nil, errors.New("upstream mode needs --gateway-url and --upstream-caller-token")
	}
	inv := &upstream.GatewayInvoker{URL: *f.gatewayURL}
	cfg := upstream.Config{Instance: instance, Stored: true, Invoker: inv, Registerer: reg}
	if *f.url != "" {
		cfg.Upstreams = []upstream.Upstream{{Name: *f.name, Tenant: *f.tenant, URL: *f.url, Token: *f.token,
			CallerToken: *f.callerToken}}
	}
	svc, err := upstream.New(cfg, nc, log)
	if err != nil {
		return nil, nil, err
	}
	return svc, inv, nil
}
