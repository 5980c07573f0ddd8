// Package natsembed runs an in-process NATS server with JetStream. `xiaoclaw
// dev` uses it so a laptop needs no external service, and tests use it for a
// real bus on a random loopback port.
package natsembed

import (
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Config of an embedded server.
type Config struct {
	// Host and Port to listen on; Port 0 picks a free port, -1 listens nowhere
	// (in-process connections only). Host defaults to 127.0.0.1.
	Host string
	Port int
	// StoreDir holds JetStream data; required.
	StoreDir string
	// ServerName shows in monitoring; defaults to "xiaoclaw-dev".
	ServerName string
	// User and Password, when set, are required of every client, in-process
	// ones included: a listening server is then no open door to the bus.
	User, Password string
	// Users, when set, are the server's users with their subject
	// permissions (as a production server configures them); clients
	// connect with their own credentials (Connect's opts).
	Users []*server.User
}

// Server is a running embedded NATS server.
type Server struct {
	ns             *server.Server
	opts           *server.Options
	user, password string
}

// Start starts the server and waits until it accepts connections.
func Start(cfg Config) (*Server, error) {
	if cfg.StoreDir == "" {
		return nil, fmt.Errorf("natsembed: StoreDir is required")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.ServerName == "" {
		cfg.ServerName = "xiaoclaw-dev"
	}
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		ServerName: cfg.ServerName,
		Host:       cfg.Host,
		Port:       port,
		DontListen: cfg.Port == -1,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
		NoLog:      true,
		MaxPayload: 8 << 20,
	}
	if cfg.User != "" || cfg.Password != "" {
		if cfg.User == "" || cfg.Password == "" {
			return nil, fmt.Errorf("natsembed: User and Password go together")
		}
		opts.Users = []*server.User{{Username: cfg.User, Password: cfg.Password}}
	}
	opts.Users = append(opts.Users, cfg.Users...)
	ns, err := run(opts)
	if err != nil {
		return nil, err
	}
	return &Server{ns: ns, opts: opts, user: cfg.User, password: cfg.Password}, nil
}

func run(opts *server.Options) (*server.Server, error) {
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsembed: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("natsembed: server not ready within 10s")
	}
	return ns, nil
}

// Restart stops the server and starts it again on the same address and
// store directory, as a NATS process restart would: clients lose their
// connection and reconnect, JetStream keeps what it stored on disk. Not for
// a server that does not listen (its in-process clients cannot reconnect).
func (s *Server) Restart() error {
	if s.ns.Addr() == nil {
		return fmt.Errorf("natsembed: Restart needs a listening server")
	}
	opts := s.opts.Clone()
	opts.Port = s.ns.Addr().(*net.TCPAddr).Port
	s.Shutdown()
	ns, err := run(opts)
	if err != nil {
		return err
	}
	s.ns = ns
	return nil
}

// ClientURL is the nats:// URL of the server (empty when it does not listen).
func (s *Server) ClientURL() string {
	if s.ns.Addr() == nil {
		return ""
	}
	return s.ns.ClientURL()
}

// Connect opens a client connection; in-process when the server does not listen.
func (s *Server) Connect(name string, opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1)}, opts...)
	if s.user != "" {
		opts = append(opts, nats.UserInfo(s.user, s.password))
	}
	if s.ns.Addr() == nil {
		opts = append(opts, nats.InProcessServer(s.ns))
	}
	return nats.Connect(s.ClientURL(), opts...)
}

// Shutdown stops the server and waits for it to finish.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}
