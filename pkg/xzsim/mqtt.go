package xzsim

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// Transports of a simulated device.
const (
	TransportWebSocket = "websocket"
	TransportMQTT      = "mqtt"
)

// Defaults of MQTTConfig.
const (
	DefaultMQTTKeepalive = 240 * time.Second // the firmware's
	DefaultPublishTopic  = "device-server"
)

// MQTTConfig is the broker connection of an MQTT device: the fields of an
// OTA mqtt section.
type MQTTConfig struct {
	// Endpoint is host[:port]; port 8883 when absent. Port 8883 means TLS
	// (as on the firmware), any other port plain TCP unless TLS is set.
	Endpoint string
	ClientID string // GID_<group>@@@<mac_>@@@<uuid>
	Username string
	Password string
	// PublishTopic is the shared uplink topic; default "device-server".
	PublishTopic string
	// Keepalive; default 240 s.
	Keepalive time.Duration
	// TLS configures TLS (e.g. a test CA); nil on port 8883 uses the
	// system roots.
	TLS *tls.Config
}

// ErrMQTTRefused is returned (wrapped) by Connect when the broker refused
// the CONNECT (e.g. bad username or password).
var ErrMQTTRefused = errors.New("xzsim: MQTT connection refused")

// connectMQTT connects like the firmware's MQTT protocol: MQTT 3.1.1,
// clean session, QoS 0, no SUBSCRIBE; every publish that arrives on the
// connection is handled as downlink whatever its topic.
func (d *Device) connectMQTT(ctx context.Context, mc MQTTConfig) error {
	host, port, err := net.SplitHostPort(mc.Endpoint)
	if err != nil {
		host, port = mc.Endpoint, "8883"
	}
	useTLS := mc.TLS != nil || port == "8883"
	c := &connection{d: d, transport: TransportMQTT, pubTopic: mc.PublishTopic, done: make(chan struct{})}
	if c.pubTopic == "" {
		c.pubTopic = DefaultPublishTopic
	}
	keepalive := mc.Keepalive
	if keepalive <= 0 {
		keepalive = DefaultMQTTKeepalive
	}
	opts := paho.NewClientOptions().
		AddBroker("tcp://" + net.JoinHostPort(host, port)).
		SetClientID(mc.ClientID).SetUsername(mc.Username).SetPassword(mc.Password).
		SetProtocolVersion(4).SetCleanSession(true).
		SetAutoReconnect(false).SetConnectRetry(false).
		SetKeepAlive(keepalive).SetConnectTimeout(d.cfg.HelloTimeout).SetWriteTimeout(10 * time.Second).
		SetOrderMatters(true).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) { c.handleFrame(m.Payload()) }).
		SetConnectionLostHandler(func(_ paho.Client, err error) {
			d.cfg.Log.Debug("xzsim: MQTT connection lost", "mac", d.cfg.MAC, "err", err)
			c.finish(err)
		}).
		SetCustomOpenConnectionFn(func(u *url.URL, _ paho.ClientOptions) (net.Conn, error) {
			dialer := &net.Dialer{Timeout: d.cfg.HelloTimeout}
			var conn net.Conn
			var err error
			if useTLS {
				tc := mc.TLS
				if tc == nil {
					tc = &tls.Config{ServerName: host}
				}
				conn, err = tls.DialWithDialer(dialer, "tcp", u.Host, tc)
			} else {
				conn, err = dialer.DialContext(ctx, "tcp", u.Host)
			}
			if err == nil {
				c.raw = conn
			}
			return conn, err
		})
	client := paho.NewClient(opts)
	c.mq = client
	tok := client.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		client.Disconnect(0)
		return ctx.Err()
	}
	if err := tok.Error(); err != nil {
		if ct, ok := tok.(*paho.ConnectToken); ok && ct.ReturnCode() != 0 {
			return fmt.Errorf("%w: %v", ErrMQTTRefused, err)
		}
		return fmt.Errorf("xzsim: MQTT connect to %s: %w", mc.Endpoint, err)
	}
	d.mu.Lock()
	d.conn = c
	d.audio = nil
	d.mu.Unlock()
	d.cfg.Log.Debug("xzsim: connected over MQTT", "mac", d.cfg.MAC, "client_id", mc.ClientID)
	return nil
}

// publish sends one QoS 0 publish to the shared uplink topic.
func (c *connection) publish(ctx context.Context, payload []byte) error {
	select {
	case <-c.done:
		return fmt.Errorf("xzsim: connection closed: %w", c.err)
	default:
	}
	tok := c.mq.Publish(c.pubTopic, 0, false, payload)
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return fmt.Errorf("xzsim: connection closed: %w", c.err)
	}
}

// UDPHello is a server hello over MQTT as the firmware requires it.
type UDPHello struct {
	SessionID  string
	SampleRate int
	Server     string
	Port       int
	Key        [16]byte
	Nonce      [16]byte
}

// ParseUDPHello checks a server hello the way the MQTT firmware does:
// type hello, transport udp, a session id, audio_params, and a udp block
// with server, port, 32-hex-digit key and nonce and encryption
// aes-128-ctr. Any gap makes the firmware ignore the hello.
func ParseUDPHello(frame []byte) (UDPHello, error) {
	var m struct {
		Type        string  `json:"type"`
		Transport   string  `json:"transport"`
		SessionID   *string `json:"session_id"`
		AudioParams *struct {
			SampleRate    int `json:"sample_rate"`
			FrameDuration int `json:"frame_duration"`
		} `json:"audio_params"`
		UDP *struct {
			Server     string `json:"server"`
			Port       int    `json:"port"`
			Key        string `json:"key"`
			Nonce      string `json:"nonce"`
			Encryption string `json:"encryption"`
		} `json:"udp"`
	}
	if err := json.Unmarshal(frame, &m); err != nil {
		return UDPHello{}, fmt.Errorf("hello: %w", err)
	}
	var h UDPHello
	switch {
	case m.Type != "hello":
		return h, errors.New("not a hello")
	case m.Transport != "udp":
		return h, fmt.Errorf("transport %q, want udp", m.Transport)
	case m.SessionID == nil || *m.SessionID == "":
		return h, errors.New("no session_id")
	case m.AudioParams == nil || m.AudioParams.SampleRate <= 0 || m.AudioParams.FrameDuration <= 0:
		return h, errors.New("no usable audio_params")
	case m.UDP == nil:
		return h, errors.New("no udp block")
	case m.UDP.Server == "":
		return h, errors.New("udp.server missing")
	case m.UDP.Port < 1 || m.UDP.Port > 65535:
		return h, errors.New("udp.port out of range")
	case m.UDP.Encryption != "aes-128-ctr":
		return h, fmt.Errorf("udp.encryption %q, want aes-128-ctr", m.UDP.Encryption)
	}
	key, err := hex.DecodeString(m.UDP.Key)
	if err != nil || len(key) != 16 {
		return h, errors.New("udp.key is not 16 bytes of hex")
	}
	nonce, err := hex.DecodeString(m.UDP.Nonce)
	if err != nil || len(nonce) != 16 {
		return h, errors.New("udp.nonce is not 16 bytes of hex")
	}
	h.SessionID, h.SampleRate, h.Server, h.Port = *m.SessionID, m.AudioParams.SampleRate, m.UDP.Server, m.UDP.Port
	copy(h.Key[:], key)
	copy(h.Nonce[:], nonce)
	return h, nil
}

// audioChannel is an open MQTT voice session: the UDP socket to the
// server's audio endpoint.
type audioChannel struct {
	hello UDPHello
	udp   net.Conn
}

// OpenAudio opens a voice session like the MQTT firmware does on a wake
// word: it publishes a hello (version 3, transport udp), waits HelloTimeout
// for a server hello that passes ParseUDPHello, "connects" a UDP socket to
// udp.server:port (an unresolvable host fails, as on the device) and sends
// one audio packet with the firmware's 16-byte header. It returns the
// server hello. Over WebSocket the hello is part of Connect; OpenAudio
// returns it.
func (d *Device) OpenAudio(ctx context.Context) (UDPHello, error) {
	c, err := d.current()
	if err != nil {
		return UDPHello{}, err
	}
	if c.transport != TransportMQTT {
		return UDPHello{}, errors.New("xzsim: OpenAudio is for MQTT devices")
	}
	d.closeAudio(false)
	d.mu.Lock()
	byesBefore := d.goodbyes
	d.mu.Unlock()
	c.sessionID.Store(new(string)) // the firmware clears its session id first
	ch := c.expectHello()
	features := map[string]bool{"aec": false}
	if !d.cfg.NoMCP {
		features["mcp"] = true
	}
	hello, _ := json.Marshal(map[string]any{
		"type": "hello", "version": 3, "transport": "udp", "features": features,
		"audio_params": map[string]any{"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60},
	})
	if err := c.write(ctx, hello); err != nil {
		return UDPHello{}, fmt.Errorf("xzsim: send hello: %w", err)
	}
	raw, err := c.awaitHello(ctx, ch)
	if err != nil {
		return UDPHello{}, err
	}
	h, err := ParseUDPHello(raw)
	if err != nil {
		return UDPHello{}, err
	}
	udp, err := net.Dial("udp", net.JoinHostPort(h.Server, strconv.Itoa(h.Port)))
	if err != nil {
		return h, fmt.Errorf("xzsim: UDP audio endpoint: %w", err)
	}
	// One packet: 0x01 | flags | len16 | ssrc32 (nonce bytes 4-7) | ts32 | seq32, then the payload.
	pkt := make([]byte, 16+3)
	pkt[0] = 0x01
	binary.BigEndian.PutUint16(pkt[2:], 3)
	copy(pkt[4:8], h.Nonce[4:8])
	binary.BigEndian.PutUint32(pkt[12:], 1)
	_, _ = udp.Write(pkt)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.goodbyes > byesBefore {
		// The server's goodbye overtook the opening: the firmware, too,
		// runs the close after the open on its main loop.
		udp.Close()
		return h, nil
	}
	d.audio = &audioChannel{hello: h, udp: udp}
	return h, nil
}

// AudioOpen reports whether a voice session is open (MQTT).
func (d *Device) AudioOpen() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.audio != nil
}

// Goodbyes returns how many server goodbyes the device honoured (those
// whose session_id matched its own).
func (d *Device) Goodbyes() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.goodbyes
}

// CloseAudio ends the voice session from the device's side: it publishes
// {"session_id":…,"type":"goodbye"} and closes the UDP socket.
func (d *Device) CloseAudio(ctx context.Context) error {
	c, err := d.current()
	if err != nil {
		return err
	}
	d.closeAudio(false)
	bye, _ := json.Marshal(map[string]string{"session_id": c.SessionID(), "type": "goodbye"})
	return c.write(ctx, bye)
}

func (d *Device) closeAudio(byServer bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if byServer {
		d.goodbyes++
	}
	if d.audio != nil {
		d.audio.udp.Close()
		d.audio = nil
	}
}
