package main

import (
	"errors"
	"flag"
	"log/slog"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// upstreamFlags configure upstream mode: publishing one tenant's devices as
// nodes on an OpenClaw gateway (docs/openclaw.md).
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
		gatewayURL: fs.String("gateway-url", "", "xiaoclaw gateway the upstream's calls go through, ws://…"),
		callerToken: fs.String("upstream-caller-token", "",
			"xiaoclaw operator token of the tenant the upstream's calls run as (prefer the env XIAOCLAW_UPSTREAM_CALLER_TOKEN)"),
	}
}

// service builds the upstream service, or nil when upstream mode is off.
func (f upstreamFlags) service(instance string, nc *nats.Conn, log *slog.Logger) (*upstream.Service, *upstream.GatewayInvoker, error) {
	if *f.url == "" {
		return nil, nil, nil
	}
	if *f.gatewayURL == "" || *f.callerToken == "" {
		return nil, nil, errors.New("upstream mode needs --gateway-url and --upstream-caller-token")
	}
	u := upstream.Upstream{Name: *f.name, Tenant: *f.tenant, URL: *f.url, Token: *f.token}
	inv := &upstream.GatewayInvoker{URL: *f.gatewayURL, Tokens: map[string]string{u.Name: *f.callerToken}}
	svc, err := upstream.New(upstream.Config{Instance: instance, Upstreams: []upstream.Upstream{u}, Invoker: inv}, nc, log)
	if err != nil {
		return nil, nil, err
	}
	return svc, inv, nil
}
