package devicehub

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
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
	DefaultWriteTimeout    = 10 * time.Second
	DefaultWriteQueue      = 128
	DefaultMaxCatalogBytes = 512 << 10
	DefaultMaxToolPages    = 100
	DefaultShutdownTimeout = 5 * time.Second
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
	// TOO_LARGE.
	MaxFrameBytes int
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
	// ShutdownTimeout bounds the graceful part of Run's shutdown.
	ShutdownTimeout time.Duration
	// Version is reported as clientInfo.version in MCP initialize.
	Version string
}

func (c *Config) setDefaults() {
	setDefault(&c.Instance, DefaultInstance)
	setDefault(&c.DeviceAddr, DefaultDeviceAddr)
	setDefault(&c.HelloTimeout, DefaultHelloTimeout)
	setDefault(&c.IdleTimeout, DefaultIdleTimeout)
	setDefault(&c.CallTimeout, DefaultCallTimeout)
	setDefault(&c.MaxInFlight, DefaultMaxInFlight)
	setDefault(&c.MaxFrameBytes, DefaultMaxFrameBytes)
	setDefault(&c.WriteTimeout, DefaultWriteTimeout)
	setDefault(&c.WriteQueue, DefaultWriteQueue)
	setDefault(&c.MaxCatalogBytes, DefaultMaxCatalogBytes)
	setDefault(&c.MaxToolPages, DefaultMaxToolPages)
	setDefault(&c.ShutdownTimeout, DefaultShutdownTimeout)
	setDefault(&c.Version, "dev")
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
		"WriteTimeout": c.WriteTimeout, "ShutdownTimeout": c.ShutdownTimeout,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative", name))
		}
	}
	if c.CallTimeout > 300*time.Second {
		errs = append(errs, errors.New("CallTimeout must be at most 300s"))
	}
	if c.MaxInFlight < 0 || c.WriteQueue < 0 || c.MaxCatalogBytes < 0 || c.MaxToolPages < 0 {
		errs = append(errs, errors.New("MaxInFlight, WriteQueue, MaxCatalogBytes and MaxToolPages must not be negative"))
	}
	if c.MaxFrameBytes < 1024 || c.MaxFrameBytes > 8<<20 {
		errs = append(errs, errors.New("MaxFrameBytes must be between 1 KiB and 8 MiB"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("devicehub config: %w", err)
	}
	return nil
}
