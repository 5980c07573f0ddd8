package devicehub_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/xiaoclaw/xiaoclaw/pkg/activation"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub"
)

var devCreds = devicehub.StaticCredentials{Token: testToken, Tenant: testTenant}

// startMQTTHub runs a hub with the MQTT broker and the OTA endpoint; the
// dev tenant's static credentials authenticate both transports.
func startMQTTHub(t testing.TB, e *env, mutate func(*devicehub.Config)) *devicehub.Service {
	t.Helper()
	cfg := devicehub.Config{
		Auth:     devCreds,
		MQTTAddr: "127.0.0.1:0",
		OTA:      devicehub.OTAConfig{Credentials: devCreds, AutoActivateTenant: testTenant},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	return startHub(t, e, cfg)
}

func otaURL(svc *devicehub.Service) string { return "http://" + svc.DeviceAddr() + devicehub.OTAPath }

// mqttClientID is the firmware's MQTT client id of mac.
func mqttClientID(mac string) string {
	return "GID_test@@@" + strings.ReplaceAll(strings.ToLower(mac), ":", "_") + "@@@" + "0d6f2c8e-1b7a-4c55-9f43-5e0c1a2b3c4d"
}

// mqttConfig mints the dev tenant's MQTT credentials for mac.
func mqttConfig(t testing.TB, svc *devicehub.Service, mac string) xzsim.MQTTConfig {
	t.Helper()
	id := mqttClientID(mac)
	user, pass, err := devCreds.MintMQTTCredentials(context.Background(), testTenant, id)
	if err != nil {
		t.Fatal(err)
	}
	return xzsim.MQTTConfig{Endpoint: svc.MQTTAddr(), ClientID: id, Username: user, Password: pass}
}

// deviceOver returns a disconnected simulated device for svc over transport.
func deviceOver(t testing.TB, svc *devicehub.Service, transport, mac string, mutate func(*xzsim.Config)) *xzsim.Device {
	t.Helper()
	return newDevice(t, svc, mac, func(c *xzsim.Config) {
		if transport == wire.TransportMQTT {
			c.Transport = xzsim.TransportMQTT
			c.MQTT = mqttConfig(t, svc, mac)
		}
		if mutate != nil {
			mutate(c)
		}
	})
}

func TestOTABootThenMQTTSessionServesCalls(t *testing.T) {
	e := newEnv(t)
	hub := startMQTTHub(t, e, nil)
	const mac = "aa:bb:cc:0f:00:01"
	w := watch(t, e, testTenant, canonical(t, mac))
	d := newDevice(t, hub, mac, func(c *xzsim.Config) { c.OTAURL = otaURL(hub); c.URL = "" })
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := d.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	if d.Transport() != xzsim.TransportMQTT {
		t.Fatalf("the OTA reply offered both transports; the firmware picks mqtt, the sim picked %q", d.Transport())
	}
	var reply struct {
		ServerTime struct {
			Timestamp int64 `json:"timestamp"`
		} `json:"server_time"`
		Firmware struct {
			Version string `json:"version"`
			URL     string `json:"url"`
		} `json:"firmware"`
		WebSocket struct {
			URL   string `json:"url"`
			Token string `json:"token"`
		} `json:"websocket"`
		MQTT struct {
			Endpoint       string `json:"endpoint"`
			ClientID       string `json:"client_id"`
			PublishTopic   string `json:"publish_topic"`
			SubscribeTopic string `json:"subscribe_topic"`
		} `json:"mqtt"`
	}
	raw := d.OTAReply()
	if err := json.Unmarshal(raw, &reply); err != nil {
		t.Fatal(err)
	}
	if reply.ServerTime.Timestamp == 0 || reply.Firmware.Version != xzsim.DefaultFirmwareVersion || reply.Firmware.URL != "" ||
		reply.WebSocket.URL != wsURL(hub) || reply.WebSocket.Token == "" || reply.WebSocket.Token == testToken ||
		reply.MQTT.Endpoint != hub.MQTTAddr() || reply.MQTT.PublishTopic != "device-server" ||
		reply.MQTT.SubscribeTopic != "devices/p2p/aa_bb_cc_0f_00_01" || !strings.HasPrefix(reply.MQTT.ClientID, "GID_xiaoclaw@@@aa_bb_cc_0f_00_01@@@") {
		t.Fatalf("OTA reply: %s", raw)
	}

	ev := w.nextKind(wire.DeviceOnline)
	if ev.Transport != wire.TransportMQTT || !ev.MCP || len(toolNames(t, ev.Tools)) != 4 || ev.DeviceRaw != "aa_bb_cc_0f_00_01" {
		t.Fatalf("online event: %+v", ev)
	}
	// The device never subscribed, yet the call reaches it on its own connection.
	r := decodeResponse(t, rpc(t, e.nc, testTenant, ev.Device, callBody("self.audio_speaker.set_volume", `{"volume":33}`), 5*time.Second))
	if r.Result == nil || d.Volume() != 33 {
		t.Fatalf("call over MQTT: %+v, volume %d", r, d.Volume())
	}
}

func TestMQTTWrongCredentialsRefused(t *testing.T) {
	e := newEnv(t)
	hub := startMQTTHub(t, e, func(c *devicehub.Config) { c.AuthFailures = announceEach })
	const mac = "aa:bb:cc:0f:00:02"
	good := mqttConfig(t, hub, mac)
	authFails := subscribeAuthFailures(t, e.nc)
	for name, mutate := range map[string]func(*xzsim.MQTTConfig){
		"wrong password":       func(m *xzsim.MQTTConfig) { m.Password = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=" },
		"no password":          func(m *xzsim.MQTTConfig) { m.Password = "" },
		"password of other id": func(m *xzsim.MQTTConfig) { m.ClientID = mqttClientID("aa:bb:cc:0f:00:03") },
		"client id not GID_…":  func(m *xzsim.MQTTConfig) { m.ClientID = "aa_bb_cc_0f_00_02" },
		"client id bad device": func(m *xzsim.MQTTConfig) { m.ClientID = "GID_x@@@aa.bb@@@u" },
	} {
		mc := good
		mutate(&mc)
		d := newDevice(t, hub, mac, func(c *xzsim.Config) { c.Transport = xzsim.TransportMQTT; c.MQTT = mc })
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		err := d.Connect(ctx)
		cancel()
		if !errors.Is(err, xzsim.ErrMQTTRefused) {
			t.Errorf("%s: Connect returned %v, want a refused CONNECT", name, err)
		}
	}
	if hub.Sessions() != 0 {
		t.Fatalf("refused devices hold %d sessions", hub.Sessions())
	}
	reasons := expectAuthFailures(t, authFails, 5, wire.TransportMQTT, good.Password)
	if reasons["unauthenticated"] != 3 || reasons["invalid device id"] != 1 {
		t.Errorf("auth failure reasons %v", reasons)
	}
	// The right credentials still work on the same broker.
	connectOnline(t, e, hub, mac, func(c *xzsim.Config) { c.Transport = xzsim.TransportMQTT; c.MQTT = good })
}

func TestMQTTHelloV3AnsweredWithUDPBlockThenGoodbye(t *testing.T) {
	e := newEnv(t)
	hub := startMQTTHub(t, e, nil)
	const mac = "aa:bb:cc:0f:00:04"
	w := watch(t, e, testTenant, canonical(t, mac))
	d := deviceOver(t, hub, wire.TransportMQTT, mac, func(c *xzsim.Config) { c.HelloTimeout = 2 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := d.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	online := w.nextKind(wire.DeviceOnline)
	if _, err := d.OpenAudio(ctx); err != nil {
		t.Fatalf("the firmware would not accept the server hello: %v", err)
	}
	var h struct {
		Type        string `json:"type"`
		Transport   string `json:"transport"`
		SessionID   string `json:"session_id"`
		AudioParams *struct {
			Format        string `json:"format"`
			SampleRate    int    `json:"sample_rate"`
			Channels      int    `json:"channels"`
			FrameDuration int    `json:"frame_duration"`
		} `json:"audio_params"`
		UDP *struct {
			Server     string `json:"server"`
			Port       int    `json:"port"`
			Key        string `json:"key"`
			Nonce      string `json:"nonce"`
			Encryption string `json:"encryption"`
		} `json:"udp"`
	}
	if err := json.Unmarshal(d.ServerHello(), &h); err != nil {
		t.Fatal(err)
	}
	_, udpPort, _ := net.SplitHostPort(hub.UDPAddr())
	key, kerr := hex.DecodeString(h.UDP.Key)
	nonce, nerr := hex.DecodeString(h.UDP.Nonce)
	for what, ok := range map[string]bool{
		"type hello":                   h.Type == "hello",
		"transport udp":                h.Transport == "udp",
		"session_id of the session":    h.SessionID == online.SessionID,
		"audio_params opus/24000/1/60": h.AudioParams != nil && h.AudioParams.Format == "opus" && h.AudioParams.SampleRate == 24000 && h.AudioParams.Channels == 1 && h.AudioParams.FrameDuration == 60,
		"udp.server the bound host":    h.UDP != nil && h.UDP.Server == "127.0.0.1",
		"udp.port the sink's port":     h.UDP != nil && strconv.Itoa(h.UDP.Port) == udpPort,
		"udp.key 16 bytes of hex":      kerr == nil && len(key) == 16,
		"udp.nonce 16 bytes of hex":    nerr == nil && len(nonce) == 16,
		"udp.encryption aes-128-ctr":   h.UDP != nil && h.UDP.Encryption == "aes-128-ctr",
	} {
		if !ok {
			t.Errorf("server hello: %s: %s", what, d.ServerHello())
		}
	}
	// No audio pipeline: the hub ends the voice session with a goodbye the
	// firmware honours (matching session id).
	eventually.True(t, "goodbye honoured", func() bool { return d.Goodbyes() == 1 && !d.AudioOpen() })
	// The MQTT session itself goes on.
	r := decodeResponse(t, rpc(t, e.nc, testTenant, online.Device, callBody("self.screen.set_theme", `{"theme":"dark"}`), 5*time.Second))
	if r.Result == nil || d.Theme() != "dark" {
		t.Fatalf("call after the voice session: %+v", r)
	}
}

func TestMQTTVoiceSessionHeldUntilDeviceGoodbye(t *testing.T) {
	e := newEnv(t)
	hub := startMQTTHub(t, e, func(c *devicehub.Config) { c.GoodbyeAfter = time.Hour })
	const mac = "aa:bb:cc:0f:00:05"
	d := connectOnline(t, e, hub, mac, func(c *xzsim.Config) { c.Transport = xzsim.TransportMQTT; c.MQTT = mqttConfig(t, hub, mac) })
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if _, err := d.OpenAudio(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.CloseAudio(ctx); err != nil {
		t.Fatal(err)
	}
	// A second hello opens a new voice session on the same connection.
	if _, err := d.OpenAudio(ctx); err != nil {
		t.Fatal(err)
	}
	if d.Goodbyes() != 0 || !d.AudioOpen() {
		t.Fatalf("goodbyes %d, audio open %v", d.Goodbyes(), d.AudioOpen())
	}
}

func TestMQTTToolsListedPageByPageUnderThePayloadLimit(t *testing.T) {
	e := newEnv(t)
	hub := startMQTTHub(t, e, nil)
	const mac = "aa:bb:cc:0f:00:06"
	w := watch(t, e, testTenant, canonical(t, mac))
	d := deviceOver(t, hub, wire.TransportMQTT, mac, func(c *xzsim.Config) { c.ExtraTools = 196 })
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := d.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	ev := w.nextKind(wire.DeviceOnline)
	names := toolNames(t, ev.Tools)
	if len(names) != 200 || names[199] != "self.sim.extra_0196" {
		t.Fatalf("catalog has %d tools (last %q), want 200", len(names), names[len(names)-1])
	}
	// Each page had to fit the 8 KB publish limit (the hub refuses larger
	// ones), so 200 tools took many pages.
	if pages := d.Requests("tools/list"); pages < 8 {
		t.Fatalf("200 tools listed in %d pages", pages)
	}
}

// rawDevice is a hand-driven MQTT 3.1.1 device on a paho client: it never
// subscribes and answers the hub's MCP requests with answer.
func rawDevice(t *testing.T, hub *devicehub.Service, mac string, answer func(req map[string]any) []byte) paho.Client {
	t.Helper()
	mc := mqttConfig(t, hub, mac)
	var client paho.Client
	opts := paho.NewClientOptions().AddBroker("tcp://" + mc.Endpoint).SetClientID(mc.ClientID).
		SetUsername(mc.Username).SetPassword(mc.Password).SetProtocolVersion(4).SetAutoReconnect(false).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
			var env struct {
				Type    string         `json:"type"`
				Payload map[string]any `json:"payload"`
			}
			if json.Unmarshal(m.Payload(), &env) != nil || env.Type != "mcp" || env.Payload["id"] == nil {
				return
			}
			go client.Publish("device-server", 0, false, answer(env.Payload))
		})
	client = paho.NewClient(opts)
	if tok := client.Connect(); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	t.Cleanup(func() { client.Disconnect(0) })
	return client
}

func mcpReply(req map[string]any, result string) []byte {
	id, _ := json.Marshal(req["id"])
	return []byte(`{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":` + string(id) + `,"result":` + result + `}}`)
}

// bigResultDevice connects a raw MQTT device whose tool self.big answers
// with the result big, and any other call with a short one.
func bigResultDevice(t *testing.T, hub *devicehub.Service, mac, big string) {
	t.Helper()
	rawDevice(t, hub, mac, func(req map[string]any) []byte {
		switch req["method"] {
		case "initialize":
			return mcpReply(req, `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"raw","version":"1"}}`)
		case "tools/list":
			return mcpReply(req, `{"tools":[{"name":"self.big","description":"","inputSchema":{"type":"object","properties":{}}}]}`)
		}
		if p, _ := req["params"].(map[string]any); p["name"] == "self.big" {
			return mcpReply(req, big)
		}
		return mcpReply(req, `{"content":[{"type":"text","text":"true"}],"isError":false}`)
	})
}

func TestMQTTOversizedMessagesRefusedWithTooLarge(t *testing.T) {
	e := newEnv(t)
	hub := startMQTTHub(t, e, nil)
	const mac = "aa:bb:cc:0f:00:07"
	w := watch(t, e, testTenant, canonical(t, mac))
	big := `{"content":[{"type":"text","text":"` + strings.Repeat("x", 9000) + `"}],"isError":false}`
	bigResultDevice(t, hub, mac, big)
	dev := w.nextKind(wire.DeviceOnline).Device

	f := fault(t, rpc(t, e.nc, testTenant, dev, callBody("self.big", `{}`), 5*time.Second))
	if f.Code != wire.FaultTooLarge || !strings.Contains(f.Message, "8192") {
		t.Fatalf("oversized response: %+v", f)
	}
	f = fault(t, rpc(t, e.nc, testTenant, dev, callBody("self.small", `{"pad":"`+strings.Repeat("y", 9000)+`"}`), 5*time.Second))
	if f.Code != wire.FaultTooLarge {
		t.Fatalf("oversized request: %+v", f)
	}
	// The session survives both.
	if r := decodeResponse(t, rpc(t, e.nc, testTenant, dev, callBody("self.small", `{}`), 5*time.Second)); r.Result == nil {
		t.Fatalf("call after refusals: %+v", r)
	}
}

// rawConn is a bare TCP MQTT client for what paho will not do.
type rawConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialRawMQTT(t *testing.T, hub *devicehub.Service, mac string, keepalive uint16) *rawConn {
	t.Helper()
	mc := mqttConfig(t, hub, mac)
	c, err := net.Dial("tcp", mc.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	str := func(s string) []byte { return append(binary.BigEndian.AppendUint16(nil, uint16(len(s))), s...) }
	var body []byte
	body = append(body, str("MQTT")...)
	body = append(body, 4, 0xc2) // level 3.1.1; username, password, clean session
	body = binary.BigEndian.AppendUint16(body, keepalive)
	body = append(append(append(body, str(mc.ClientID)...), str(mc.Username)...), str(mc.Password)...)
	rc := &rawConn{t: t, c: c, r: bufio.NewReader(c)}
	rc.write(0x10, body)
	ack := make([]byte, 4)
	_ = c.SetReadDeadline(time.Now().Add(waitLimit))
	if _, err := io.ReadFull(rc.r, ack); err != nil || ack[0] != 0x20 || ack[3] != 0 {
		t.Fatalf("CONNACK %x: %v", ack, err)
	}
	return rc
}

func (rc *rawConn) write(header byte, body []byte) {
	pkt := []byte{header}
	n := len(body)
	for {
		b := byte(n % 128)
		n /= 128
		if n > 0 {
			b |= 0x80
		}
		pkt = append(pkt, b)
		if n == 0 {
			break
		}
	}
	if _, err := rc.c.Write(append(pkt, body...)); err != nil {
		rc.t.Fatal(err)
	}
}

// waitClosed reads (and drops) packets until the hub closes the connection.
func (rc *rawConn) waitClosed() {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(waitLimit))
	if _, err := io.Copy(io.Discard, rc.r); err != nil {
		rc.t.Fatalf("connection not closed by the hub: %v", err)
	}
}

func TestMQTTSilentDeviceDisconnectedAfterOneAndAHalfKeepalives(t *testing.T) {
	e := newEnv(t)
	// The raw device never answers MCP: discovery gives up quickly and the
	// session is announced, so that its end is announced too.
	hub := startMQTTHub(t, e, func(c *devicehub.Config) { c.CallTimeout = 200 * time.Millisecond })
	const mac = "aa:bb:cc:0f:00:08"
	w := watch(t, e, testTenant, canonical(t, mac))
	start := time.Now()
	rc := dialRawMQTT(t, hub, mac, 2) // never answers MCP, never pings
	rc.waitClosed()
	if took := time.Since(start); took < 2900*time.Millisecond {
		t.Fatalf("disconnected after %s, before 1.5 × keepalive", took)
	}
	ev := w.nextKind(wire.DeviceOffline)
	if !strings.Contains(ev.Reason, "keepalive") {
		t.Fatalf("offline reason %q", ev.Reason)
	}
}

func TestMQTTQoS1PublishClosesTheConnection(t *testing.T) {
	e := newEnv(t)
	hub := startMQTTHub(t, e, nil)
	rc := dialRawMQTT(t, hub, "aa:bb:cc:0f:00:09", 60)
	body := append(binary.BigEndian.AppendUint16(nil, uint16(len("device-server"))), "device-server"...)
	body = append(binary.BigEndian.AppendUint16(body, 1), `{"type":"listen"}`...) // packet id 1
	rc.write(0x32, body)                                                          // PUBLISH, QoS 1
	rc.waitClosed()
	eventually.True(t, "session released", func() bool { return hub.Sessions() == 0 })
}

func TestMQTTSubscriptionsLimitedToOwnTopic(t *testing.T) {
	e := newEnv(t)
	hub := startMQTTHub(t, e, nil)
	const mac = "aa:bb:cc:0f:00:0a"
	w := watch(t, e, testTenant, canonical(t, mac))
	c := rawDevice(t, hub, mac, func(req map[string]any) []byte {
		return mcpReply(req, `{"tools":[]}`)
	})
	w.nextKind(wire.DeviceOnline)
	for topic, want := range map[string]byte{"devices/p2p/aa_bb_cc_0f_00_0a": 0, "device-server": 0x80, "devices/p2p/aa_bb_cc_00_00_01": 0x80, "$SYS/broker/clients/connected": 0x80} {
		tok := c.Subscribe(topic, 0, nil)
		if !tok.WaitTimeout(waitLimit) {
			t.Fatal("no SUBACK")
		}
		st := tok.(*paho.SubscribeToken)
		if got := st.Result()[topic]; got != want {
			t.Errorf("SUBSCRIBE %s: SUBACK %#x, want %#x", topic, got, want)
		}
	}
}

func TestActivationFlow(t *testing.T) {
	e := newEnv(t)
	acts := activation.NewMemory(activation.Config{})
	hub := startMQTTHub(t, e, func(c *devicehub.Config) {
		c.Auth = devicehub.StaticCredentials{Token: "tok-acme", Tenant: "acme"}
		c.OTA = devicehub.OTAConfig{Credentials: devicehub.StaticCredentials{Token: "tok-acme", Tenant: "acme"}, Activations: acts}
	})
	const mac = "aa:bb:cc:0f:00:0b"
	w := watch(t, e, "acme", canonical(t, mac))
	d := newDevice(t, hub, mac, func(c *xzsim.Config) {
		c.OTAURL = otaURL(hub)
		c.ActivationPoll = 20 * time.Millisecond
		c.WrapActivation = true
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	connected := make(chan error, 1)
	go func() { connected <- d.Connect(ctx) }()
	var code string
	eventually.True(t, "activation code shown", func() bool { code = d.ActivationCode(); return code != "" })
	if len(code) != 6 || strings.Trim(code, "0123456789") != "" {
		t.Fatalf("code %q is not 6 digits", code)
	}
	if act, err := acts.Pending(ctx, code); err != nil || act.Device != canonical(t, mac) || act.Challenge == "" {
		t.Fatalf("pending activation: %+v %v", act, err)
	}
	// While unbound, /activate answers 202 to a bare body as well.
	if st := postActivate(t, hub, mac, `{}`); st != http.StatusAccepted {
		t.Fatalf("activate before binding: %d", st)
	}
	if _, err := acts.Bind(ctx, "000000", "acme"); !errors.Is(err, activation.ErrNotFound) && code != "000000" {
		t.Fatalf("binding an unknown code: %v", err)
	}
	if _, err := acts.Bind(ctx, code, "acme"); err != nil {
		t.Fatal(err)
	}
	if err := <-connected; err != nil {
		t.Fatalf("Connect after activation: %v", err)
	}
	if st := postActivate(t, hub, mac, `{"Payload":{"algorithm":"hmac-sha256","challenge":"x"}}`); st != http.StatusOK {
		t.Fatalf("activate after binding: %d", st)
	}
	ev := w.nextKind(wire.DeviceOnline)
	if ev.Tenant != "acme" || ev.Transport != wire.TransportMQTT {
		t.Fatalf("online after activation: %+v", ev)
	}
	if _, err := acts.Bind(ctx, code, "acme"); !errors.Is(err, activation.ErrNotFound) {
		t.Fatalf("a code binds once: %v", err)
	}
}

func postActivate(t *testing.T, hub *devicehub.Service, mac, body string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+hub.DeviceAddr()+devicehub.ActivatePath, strings.NewReader(body))
	req.Header.Set("Device-Id", mac)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestOTARefusesJunkWithClearErrors(t *testing.T) {
	e := newEnv(t)
	// More junk than the default failure budget of one source.
	hub := startMQTTHub(t, e, func(c *devicehub.Config) { c.AuthFailures.Burst = 100 })
	for _, tc := range []struct {
		name, path string
		hdr        map[string]string
		body       string
		status     int
		errPart    string
	}{
		{"not JSON", devicehub.OTAPath, map[string]string{"Device-Id": "aa:bb:cc:dd:ee:ff", "Client-Id": "u1"}, `hello`, 400, "JSON object"},
		{"array", devicehub.OTAPath, map[string]string{"Device-Id": "aa:bb:cc:dd:ee:ff", "Client-Id": "u1"}, `[]`, 400, "JSON object"},
		{"no device", devicehub.OTAPath, map[string]string{"Client-Id": "u1"}, `{}`, 400, "Device-Id"},
		{"no client id", devicehub.OTAPath, map[string]string{"Device-Id": "aa:bb:cc:dd:ee:ff"}, `{}`, 400, "Client-Id"},
		{"device ids disagree", devicehub.OTAPath, map[string]string{"Device-Id": "aa:bb:cc:dd:ee:ff", "Client-Id": "u1"}, `{"mac_address":"11:22:33:44:55:66"}`, 400, "disagree"},
		{"version not a string", devicehub.OTAPath, map[string]string{"Device-Id": "aa:bb:cc:dd:ee:ff", "Client-Id": "u1"}, `{"application":{"version":7}}`, 400, "body"},
		{"bad activation version", devicehub.OTAPath, map[string]string{"Device-Id": "aa:bb:cc:dd:ee:ff", "Client-Id": "u1", "Activation-Version": "x"}, `{}`, 400, "Activation-Version"},
		{"too large", devicehub.OTAPath, map[string]string{"Device-Id": "aa:bb:cc:dd:ee:ff", "Client-Id": "u1"}, `{"x":"` + strings.Repeat("a", 70000) + `"}`, 413, "too large"},
		{"activate junk", devicehub.ActivatePath, map[string]string{"Device-Id": "aa:bb:cc:dd:ee:ff"}, `{"challenge":1}`, 400, "strings"},
		{"activate no device", devicehub.ActivatePath, nil, `{}`, 400, "Device-Id"},
		{"activate unknown device", devicehub.ActivatePath, map[string]string{"Device-Id": "aa:bb:cc:dd:ee:01"}, `{}`, 404, "first"},
	} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+hub.DeviceAddr()+tc.path, strings.NewReader(tc.body))
		for k, v := range tc.hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Error string }
		derr := json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || derr != nil || !strings.Contains(body.Error, tc.errPart) {
			t.Errorf("%s: HTTP %d %q (%v), want %d with %q", tc.name, resp.StatusCode, body.Error, derr, tc.status, tc.errPart)
		}
	}
}

// TestBehaviourOverBothTransports runs the same device behaviours over a
// WebSocket and an MQTT device: the NATS side must not tell them apart.
func TestBehaviourOverBothTransports(t *testing.T) {
	for i, transport := range []string{wire.TransportWebSocket, wire.TransportMQTT} {
		t.Run(transport, func(t *testing.T) {
			e := newEnv(t)
			hub := startMQTTHub(t, e, nil)
			mac := "aa:bb:cc:0f:01:0" + strconv.Itoa(i)
			dev := canonical(t, mac)
			w := watch(t, e, testTenant, dev)
			d := deviceOver(t, hub, transport, mac, nil)
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			if err := d.Connect(ctx); err != nil {
				t.Fatal(err)
			}
			online := w.nextKind(wire.DeviceOnline)
			if online.Transport != transport || online.Device != dev || len(toolNames(t, online.Tools)) != 4 {
				t.Fatalf("online: %+v", online)
			}

			// A call changes the device's state and the result is relayed.
			r := decodeResponse(t, rpc(t, e.nc, testTenant, dev, callBody("self.audio_speaker.set_volume", `{"volume":12}`), 5*time.Second))
			if r.Result == nil || d.Volume() != 12 {
				t.Fatalf("set_volume: %+v", r)
			}
			// A device error comes back verbatim: message only, no code.
			r = decodeResponse(t, rpc(t, e.nc, testTenant, dev, callBody("self.audio_speaker.set_volume", `{"volume":101}`), 5*time.Second))
			if r.Error == nil || r.Error.Code != nil || r.Error.Message != "Value exceeds maximum allowed: 100" {
				t.Fatalf("device error: %+v", r.Error)
			}
			// Notifications become events.
			if err := d.Notify(ctx, "notifications/state_changed", json.RawMessage(`{"state":"idle"}`)); err != nil {
				t.Fatal(err)
			}
			if ev := w.nextKind(wire.DeviceNotification); !strings.Contains(string(ev.Notification), "state_changed") {
				t.Fatalf("notification: %s", ev.Notification)
			}
			// A drop fails the pending call at once and announces offline.
			release := d.Hold()
			defer release()
			pending := make(chan wire.Fault, 1)
			go func() {
				m, err := rpcErr(e.nc, testTenant, dev, callBody("self.screen.set_brightness", `{"brightness":5}`), time.Minute)
				if err != nil {
					pending <- wire.Fault{Code: err.Error()}
					return
				}
				pending <- fault(t, m)
			}()
			eventually.True(t, "call held", func() bool { return d.Held() == 1 })
			d.Drop()
			select {
			case f := <-pending:
				if f.Code != wire.FaultDisconnected {
					t.Fatalf("pending call: %+v", f)
				}
			case <-time.After(waitLimit):
				t.Fatal("pending call not failed at once")
			}
			if ev := w.nextKind(wire.DeviceOffline); ev.SessionID != online.SessionID {
				t.Fatalf("offline of session %s, want %s", ev.SessionID, online.SessionID)
			}
		})
	}
}

func TestDeviceMovingBetweenTransportsKeepsItsID(t *testing.T) {
	e := newEnv(t)
	hub := startMQTTHub(t, e, nil)
	const mac = "aa:bb:cc:0f:02:01"
	dev := canonical(t, mac)
	w := watch(t, e, testTenant, dev)
	ws := deviceOver(t, hub, wire.TransportWebSocket, mac, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := ws.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	first := w.nextKind(wire.DeviceOnline)
	mq := deviceOver(t, hub, wire.TransportMQTT, mac, nil)
	if err := mq.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	off := w.nextKind(wire.DeviceOffline)
	second := w.nextKind(wire.DeviceOnline)
	if off.SessionID != first.SessionID || second.Device != first.Device || second.Transport != wire.TransportMQTT ||
		wire.DeviceNodeID(second.Device) != "xz-aabbcc0f0201" || second.SessionID <= first.SessionID {
		t.Fatalf("move: first %+v, offline %+v, second %+v", first, off, second)
	}
	eventually.Closed(t, ws.Done(), "the WebSocket session replaced")
	if r := decodeResponse(t, rpc(t, e.nc, testTenant, dev, callBody("self.audio_speaker.set_volume", `{"volume":9}`), 5*time.Second)); r.Result == nil || mq.Volume() != 9 {
		t.Fatalf("call after the move: %+v", r)
	}
}

// TestResultsOverMaxResultBytesRefused: a tool result over MaxResultBytes
// (here under the MQTT limit) fails its call with PAYLOAD_TOO_LARGE and the
// session stays.
func TestResultsOverMaxResultBytesRefused(t *testing.T) {
	e := newEnv(t)
	hub := startMQTTHub(t, e, func(c *devicehub.Config) { c.MaxResultBytes = 4096 })
	const mac = "aa:bb:cc:0f:00:08"
	w := watch(t, e, testTenant, canonical(t, mac))
	big := `{"content":[{"type":"text","text":"` + strings.Repeat("x", 6000) + `"}],"isError":false}`
	bigResultDevice(t, hub, mac, big)
	dev := w.nextKind(wire.DeviceOnline).Device

	f := fault(t, rpc(t, e.nc, testTenant, dev, callBody("self.big", `{}`), 5*time.Second))
	if f.Code != "PAYLOAD_TOO_LARGE" || !strings.Contains(f.Message, "limit of 4096 bytes") {
		t.Fatalf("oversized result: %+v", f)
	}
	if r := decodeResponse(t, rpc(t, e.nc, testTenant, dev, callBody("self.small", `{}`), 5*time.Second)); r.Result == nil {
		t.Fatalf("call after the refusal: %+v", r)
	}
}
