// Package ops is the operations side of a service process: the HTTP server
// of /healthz, /readyz (named readiness checks run concurrently, each within
// a timeout), /metrics and /debug/loglevel, and the database health tracker
// that feeds both the "db" readiness check and the xiaoclaw_db_connected
// gauge.
package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

// Check is one named readiness check; Run returns nil when the dependency
// is usable.
type Check struct {
	Name string
	Run  func(ctx context.Context) error
}

// NATSCheck is ready while nc is connected; it fails while the connection
// is reconnecting, draining or closed.
func NATSCheck(nc *nats.Conn) Check {
	return Check{Name: "nats", Run: func(context.Context) error {
		if st := nc.Status(); st != nats.CONNECTED {
			return fmt.Errorf("nats connection %s", strings.ToLower(st.String()))
		}
		return nil
	}}
}

// PingCheck runs ping (for example pgxpool.Pool.Ping for the "db" check).
func PingCheck(name string, ping func(ctx context.Context) error) Check {
	return Check{Name: name, Run: ping}
}

// ChannelCheck fails until ready is closed, e.g. a service's Ready().
func ChannelCheck(name string, ready <-chan struct{}) Check {
	return Check{Name: name, Run: func(context.Context) error {
		select {
		case <-ready:
			return nil
		default:
			return errors.New("not started")
		}
	}}
}

// Config configures the ops HTTP server of a service.
type Config struct {
	// Addr to listen on, e.g. ":9090" or "127.0.0.1:0".
	Addr string
	// Gatherer serves /metrics; nil leaves /metrics out.
	Gatherer prometheus.Gatherer
	// LogLevel is changed by PUT /debug/loglevel; nil leaves it out.
	LogLevel *slog.LevelVar
	// Checks decide /readyz: ready when every check passes.
	Checks []Check
	// CheckTimeout bounds each check; default 2s.
	CheckTimeout time.Duration
}

// Server serves /healthz, /readyz, /metrics and /debug/loglevel.
type Server struct {
	cfg     Config
	log     *slog.Logger
	handler http.Handler
	ready   chan struct{}
	addr    string
	mu      sync.Mutex
}

// NewServer builds the ops server. Handler can be mounted elsewhere (the
// gateway's port in `xiaoclaw dev`) instead of calling Run; Addr is needed
// only by Run.
func NewServer(cfg Config, log *slog.Logger) (*Server, error) {
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = 2 * time.Second
	}
	seen := map[string]bool{}
	for _, c := range cfg.Checks {
		if c.Name == "" || c.Run == nil {
			return nil, errors.New("ops: every readiness check needs a name and a func")
		}
		if seen[c.Name] {
			return nil, fmt.Errorf("ops: readiness check %q given twice", c.Name)
		}
		seen[c.Name] = true
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log, ready: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.serveReady)
	if cfg.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError),
		}))
	}
	if cfg.LogLevel != nil {
		mux.Handle("/debug/loglevel", LogLevelHandler(cfg.LogLevel, log))
	}
	s.handler = mux
	return s, nil
}

// Handler serves the ops endpoints.
func (s *Server) Handler() http.Handler { return s.handler }

// Ready is closed once Run listens.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr is the address Run listens on (the real port when Addr asked for
// port 0); empty before Ready.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Run listens and serves until ctx is done, then shuts down and returns nil.
func (s *Server) Run(ctx context.Context) error {
	if s.cfg.Addr == "" {
		return errors.New("ops: server address is required")
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("ops: server: %w", err)
	}
	s.mu.Lock()
	s.addr = ln.Addr().String()
	s.mu.Unlock()
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	close(s.ready)
	select {
	case err := <-errc:
		return fmt.Errorf("ops: server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	<-errc
	return nil
}

// CheckResult is one check's entry in the /readyz body.
type CheckResult struct {
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// Readiness is the /readyz body.
type Readiness struct {
	Status  string        `json:"status"` // "ready" or "unavailable"
	Checks  []CheckResult `json:"checks"`
	Failing []string      `json:"failing,omitempty"`
}

// CheckReadiness runs every check concurrently, each within CheckTimeout.
func (s *Server) CheckReadiness(ctx context.Context) Readiness {
	res := make([]CheckResult, len(s.cfg.Checks))
	var wg sync.WaitGroup
	for i, c := range s.cfg.Checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, s.cfg.CheckTimeout)
			defer cancel()
			err := runCheck(cctx, c)
			res[i] = CheckResult{Name: c.Name, OK: err == nil}
			if err != nil {
				res[i].Error = telemetry.Scrub(err.Error())
			}
		}()
	}
	wg.Wait()
	r := Readiness{Status: "ready", Checks: res}
	for _, c := range res {
		if !c.OK {
			r.Status = "unavailable"
			r.Failing = append(r.Failing, c.Name)
		}
	}
	return r
}

// runCheck runs c, returning the context's error if c overruns it.
func runCheck(ctx context.Context, c Check) error {
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer within the check timeout: %w", ctx.Err())
	}
}

func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	rd := s.CheckReadiness(r.Context())
	code := http.StatusOK
	if rd.Status != "ready" {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, rd)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// LogLevelHandler serves the log level held by level: GET returns
// {"level":"INFO"}; PUT with a body of {"level":"debug"} or just "debug"
// (any slog level name, e.g. WARN or DEBUG-4) changes it at once and logs
// the change. A bad body is refused with 400 and the level stays.
func LogLevelHandler(level *slog.LevelVar, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			writeJSON(w, http.StatusOK, map[string]string{"level": level.Level().String()})
		case http.MethodPut, http.MethodPost:
			body, err := io.ReadAll(io.LimitReader(r.Body, 1025))
			if err != nil || len(body) > 1024 {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body must be at most 1 KiB"})
				return
			}
			name := strings.TrimSpace(string(body))
			if strings.HasPrefix(name, "{") {
				var req struct {
					Level string `json:"level"`
				}
				if err := json.Unmarshal(body, &req); err != nil {
					writeJSON(w, http.StatusBadRequest, map[string]string{"error": `want {"level":"debug|info|warn|error"}: ` + err.Error()})
					return
				}
				name = req.Level
			}
			var l slog.Level
			if err := l.UnmarshalText([]byte(name)); err != nil || name == "" {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("unknown level %q: want debug, info, warn or error", name)})
				return
			}
			prev := level.Level()
			level.Set(l)
			if log != nil {
				log.LogAttrs(r.Context(), slog.LevelWarn, "log level changed", slog.String("from", prev.String()), slog.String("to", l.String()))
			}
			writeJSON(w, http.StatusOK, map[string]string{"level": l.String(), "previous": prev.String()})
		default:
			w.Header().Set("Allow", "GET, PUT")
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "use GET or PUT"})
		}
	})
}
