// Package devicehub terminates device sessions at the edge and puts their
// MCP traffic on NATS. XiaoZhi devices connect over WebSocket at
// /xiaozhi/v1/ or over MQTT to the embedded broker (Config.MQTTAddr); the
// hub authenticates them, answers their hellos, runs MCP discovery
// (initialize, paged tools/list), announces presence on wire.DeviceState
// and serves wire.DeviceRPC for every session it holds: one JSON-RPC
// request in, the device's response out, or a wire.Fault. The NATS side is
// the same for both transports.
//
// The firmware's OTA endpoint (Config.OTA) tells a booting device which
// transport to use and hands out credentials minted from its tenant's
// keys; unknown devices get an activation code an operator binds to a
// tenant (Activations).
//
// Embedding: New, then optionally add routes to Router before Run; Run
// serves until its context ends.
package devicehub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// WebSocketPath is where XiaoZhi devices connect (also served without the
// trailing slash).
const WebSocketPath = "/xiaozhi/v1/"

// Service is one devicehub replica.
type Service struct {
	cfg    Config
	hub    *hub
	router *chi.Mux
	log    *slog.Logger

	mqtt *mqttBroker // nil without MQTTAddr

	ready   chan struct{}
	addr    atomic.Pointer[string]
	running atomic.Bool
}

// New checks cfg and builds a Service on the NATS connection nc. A nil log
// discards logs.
func New(cfg Config, nc *nats.Conn, log *slog.Logger) (*Service, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if nc == nil {
		return nil, errors.New("devicehub: a NATS connection is required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Service{cfg: cfg, log: log, ready: make(chan struct{}), router: chi.NewRouter()}
	s.hub = newHub(&s.cfg, nc, log)
	s.hub.fails = newAuthFailures(s.hub)
	if err := s.hub.instrument(); err != nil {
		return nil, fmt.Errorf("devicehub: %w", err)
	}
	s.router.Get(WebSocketPath, s.hub.serveWebSocket)
	s.router.Get(WebSocketPath[:len(WebSocketPath)-1], s.hub.serveWebSocket)
	s.router.Get(EndpointPath, s.hub.serveEndpoint)
	s.router.Get(EndpointPath[:len(EndpointPath)-1], s.hub.serveEndpoint)
	if cfg.MQTTAddr != "" {
		b, err := newMQTTBroker(s.hub, log)
		if err != nil {
			return nil, fmt.Errorf("devicehub: MQTT broker: %w", err)
		}
		s.mqtt = b
	}
	s.mountOTA()
	return s, nil
}

// Router is the HTTP router of DeviceAddr. Add routes (e.g. the OTA
// endpoint) before Run; the XiaoZhi WebSocket is already mounted.
func (s *Service) Router() chi.Router { return s.router }

// Ready is closed once the hub listens on DeviceAddr and receives resync
// requests.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// DeviceAddr returns the address devices connect to (host:port, the real
// port when DeviceAddr asked for port 0); "" before Ready.
func (s *Service) DeviceAddr() string {
	if p := s.addr.Load(); p != nil {
		return *p
	}
	return ""
}

// MQTTAddr returns the address of the MQTT listener (the real port when
// MQTTAddr asked for port 0); "" without MQTT or before Ready.
func (s *Service) MQTTAddr() string {
	if s.mqtt == nil || s.DeviceAddr() == "" {
		return ""
	}
	return s.mqtt.ln.Address()
}

// UDPAddr returns the address of the UDP audio sink announced to MQTT
// devices; "" without MQTT or before Ready.
func (s *Service) UDPAddr() string {
	if s.mqtt == nil || s.DeviceAddr() == "" {
		return ""
	}
	return s.mqtt.udp.LocalAddr().String()
}

// Sessions returns the number of device sessions this replica holds.
func (s *Service) Sessions() int { return s.hub.count() }

// Run listens on DeviceAddr and serves devices until ctx ends, then stops
// accepting, ends every session (pending calls fail with DISCONNECTED,
// offline events are published) and returns nil. It returns an error only
// when it cannot start. Run may be called once.
func (s *Service) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("devicehub: Run called twice")
	}
	ln, err := net.Listen("tcp", s.cfg.DeviceAddr)
	if err != nil {
		return fmt.Errorf("devicehub: listen on %s: %w", s.cfg.DeviceAddr, err)
	}
	resync, err := s.hub.nc.ChanSubscribe(wire.SubjectHubResync, s.hub.msgs)
	if err != nil {
		ln.Close()
		return fmt.Errorf("devicehub: subscribe %s: %w", wire.SubjectHubResync, err)
	}
	if err := s.hub.nc.Flush(); err != nil {
		s.log.Warn("devicehub: NATS flush failed; subscriptions take effect on reconnect", "err", err)
	}

	if s.mqtt != nil {
		if err := s.mqtt.start(); err != nil {
			ln.Close()
			_ = resync.Unsubscribe()
			return fmt.Errorf("devicehub: %w", err)
		}
	}

	stopDispatch := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); s.hub.dispatch(stopDispatch) }()
	beatCtx, stopBeat := context.WithCancel(ctx)
	defer stopBeat()
	wg.Go(func() { s.hub.heartbeat(beatCtx, nowMs()) })
	sweepCtx, stopSweep := context.WithCancel(context.Background())
	go func() { defer wg.Done(); s.hub.fails.bySource.Run(sweepCtx) }() // folded refusals; the rest at shutdown

	srv := &http.Server{
		Handler:           s.router,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	serveErr := make(chan error, 1)
	go func() { defer wg.Done(); serveErr <- srv.Serve(ln) }()

	addr := ln.Addr().String()
	s.addr.Store(&addr)
	close(s.ready)
	s.log.Info("devicehub: listening", "addr", addr, "path", WebSocketPath, "mqtt_addr", s.MQTTAddr(), "udp_addr", s.UDPAddr(),
		"ota", s.cfg.OTA.Credentials != nil, "instance", s.cfg.Instance)

	select {
	case <-ctx.Done():
	case err := <-serveErr:
		// Serve only fails on a broken listener; shut down what runs.
		s.log.Error("devicehub: device listener failed", "err", err)
	}

	stopBeat()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx) // stops accepting; hijacked WebSockets are ours to close
	_ = resync.Unsubscribe()
	s.hub.shutdown(s.cfg.ShutdownTimeout)
	if s.mqtt != nil {
		s.mqtt.stop()
	}
	close(stopDispatch)
	stopSweep()
	wg.Wait()
	if err := s.hub.nc.FlushTimeout(2 * time.Second); err != nil {
		s.log.Warn("devicehub: offline events may be lost", "err", err)
	}
	s.log.Info("devicehub: stopped")
	return nil
}

// Call sends one JSON-RPC request (method and params; the hub assigns the
// id) to a device this replica holds and returns the device's JSON-RPC
// response verbatim, or a *wire.Fault. It is what a DeviceRPC request does,
// without NATS; the deadline is ctx's, capped at CallTimeout.
func (s *Service) Call(ctx context.Context, tenant, device string, request []byte) (json.RawMessage, error) {
	sess := s.hub.lookup(deviceKey{tenant, device})
	if sess == nil {
		return nil, &wire.Fault{Code: wire.FaultNotConnected, Message: "no session for device " + device}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	_, raw, err := s.hub.call(ctx, sess, request, 0)
	return raw, err
}
