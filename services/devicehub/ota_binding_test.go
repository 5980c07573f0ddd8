package devicehub_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub"
)

// otaCredentials posts an OTA request for mac as the firmware does and
// returns the WebSocket token and MQTT credentials handed out.
func otaCredentials(t *testing.T, hub *devicehub.Service, mac, clientID string) (wsToken string, mqtt xzsim.MQTTConfig) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, otaURL(hub), strings.NewReader(`{"mac_address":"`+mac+`","uuid":"`+clientID+`","application":{"version":"1.6.0"}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Device-Id", mac)
	req.Header.Set("Client-Id", clientID)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("OTA: HTTP %d %s", resp.StatusCode, body)
	}
	var reply struct {
		WebSocket struct {
			Token string `json:"token"`
		} `json:"websocket"`
		MQTT struct {
			Endpoint string `json:"endpoint"`
			ClientID string `json:"client_id"`
			Username string `json:"username"`
			Password string `json:"password"`
		} `json:"mqtt"`
	}
	if err := json.Unmarshal(body, &reply); err != nil || reply.WebSocket.Token == "" || reply.MQTT.Password == "" {
		t.Fatalf("OTA reply %s (%v)", body, err)
	}
	return reply.WebSocket.Token, xzsim.MQTTConfig{Endpoint: hub.MQTTAddr(), ClientID: reply.MQTT.ClientID,
		Username: reply.MQTT.Username, Password: reply.MQTT.Password}
}

// The credentials OTA hands to one device authenticate that device only:
// presented with another MAC they are refused, on both transports, and
// they are never the tenant's static token.
func TestOTACredentialsAreBoundToTheirDevice(t *testing.T) {
	e := newEnv(t)
	hub := startMQTTHub(t, e, nil)
	const macA, macB = "aa:bb:cc:0e:00:0a", "aa:bb:cc:0e:00:0b"
	const clientA = "6a1c2f52-7d1e-4f0b-9a43-0d4e5f6a7b8c"
	tokenA, mqttA := otaCredentials(t, hub, macA, clientA)
	if tokenA == testToken {
		t.Fatal("OTA handed out the tenant's static device token")
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()

	// A's WebSocket token presented as B: refused before the upgrade.
	b := newDevice(t, hub, macB, func(c *xzsim.Config) { c.Token = tokenA; c.ClientID = clientA })
	var he *xzsim.HandshakeError
	if err := b.Connect(ctx); !errors.As(err, &he) || he.StatusCode != http.StatusUnauthorized {
		t.Fatalf("B with A's token: %v, want HTTP 401", err)
	}
	// A's MQTT credentials with B's MAC in the client id: refused.
	stolen := mqttA
	stolen.ClientID = strings.Replace(mqttA.ClientID, "aa_bb_cc_0e_00_0a", "aa_bb_cc_0e_00_0b", 1)
	bm := newDevice(t, hub, macB, func(c *xzsim.Config) { c.Transport = xzsim.TransportMQTT; c.MQTT = stolen })
	if err := bm.Connect(ctx); err == nil {
		t.Fatal("B connected over MQTT with A's credentials")
	}
	if hub.Sessions() != 0 {
		t.Fatalf("%d sessions after refusals", hub.Sessions())
	}

	// A's own credentials work for A, on both transports.
	connectOnline(t, e, hub, macA, func(c *xzsim.Config) { c.Token = tokenA; c.ClientID = clientA })
	am := newDevice(t, hub, macA, func(c *xzsim.Config) { c.Transport = xzsim.TransportMQTT; c.MQTT = mqttA })
	if err := am.Connect(ctx); err != nil {
		t.Fatalf("A over MQTT with its own credentials: %v", err)
	}
}
