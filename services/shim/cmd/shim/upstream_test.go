package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
)

func TestUpstreamFlagsAreChecked(t *testing.T) {
	srv, err := natsembed.Start(natsembed.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	base := []string{"--nats-url", srv.ClientURL(), "--ops-addr", "127.0.0.1:0"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--upstream-url", "ws://127.0.0.1:1", "--upstream-tenant", "acme"}, "--gateway-url"},
		{[]string{"--upstream-url", "ws://127.0.0.1:1", "--gateway-url", "ws://127.0.0.1:2", "--upstream-caller-token", "x"}, "tenant"},
		{[]string{"--upstream-url", "ws://127.0.0.1:1", "--upstream-tenant", "acme", "--upstream-name", "a.b",
			"--gateway-url", "ws://127.0.0.1:2", "--upstream-caller-token", "x"}, "upstream name"},
	} {
		err := run(context.Background(), append(base, c.args...), io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error about %s", c.args, err, c.want)
		}
	}
}
