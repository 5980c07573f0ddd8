package devicehub_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub"
)

// httpFrom sends requests from localIP (any 127.0.0.0/8 address reaches a
// loopback listener on Linux).
func httpFrom(localIP string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(localIP)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
}

// wsFrom connects a simulated WebSocket device from localIP with token.
func wsFrom(t *testing.T, hub *devicehub.Service, localIP, mac, token string) error {
	t.Helper()
	d := newDevice(t, hub, mac, func(c *xzsim.Config) { c.Token = token; c.HTTPClient = httpFrom(localIP) })
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	return d.Connect(ctx)
}

func httpStatus(err error) int {
	var he *xzsim.HandshakeError
	if errors.As(err, &he) {
		return he.StatusCode
	}
	return 0
}

func postOTA(t *testing.T, c *http.Client, hub *devicehub.Service, mac string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, otaURL(hub), strings.NewReader(`{"application":{"version":"1.6.0"}}`))
	req.Header.Set("Device-Id", mac)
	req.Header.Set("Client-Id", "0d6f2c8e-1b7a-4c55-9f43-5e0c1a2b3c4d")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// A source that keeps failing is refused at every door of the hub, with a
// retry hint, whatever it presents; a device from another address is
// served; the refusals reach the audit collectors as one announcement and
// one summary with their count, not one each.
func TestRepeatedDeviceAuthFailuresThrottledPerSource(t *testing.T) {
	e := newEnv(t)
	authFails := subscribeAuthFailures(t, e.nc)
	nc, err := e.ns.Connect("hub")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	hub, err := devicehub.New(devicehub.Config{
		DeviceAddr: "127.0.0.1:0", Auth: devCreds, MQTTAddr: "127.0.0.1:0",
		OTA:          devicehub.OTAConfig{Credentials: devCreds, AutoActivateTenant: testTenant},
		AuthFailures: authguard.Config{Burst: 3, Every: time.Minute},
	}, nc, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hub.Run(ctx) }()
	t.Cleanup(stop)
	<-hub.Ready()

	const attacker, other = "127.0.0.1", "127.0.0.2"
	for i := range 3 {
		if st := httpStatus(wsFrom(t, hub, attacker, "aa:bb:cc:0d:00:01", "wrong-token")); st != http.StatusUnauthorized {
			t.Fatalf("failure %d: HTTP %d, want 401", i, st)
		}
	}
	// Past the budget: WebSocket with the right token, OTA, MQTT with
	// valid credentials, all refused.
	err = wsFrom(t, hub, attacker, "aa:bb:cc:0d:00:02", testToken)
	if st := httpStatus(err); st != http.StatusTooManyRequests {
		t.Fatalf("throttled WebSocket: %v, want HTTP 429", err)
	}
	if st, after := postOTA(t, httpFrom(attacker), hub, "aa:bb:cc:0d:00:03"); st != http.StatusTooManyRequests || after == "" {
		t.Fatalf("throttled OTA: HTTP %d Retry-After %q, want 429 with Retry-After", st, after)
	}
	if secs, _ := strconv.Atoi(func() string { _, a := postOTA(t, httpFrom(attacker), hub, "aa:bb:cc:0d:00:03"); return a }()); secs < 1 || secs > 60 {
		t.Fatalf("Retry-After %d s, want 1-60", secs)
	}
	m := newDevice(t, hub, "aa:bb:cc:0d:00:04", func(c *xzsim.Config) {
		c.Transport = xzsim.TransportMQTT
		c.MQTT = mqttConfig(t, hub, "aa:bb:cc:0d:00:04") // dials from 127.0.0.1
	})
	if err := m.Connect(context.Background()); err == nil {
		t.Fatal("throttled source connected over MQTT")
	}
	resp, err := httpFrom(attacker).Get("http://" + hub.DeviceAddr() + "/mcp/?token=any")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("throttled MCP endpoint: HTTP %d Retry-After %q, want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if hub.Sessions() != 0 {
		t.Fatalf("%d sessions from a throttled source", hub.Sessions())
	}
	// Another address is served on every door.
	if err := wsFrom(t, hub, other, "aa:bb:cc:0d:00:05", testToken); err != nil {
		t.Fatalf("device from another address: %v", err)
	}
	if st, _ := postOTA(t, httpFrom(other), hub, "aa:bb:cc:0d:00:06"); st != http.StatusOK {
		t.Fatalf("OTA from another address: HTTP %d", st)
	}

	// Stop the hub: what is still folded is announced at shutdown.
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var got []wire.DeviceAuthFailure
	deadline := time.After(waitLimit)
	for total := 0; total < 8; {
		select {
		case msg := <-authFails:
			var f wire.DeviceAuthFailure
			if err := json.Unmarshal(msg.Data, &f); err != nil {
				t.Fatal(err)
			}
			got = append(got, f)
			total += max(f.Count, 1)
		case <-deadline:
			t.Fatalf("announcements %+v, want 8 refusals in all", got)
		}
	}
	// 3 failures + WebSocket, 2 OTA, MQTT and MCP endpoint throttled = 8
	// refusals, in 2 announcements.
	if len(got) != 2 || got[0].Count != 0 || got[1].Count != 7 || got[1].RemoteIP != attacker {
		t.Fatalf("announcements %+v, want the first and one summary of 7", got)
	}
}

// Failures claiming one device id from many addresses are answered 429
// past the device's budget, yet the device's own credential still works.
func TestDeviceIDBudgetNeverLocksOutTheRealDevice(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{DeviceAuthFailures: authguard.Config{Burst: 2, Every: time.Minute}})
	const mac = "aa:bb:cc:0d:00:10"
	want := []int{http.StatusUnauthorized, http.StatusUnauthorized, http.StatusTooManyRequests, http.StatusTooManyRequests}
	for i, status := range want {
		from := "127.0.1." + strconv.Itoa(i+1)
		if st := httpStatus(wsFrom(t, hub, from, mac, "wrong-token")); st != status {
			t.Fatalf("failure %d for %s from %s: HTTP %d, want %d", i, mac, from, st, status)
		}
	}
	if err := wsFrom(t, hub, "127.0.1.9", mac, testToken); err != nil {
		t.Fatalf("the device with its own token: %v", err)
	}
}
