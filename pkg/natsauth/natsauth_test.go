package natsauth

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
)

func TestFlagsFallBackToTheEnvironment(t *testing.T) {
	env := map[string]string{EnvUser: "shim", EnvPassword: "pw"}
	c := FromEnv(func(k string) string { return env[k] })
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c.Register(fs)
	if err := fs.Parse([]string{"--nats-password", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if c.User != "shim" || c.Password != "from-flag" {
		t.Fatalf("%+v", c)
	}
}

func TestOptionsRefuseAmbiguousCredentials(t *testing.T) {
	for _, c := range []Credentials{
		{User: "a"},
		{Password: "p"},
		{User: "a", Password: "p", CredsFile: "x.creds"},
		{NKeySeedFile: "seed", CredsFile: "x.creds"},
		{NKeySeedFile: filepath.Join(t.TempDir(), "missing")},
	} {
		if _, err := c.Options(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	if opts, err := (Credentials{}).Options(); err != nil || len(opts) != 0 {
		t.Fatalf("no credentials: %v %v", opts, err)
	}
}

// A server with per-service users admits each with its credentials
// only, and a user's replies come to its own inbox prefix.
func TestOptionsAuthenticateToARealServer(t *testing.T) {
	ns, err := natsembed.Start(natsembed.Config{StoreDir: t.TempDir(), Port: 0,
		Users: []*server.User{{Username: "gateway", Password: "gw-secret"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	for _, c := range []struct {
		creds Credentials
		ok    bool
	}{
		{Credentials{User: "gateway", Password: "gw-secret"}, true},
		{Credentials{User: "gateway", Password: "wrong"}, false},
		{Credentials{}, false},
	} {
		opts, err := c.creds.Options()
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(ns.ClientURL(), append(opts, nats.MaxReconnects(0))...)
		if (err == nil) != c.ok {
			t.Errorf("%+v: connect error %v, want ok=%v", c.creds, err, c.ok)
		}
		if nc != nil {
			if inbox := nc.NewInbox(); c.ok && !strings.HasPrefix(inbox, InboxPrefix("gateway")+".") {
				t.Errorf("inbox %q, want the user's prefix", inbox)
			}
			nc.Close()
		}
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "shim.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	if opts, err := (Credentials{NKeySeedFile: seedFile}).Options(); err != nil || len(opts) != 1 {
		t.Fatalf("nkey seed file: %v %v", opts, err)
	}
}
