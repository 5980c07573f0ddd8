package devicehub

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Defaults of Config; a zero field takes its default.
const (
	DefaultDeviceAddr      = "127.0.0.1:8000"
	DefaultInstance        = "devicehub"
	DefaultHelloTimeout    = 10 * time.Second
	DefaultIdleTimeout     = 120 * time.Second
	DefaultCallTimeout     = 15 * time.Second
	DefaultMaxInFlight     = 100
	DefaultMaxFrameBytes   = 128 << 10
	DefaultMaxResultBytes  = 128 << 10
	DefaultWriteTimeout    = 10 * time.Second
	DefaultWriteQueue      = 128
	DefaultMaxCatalogBytes = 512 << 10
	DefaultMaxToolPages    = 100
	DefaultShutdownTimeout = 5 * time.Second
	DefaultNotifyRate      = 20 // notifications per second and device
	DefaultNotifyBurst     = 50
	// DefaultHeartbeatInterval: shims declare a hub gone after missing
	// about three heartbeats (shim.DefaultHubTimeout).
	DefaultHeartbeatInterval = 5 * time.Second

	DefaultMQTTMaxPayload  = 8192 // the firmware's MQTT buffer
	DefaultMQTTKeepalive   = 240 * time.Second
	DefaultMQTTBufferSize  = 512
	DefaultMQTTWritesQueue = 16
)

// Config of a devicehub. The zero value of every field but Auth means its
// default.
type Config struct {
	// Instance names this replica in device events (DeviceEvent.Hub) and logs.
	Instance string
	// DeviceAddr is the listen address of the device endpoints (the XiaoZhi
	// WebSocket at /xiaozhi/v1/ and whatever Router adds). "host:0" picks a
	// free port; DeviceAddr() returns the real one.
	DeviceAddr string
	// Auth maps device credentials to a tenant. Required.
	Auth deviceauth.Authenticator

	// HelloTimeout closes a connection that has not sent its hello in time.
	HelloTimeout time.Duration
	// IdleTimeout closes a session after that long without any frame from
	// the device (audio, JSON or WebSocket ping). The firmware itself
	// treats a channel as dead after 120 s without downlink, so a session
	// idle for longer is of no use to anyone; default 120 s.
	IdleTimeout time.Duration
	// CallTimeout is the deadline of one device call when the caller sets
	// none; a caller's Xc-Timeout-Ms can only shorten it. Also the deadline
	// of each discovery request.
	CallTimeout time.Duration
	// MaxInFlight caps the pending calls per device; more fail with BUSY.
	MaxInFlight int
	// MaxFrameBytes caps one JSON frame in either direction; a device that
	// sends a larger one loses its session, a larger request fails with
	// PAYLOAD_TOO_LARGE.
	MaxFrameBytes int
	// MaxResultBytes caps the result of one call (the device's JSON-RPC
	// response); a larger one fails its call with PAYLOAD_TOO_LARGE and the
	// session stays. Default 128 KiB.
	MaxResultBytes int
	// WriteTimeout bounds one frame write to a device; a device that does
	// not take a frame in time is a slow consumer and loses its session.
	WriteTimeout time.Duration
	// WriteQueue caps the frames waiting to be written to one device; a
	// device with more waiting is a slow consumer and loses its session.
	WriteQueue int
	// WithUserTools asks devices for their user-only tools too
	// (tools/list withUserTools).
	WithUserTools bool
	// MaxCatalogBytes caps a device's tool catalog (it travels in one NATS
	// message); MaxToolPages caps its tools/list pages.
	MaxCatalogBytes int
	MaxToolPages    int
	// NotifyRate caps the JSON-RPC notifications one device session may
	// put on the bus, per second on average, with bursts of NotifyBurst;
	// the hub drops the rest (counted in
	// xiaoclaw_devicehub_notifications_dropped_total, one warning per
	// session and minute). A negative NotifyRate turns the limit off.
	// Defaults 20/s and 50.
	NotifyRate  float64
	NotifyBurst int
	// HeartbeatInterval is how often the hub announces on
	// wire.SubjectHubHeartbeat that it is alive; shims mark the devices of
	// a hub silent for their HubTimeout disconnected. Default 5 s.
	HeartbeatInterval time.Duration
	// ShutdownTimeout bounds the graceful part of Run's shutdown.
	ShutdownTimeout time.Duration
	// Version is reported as clientInfo.version in MCP initialize.
	Version string

	// AuthFailures throttles refused devices per source address: default
	// 10 refusals in a row, then one every 6 s; a throttled source is
	// refused before its credential is checked (WebSocket and OTA: 429
	// with Retry-After; MQTT: CONNACK "server unavailable"), and its
	// refusals reach the audit trail as one record per minute with their
	// count.
	AuthFailures authguard.Config
	// DeviceAuthFailures budgets the refusals claiming one device id
	// (same defaults): past it they are answered 429 instead of 401, but
	// the device's correct credential is still accepted.
	DeviceAuthFailures authguard.Config

	// MQTTAddr, when set, runs the embedded MQTT broker for XiaoZhi MQTT
	// devices on this TCP address ("host:0" picks a free port; MQTTAddr()
	// returns the real one). Empty: no MQTT.
	MQTTAddr string
	// MQTTTLS, when set, serves MQTT over TLS with this configuration (it
	// must carry a certificate). The firmware dials port 8883 with TLS and
	// the public CA bundle, any other port in plain TCP.
	MQTTTLS *tls.Config
	// MQTTMaxPayload caps one MQTT publish payload in either direction; the
	// firmware cannot take larger ones. A larger request fails with
	// PAYLOAD_TOO_LARGE, a larger response fails its call with PAYLOAD_TOO_LARGE; the
	// session stays. Default 8192.
	MQTTMaxPayload int
	// MQTTKeepalive is used for a client that asks for keepalive 0; a
	// client silent for 1.5 × its keepalive is disconnected. Default 240 s
	// (the firmware's value).
	MQTTKeepalive time.Duration
	// MQTTBufferSize is the read and write buffer of one MQTT connection
	// (256 B to 2 KiB; default 512 B). MQTTWritesQueue caps the broker's
	// per-client outbound queue (at most 128; default 16).
	MQTTBufferSize  int
	MQTTWritesQueue int
	// UDPAddr is where the UDP audio sink announced in MQTT server hellos
	// listens; it accepts and drops audio. Default: MQTTAddr's host, a free
	// port.
	UDPAddr string
	// UDPPublicHost is the udp.server announced to devices. Default: the
	// UDP listen host when it is a specific address, else the local address
	// the device's MQTT connection reached.
	UDPPublicHost string
	// GoodbyeAfter is how long an MQTT device's voice session (opened by
	// its hello) stays open before the hub ends it with a goodbye; the hub
	// has no audio pipeline. 0: the goodbye follows the hello at once.
	GoodbyeAfter time.Duration

	// OTA, when OTA.Credentials is set, serves the firmware's OTA and
	// activation endpoints on the device port (see OTAConfig).
	OTA OTAConfig

	// TracerProvider traces device calls (telemetry.NewTracerProvider);
	// nil means no tracing.
	TracerProvider trace.TracerProvider
	// Registerer receives the hub's metrics; nil keeps them in a private
	// registry nobody scrapes.
	Registerer prometheus.Registerer
}

func (c *Config) setDefaults() {
	setDefault(&c.Instance, DefaultInstance)
	setDefault(&c.DeviceAddr, DefaultDeviceAddr)
	setDefault(&c.HelloTimeout, DefaultHelloTimeout)
	setDefault(&c.IdleTimeout, DefaultIdleTimeout)
	setDefault(&c.CallTimeout, DefaultCallTimeout)
	setDefault(&c.MaxInFlight, DefaultMaxInFlight)
	setDefault(&c.MaxFrameBytes, DefaultMaxFrameBytes)
	setDefault(&c.MaxResultBytes, DefaultMaxResultBytes)
	setDefault(&c.WriteTimeout, DefaultWriteTimeout)
	setDefault(&c.WriteQueue, DefaultWriteQueue)
	setDefault(&c.MaxCatalogBytes, DefaultMaxCatalogBytes)
	setDefault(&c.MaxToolPages, DefaultMaxToolPages)
	setDefault(&c.ShutdownTimeout, DefaultShutdownTimeout)
	setDefault(&c.NotifyRate, DefaultNotifyRate)
	setDefault(&c.HeartbeatInterval, DefaultHeartbeatInterval)
	setDefault(&c.NotifyBurst, DefaultNotifyBurst)
	setDefault(&c.Version, "dev")
	setDefault(&c.MQTTMaxPayload, min(DefaultMQTTMaxPayload, c.MaxFrameBytes))
	setDefault(&c.MQTTKeepalive, DefaultMQTTKeepalive)
	setDefault(&c.MQTTBufferSize, DefaultMQTTBufferSize)
	setDefault(&c.MQTTWritesQueue, DefaultMQTTWritesQueue)
	if c.UDPAddr == "" && c.MQTTAddr != "" {
		if host, _, err := net.SplitHostPort(c.MQTTAddr); err == nil {
			c.UDPAddr = net.JoinHostPort(host, "0")
		}
	}
	c.OTA.setDefaults()
	if c.TracerProvider == nil {
		c.TracerProvider = noop.NewTracerProvider()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
}

func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// Validate reports the first invalid field, after applying the defaults.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.Auth == nil {
		errs = append(errs, errors.New("field Auth is required"))
	}
	if _, _, err := net.SplitHostPort(c.DeviceAddr); err != nil {
		errs = append(errs, fmt.Errorf("DeviceAddr %q: %w", c.DeviceAddr, err))
	}
	for name, d := range map[string]time.Duration{
		"HelloTimeout": c.HelloTimeout, "IdleTimeout": c.IdleTimeout, "CallTimeout": c.CallTimeout,
		"WriteTimeout": c.WriteTimeout, "ShutdownTimeout": c.ShutdownTimeout, "HeartbeatInterval": c.HeartbeatInterval,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative", name))
		}
	}
	if c.CallTimeout > 300*time.Second {
		errs = append(errs, errors.New("CallTimeout must be at most 300s"))
	}
	if c.MaxInFlight < 0 || c.WriteQueue < 0 || c.MaxCatalogBytes < 0 || c.MaxToolPages < 0 || c.MaxResultBytes < 0 {
		errs = append(errs, errors.New("MaxInFlight, WriteQueue, MaxCatalogBytes, MaxToolPages and MaxResultBytes must not be negative"))
	}
	if c.MaxFrameBytes < 1024 || c.MaxFrameBytes > 8<<20 {
		errs = append(errs, errors.New("MaxFrameBytes must be between 1 KiB and 8 MiB"))
	}
	if c.MQTTAddr != "" {
		if _, _, err := net.SplitHostPort(c.MQTTAddr); err != nil {
			errs = append(errs, fmt.Errorf("MQTTAddr %q: %w", c.MQTTAddr, err))
		}
		if _, _, err := net.SplitHostPort(c.UDPAddr); err != nil {
			errs = append(errs, fmt.Errorf("UDPAddr %q: %w", c.UDPAddr, err))
		}
		if c.MQTTTLS != nil && len(c.MQTTTLS.Certificates) == 0 && c.MQTTTLS.GetCertificate == nil {
			errs = append(errs, errors.New("MQTTTLS has no certificate"))
		}
	}
	if c.MQTTMaxPayload < 512 || c.MQTTMaxPayload > c.MaxFrameBytes {
		errs = append(errs, errors.New("MQTTMaxPayload must be between 512 bytes and MaxFrameBytes"))
	}
	if c.MQTTKeepalive < time.Second || c.MQTTKeepalive > 65535*time.Second {
		errs = append(errs, errors.New("MQTTKeepalive must be between 1s and 65535s"))
	}
	if c.MQTTBufferSize < 256 || c.MQTTBufferSize > 2048 || c.MQTTWritesQueue < 1 || c.MQTTWritesQueue > 128 {
		errs = append(errs, errors.New("MQTTBufferSize must be 256-2048 and MQTTWritesQueue 1-128"))
	}
	if c.NotifyBurst < 1 {
		errs = append(errs, errors.New("NotifyBurst must be at least 1"))
	}
	if c.GoodbyeAfter < 0 {
		errs = append(errs, errors.New("GoodbyeAfter must not be negative"))
	}
	if err := c.OTA.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.MQTTAddr == "" && c.OTA.MQTTEndpoint == "" && slices.Contains(c.OTA.Transports, wire.TransportMQTT) {
		errs = append(errs, errors.New("OTA offers MQTT but neither MQTTAddr nor OTA.MQTTEndpoint is set"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("devicehub config: %w", err)
	}
	return nil
}
