package xzsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// OTAReply is the part of an OTA reply the firmware acts on.
type OTAReply struct {
	ServerTime *struct {
		Timestamp      int64 `json:"timestamp"`
		TimezoneOffset int   `json:"timezone_offset"`
	} `json:"server_time"`
	Firmware *struct {
		Version string `json:"version"`
		URL     string `json:"url"`
		Force   int    `json:"force"`
	} `json:"firmware"`
	WebSocket *struct {
		URL   string `json:"url"`
		Token string `json:"token"`
	} `json:"websocket"`
	MQTT *struct {
		Endpoint       string `json:"endpoint"`
		ClientID       string `json:"client_id"`
		Username       string `json:"username"`
		Password       string `json:"password"`
		PublishTopic   string `json:"publish_topic"`
		SubscribeTopic string `json:"subscribe_topic"`
	} `json:"mqtt"`
	Activation *struct {
		Code      string `json:"code"`
		Message   string `json:"message"`
		Challenge string `json:"challenge"`
		TimeoutMs int    `json:"timeout_ms"`
	} `json:"activation"`
}

// OTAError is returned by Connect when the OTA server answered with an
// unexpected status.
type OTAError struct {
	StatusCode int
	Body       string
}

func (e *OTAError) Error() string {
	return fmt.Sprintf("xzsim: OTA request refused: HTTP %d %s", e.StatusCode, strings.TrimSpace(e.Body))
}

// ErrUpgradeOffered is returned when the OTA reply would make the
// firmware upgrade itself (a newer version with a URL, or force).
var ErrUpgradeOffered = errors.New("xzsim: the OTA reply offers a firmware upgrade")

// bootOTA runs the firmware's boot sequence against OTAURL: the OTA
// request, the activation loop while the reply carries an activation (then
// the OTA request again), and picks the transport: mqtt when the reply has
// it, else websocket.
func (d *Device) bootOTA(ctx context.Context) (connectParams, error) {
	for {
		reply, raw, err := d.otaRequest(ctx)
		if err != nil {
			return connectParams{}, err
		}
		d.mu.Lock()
		d.otaReply = raw
		d.mu.Unlock()
		if fw := reply.Firmware; fw != nil && (fw.Force == 1 || fw.URL != "" && fw.Version != d.cfg.FirmwareVersion) {
			return connectParams{}, ErrUpgradeOffered
		}
		if a := reply.Activation; a != nil && (a.Code != "" || a.Challenge != "") {
			if err := d.activate(ctx, a.Code, a.Challenge); err != nil {
				return connectParams{}, err
			}
			continue
		}
		switch {
		case reply.MQTT != nil:
			m := reply.MQTT
			return connectParams{transport: TransportMQTT, mqtt: MQTTConfig{
				Endpoint: m.Endpoint, ClientID: m.ClientID, Username: m.Username, Password: m.Password,
				PublishTopic: m.PublishTopic, Keepalive: d.cfg.MQTT.Keepalive, TLS: d.cfg.MQTT.TLS,
			}}, nil
		case reply.WebSocket != nil:
			return connectParams{transport: TransportWebSocket, url: reply.WebSocket.URL, token: reply.WebSocket.Token}, nil
		default:
			return connectParams{}, errors.New("xzsim: the OTA reply names neither mqtt nor websocket")
		}
	}
}

// otaRequest posts the firmware's OTA request.
func (d *Device) otaRequest(ctx context.Context) (OTAReply, json.RawMessage, error) {
	body, _ := json.Marshal(map[string]any{
		"version": 2, "language": "zh-CN", "flash_size": 16777216, "minimum_free_heap_size": 8318916,
		"mac_address": d.cfg.MAC, "uuid": d.cfg.ClientID, "chip_model_name": "esp32s3",
		"chip_info":   map[string]int{"model": 9, "cores": 2, "revision": 2, "features": 18},
		"application": map[string]string{"name": "xiaozhi", "version": d.cfg.FirmwareVersion, "idf_version": "v5.4.2"},
		"board":       map[string]any{"type": d.cfg.BoardName, "name": d.cfg.BoardName, "ssid": "xiaoclaw-sim", "rssi": -50, "channel": 6, "ip": "192.168.1.23", "mac": d.cfg.MAC},
	})
	resp, err := d.post(ctx, d.cfg.OTAURL, body)
	if err != nil {
		return OTAReply{}, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return OTAReply{}, nil, fmt.Errorf("xzsim: OTA reply: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return OTAReply{}, nil, &OTAError{StatusCode: resp.StatusCode, Body: string(raw)}
	}
	var reply OTAReply
	if err := json.Unmarshal(raw, &reply); err != nil {
		return OTAReply{}, nil, fmt.Errorf("xzsim: OTA reply is not JSON: %w", err)
	}
	return reply, raw, nil
}

// activate shows the code and polls <OTAURL>/activate: 200 ends the loop,
// 202 waits ActivationPoll, any other answer 3 × as long (the firmware:
// 3 s and 10 s). Without a challenge the firmware cannot activate; it
// keeps showing the code and asks OTA again later, as here.
func (d *Device) activate(ctx context.Context, code, challenge string) error {
	d.mu.Lock()
	d.activation = code
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.activation = ""
		d.mu.Unlock()
	}()
	d.cfg.Log.Info("xzsim: activation code", "mac", d.cfg.MAC, "code", code)
	u := strings.TrimSuffix(d.cfg.OTAURL, "/") + "/activate"
	for {
		wait := 3 * d.cfg.ActivationPoll
		if challenge != "" {
			var body []byte = []byte("{}")
			if d.cfg.WrapActivation {
				body = []byte(`{"Payload":{}}`)
			}
			resp, err := d.post(ctx, u, body)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
			} else {
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					return nil
				case http.StatusAccepted:
					wait = d.cfg.ActivationPoll
				}
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		if challenge == "" {
			return nil // ask OTA again
		}
	}
}

func (d *Device) post(ctx context.Context, u string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Activation-Version", "1")
	req.Header.Set("Device-Id", d.cfg.MAC)
	req.Header.Set("Client-Id", d.cfg.ClientID)
	req.Header.Set("User-Agent", d.cfg.BoardName+"/"+d.cfg.FirmwareVersion)
	req.Header.Set("Accept-Language", "zh-CN")
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("xzsim: POST %s: %w", u, err)
	}
	return resp, nil
}

// ActivationCode returns the code the device shows while it waits to be
// activated ("" otherwise).
func (d *Device) ActivationCode() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.activation
}

// OTAReply returns the last OTA reply, verbatim.
func (d *Device) OTAReply() json.RawMessage {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.otaReply
}
