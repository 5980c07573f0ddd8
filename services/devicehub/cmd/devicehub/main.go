// Command devicehub runs one devicehub replica: XiaoZhi devices connect to
// it over WebSocket, and it serves their MCP sessions on NATS. Every flag
// falls back to an environment variable XIAOCLAW_<FLAG_IN_UPPER_SNAKE>.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/peterbourgon/ff/v3"
	"go.opentelemetry.io/otel"
	"golang.org/x/sync/errgroup"

	"github.com/xiaoclaw/xiaoclaw/pkg/activation"
	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsconn"
	"github.com/xiaoclaw/xiaoclaw/pkg/ops"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub"
)

var version = "dev"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "devicehub:", err)
		os.Exit(1)
	}
}

// tokenList collects --device-token values, repeated or comma-separated
// (the form XIAOCLAW_DEVICE_TOKEN takes): TENANT=TOKEN, or a bare TOKEN for
// tenant "dev".
type tokenList []string

func (t *tokenList) String() string { return fmt.Sprintf("%d tokens", len(*t)) }
func (t *tokenList) Set(v string) error {
	for one := range strings.SplitSeq(v, ",") {
		*t = append(*t, strings.TrimSpace(one))
	}
	return nil
}

func (t tokenList) authenticator() (deviceauth.StaticTokens, error) {
	out := deviceauth.StaticTokens{}
	for _, v := range t {
		tenant, token, ok := strings.Cut(v, "=")
		if !ok {
			tenant, token = "dev", v
		}
		if err := wire.ValidTenant(tenant); err != nil {
			return nil, fmt.Errorf("--device-token: %w", err)
		}
		if token == "" {
			return nil, errors.New("--device-token: empty token")
		}
		out[token] = tenant
	}
	return out, nil
}

func run(args []string) error {
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("devicehub", flag.ContinueOnError)
	natsURL := fs.String("nats-url", "nats://127.0.0.1:4222", "NATS server URL")
	var natsCreds natsauth.Credentials
	natsCreds.Register(fs)
	deviceAddr := fs.String("device-addr", devicehub.DefaultDeviceAddr, "listen address of the device endpoints (WebSocket /xiaozhi/v1/)")
	opsAddr := fs.String("ops-addr", ":9090", "listen address of /healthz, /readyz, /metrics and /debug/loglevel")
	var authFails, deviceFails authguard.Config
	authFails.RegisterFlags(fs, "auth-failure", "device authentications and OTA requests", authguard.Config{})
	deviceFails.RegisterFlags(fs, "device-auth-failure", "authentications claiming one device id (past it: 429 instead of 401; its right credential still passes)", authguard.Config{})
	var tokens tokenList
	fs.Var(&tokens, "device-token", "device bearer token as TENANT=TOKEN, or TOKEN for tenant dev; repeatable or comma-separated")
	callTimeout := fs.Duration("call-timeout", devicehub.DefaultCallTimeout, "deadline of one device call when the caller sets none")
	idleTimeout := fs.Duration("idle-timeout", devicehub.DefaultIdleTimeout, "close a session after this long without frames from the device")
	withUserTools := fs.Bool("with-user-tools", false, "list the devices' user-only tools too")
	notifyRate := fs.Float64("notify-rate", devicehub.DefaultNotifyRate, "notifications per second one device may send on average; more are dropped (negative: no limit)")
	notifyBurst := fs.Int("notify-burst", devicehub.DefaultNotifyBurst, "notifications one device may send at once above its rate")
	heartbeat := fs.Duration("heartbeat-interval", devicehub.DefaultHeartbeatInterval, "how often the hub tells the shims it is alive")
	maxResult := fs.Int("max-result-bytes", devicehub.DefaultMaxResultBytes, "cap of one device call's result in bytes; a larger one fails with PAYLOAD_TOO_LARGE")
	instance := fs.String("instance", host, "name of this replica in events and logs")
	databaseURL := fs.String("database-url", "", "Postgres URL of the tenancy store: per-tenant HMAC device keys for authentication and OTA")
	mqttAddr := fs.String("mqtt-addr", "", "listen address of the embedded MQTT broker for XiaoZhi MQTT devices (empty: no MQTT)")
	publicURL := fs.String("public-url", "", "WebSocket URL OTA hands to devices (default: ws://<request host>/xiaozhi/v1/)")
	mqttEndpoint := fs.String("mqtt-endpoint", "", "MQTT host:port OTA hands to devices (default: the request host with --mqtt-addr's port)")
	udpHost := fs.String("udp-public-host", "", "UDP audio host announced in MQTT hellos (default: the listen host)")
	autoActivate := fs.String("auto-activate-tenant", "", "bind every new OTA device to this tenant (empty: operators bind activation codes)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "json", "json or text")
	if err := ff.Parse(fs, args, ff.WithEnvVarPrefix("XIAOCLAW")); err != nil {
		return err
	}

	auth, err := tokens.authenticator()
	if err != nil {
		return err
	}
	if len(auth) == 0 && *databaseURL == "" {
		return errors.New("at least one --device-token or a --database-url is required")
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	proc, err := telemetry.StartProcess(ctx, telemetry.ProcessConfig{Service: telemetry.ServiceDevicehub,
		Instance: *instance, Version: version, LogLevel: *logLevel, LogFormat: *logFormat, Stderr: os.Stderr})
	if err != nil {
		return err
	}
	defer proc.Shutdown() // flushes the spans still queued, after everything else has stopped
	log := proc.Log.With(telemetry.LogKeyService, telemetry.LabelDevicehub, telemetry.LogKeyInstance, *instance)
	tp, reg, level := proc.Tracer, proc.Registry, proc.Level
	otel.SetErrorHandler(telemetry.ErrorHandler(log, time.Minute))

	natsOpts, err := natsCreds.Options()
	if err != nil {
		return err
	}
	nc, err := natsconn.Connect(proc.Registry, *natsURL, "devicehub "+*instance, telemetry.LabelDevicehub, log, natsOpts...)
	if err != nil {
		return err
	}
	defer nc.Close()

	creds, err := deviceCredentials(ctx, nc, *databaseURL, auth, log)
	if err != nil {
		return err
	}
	defer creds.close()
	checks := []ops.Check{ops.NATSCheck(nc)}
	if creds.db != nil {
		if err := creds.db.Register(reg, telemetry.LabelDevicehub); err != nil {
			return err
		}
		checks = append(checks, creds.db.Check())
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	acts, err := activation.NewKV(ctx, js, activation.Config{})
	if err != nil {
		return fmt.Errorf("activations: %w", err)
	}
	svc, err := devicehub.New(devicehub.Config{
		Instance: *instance, DeviceAddr: *deviceAddr, Auth: creds.auth,
		MQTTAddr: *mqttAddr, UDPPublicHost: *udpHost,
		OTA: devicehub.OTAConfig{Credentials: creds.minter, Activations: acts, AutoActivateTenant: *autoActivate,
			WebSocketURL: *publicURL, MQTTEndpoint: *mqttEndpoint},
		CallTimeout: *callTimeout, IdleTimeout: *idleTimeout, WithUserTools: *withUserTools, MaxResultBytes: *maxResult, Version: version,
		NotifyRate: *notifyRate, NotifyBurst: *notifyBurst, HeartbeatInterval: *heartbeat,
		TracerProvider: tp, Registerer: reg, AuthFailures: authFails, DeviceAuthFailures: deviceFails,
	}, nc, log)
	if err != nil {
		return err
	}
	ops, err := ops.NewServer(ops.Config{
		Addr: *opsAddr, Gatherer: reg, LogLevel: level,
		Checks: append(checks, ops.ChannelCheck("devicehub", svc.Ready())),
	}, log)
	if err != nil {
		return err
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ops.Run(gctx) })
	g.Go(func() error { return svc.Run(gctx) })
	for _, run := range creds.runners {
		g.Go(func() error { return run(gctx) })
	}
	return g.Wait()
}

// credentials are the devicehub's device authentication and OTA
// credential minter, with what keeps them working.
type credentials struct {
	auth   deviceauth.Authenticator
	minter devicehub.CredentialMinter
	// db tracks the tenancy store's database; nil without one.
	db *ops.DBHealth
	// runners keep the key cache current and ping the database.
	runners []func(context.Context) error
	close   func()
}

// deviceCredentials builds device authentication and the OTA credential
// minter: the tenancy store's HMAC keys when a database is configured, after
// the static tokens; with only one static token, that token's tenant.
func deviceCredentials(ctx context.Context, nc *nats.Conn, dsn string, static deviceauth.StaticTokens, log *slog.Logger) (*credentials, error) {
	if dsn == "" {
		c := &credentials{auth: static, close: func() {}}
		if len(static) == 1 {
			for tok, tenant := range static {
				c.minter = devicehub.StaticCredentials{Token: tok, Tenant: tenant}
			}
		}
		return c, nil
	}
	store, err := tenancy.OpenPostgres(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("tenancy store: %w", err)
	}
	keys, err := tenancy.NewDeviceAuth(store, tenancy.DeviceAuthConfig{}, log)
	if err != nil {
		store.Close()
		return nil, err
	}
	db, err := ops.NewDBHealth(ops.DBHealthConfig{Ping: store.DB().PingContext}, log)
	if err != nil {
		store.Close()
		return nil, err
	}
	c := &credentials{auth: keys, minter: keys, db: db, close: func() { store.Close() }}
	if len(static) > 0 {
		c.auth = tenancy.DeviceChain{static, keys}
	}
	c.runners = []func(context.Context) error{tenancy.NewWatcher(nc, tenancy.WatcherConfig{Store: store}, log, keys).Run, db.Run}
	return c, nil
}
