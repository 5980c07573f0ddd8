// Package natsembedtest gives a test an embedded NATS server (natsembed,
// with JetStream) and connections to it, all closed when the test ends.
package natsembedtest

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
)

// Start starts a server storing in a temporary directory of t, shut down
// when the test ends.
func Start(t testing.TB) *natsembed.Server {
	t.Helper()
	s, err := natsembed.Start(natsembed.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// Connect connects to s as name, closed when the test ends.
func Connect(t testing.TB, s *natsembed.Server, name string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := s.Connect(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
