package devicehub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/activation"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub/internal/xzproto"
)

// OTA endpoint paths (also served without the trailing slash).
const (
	OTAPath      = "/xiaozhi/ota/"
	ActivatePath = "/xiaozhi/ota/activate"
)

// OTAConfig configures the firmware's OTA endpoint, where a device learns
// at every boot how to reach its server. The zero value (no Credentials)
// serves no OTA.
type OTAConfig struct {
	// Credentials mints the credentials handed out; setting it enables
	// the OTA endpoints. *tenancy.DeviceAuth, or StaticCredentials.
	Credentials CredentialMinter
	// Activations binds devices to tenants. nil: in memory (one hub).
	Activations activation.Store
	// AutoActivateTenant binds every device unknown to Activations to this
	// tenant at its first request (xiaoclaw dev: the dev tenant). Empty:
	// unknown devices get an activation code an operator must bind.
	AutoActivateTenant string
	// Transports offered: wire.TransportWebSocket and/or wire.TransportMQTT.
	// Default: both when MQTTAddr is set, else WebSocket. The firmware uses
	// MQTT whenever the mqtt section is present.
	Transports []string
	// WebSocketURL is handed out; default ws://<request Host>/xiaozhi/v1/.
	WebSocketURL string
	// MQTTEndpoint (host:port) is handed out; default the request Host's
	// name with MQTTAddr's port. The firmware uses TLS on port 8883 only.
	MQTTEndpoint string
	// MQTTGroup is the group in minted client ids, GID_<group>@@@…;
	// default "xiaoclaw".
	MQTTGroup string
	// ActivationMessage is shown above the code on the device's screen;
	// default "xiaoclaw".
	ActivationMessage string
	// TimezoneOffset (minutes east of UTC) goes into server_time.
	TimezoneOffset int
}

func (o *OTAConfig) setDefaults() {
	setDefault(&o.MQTTGroup, "xiaoclaw")
	setDefault(&o.ActivationMessage, "xiaoclaw")
}

func (o *OTAConfig) validate() error {
	for _, t := range o.Transports {
		if t != wire.TransportWebSocket && t != wire.TransportMQTT {
			return fmt.Errorf("OTA.Transports: unknown transport %q", t)
		}
	}
	if o.AutoActivateTenant != "" {
		if err := wire.ValidTenant(o.AutoActivateTenant); err != nil {
			return fmt.Errorf("OTA.AutoActivateTenant: %w", err)
		}
	}
	if strings.Contains(o.MQTTGroup, "@@@") || len(o.MQTTGroup) > 64 {
		return errors.New("OTA.MQTTGroup must be at most 64 bytes without @@@")
	}
	if o.TimezoneOffset < -14*60 || o.TimezoneOffset > 14*60 {
		return errors.New("OTA.TimezoneOffset must be within ±14 h")
	}
	return nil
}

// otaHandler serves the OTA and activation endpoints.
type otaHandler struct {
	s   *Service
	cfg *OTAConfig
	act activation.Store
}

func (s *Service) mountOTA() {
	o := &s.cfg.OTA
	if o.Credentials == nil {
		return
	}
	if len(o.Transports) == 0 {
		o.Transports = []string{wire.TransportWebSocket}
		if s.cfg.MQTTAddr != "" {
			o.Transports = append(o.Transports, wire.TransportMQTT)
		}
	}
	act := o.Activations
	if act == nil {
		act = activation.NewMemory(activation.Config{})
	}
	h := &otaHandler{s: s, cfg: o, act: act}
	s.router.Post(OTAPath, h.serveOTA)
	s.router.Post(strings.TrimSuffix(OTAPath, "/"), h.serveOTA)
	s.router.Post(ActivatePath, h.serveActivate)
	s.router.Post(ActivatePath+"/", h.serveActivate)
}

// otaResponse is the reply of POST /xiaozhi/ota/; every section optional.
type otaResponse struct {
	ServerTime struct {
		Timestamp      int64 `json:"timestamp"`
		TimezoneOffset int   `json:"timezone_offset"`
	} `json:"server_time"`
	Firmware struct {
		Version string `json:"version"`
		URL     string `json:"url"`
	} `json:"firmware"`
	WebSocket  *otaWebSocket  `json:"websocket,omitempty"`
	MQTT       *otaMQTT       `json:"mqtt,omitempty"`
	Activation *otaActivation `json:"activation,omitempty"`
}

type otaWebSocket struct {
	URL   string `json:"url"`
	Token string `json:"token"`
}

type otaMQTT struct {
	Endpoint       string `json:"endpoint"`
	ClientID       string `json:"client_id"`
	Username       string `json:"username"`
	Password       string `json:"password"`
	PublishTopic   string `json:"publish_topic"`
	SubscribeTopic string `json:"subscribe_topic"`
}

type otaActivation struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Challenge string `json:"challenge"`
	TimeoutMs int    `json:"timeout_ms"`
}

// PublishTopic is the shared uplink topic handed to MQTT devices (the hub
// accepts publishes on any topic and routes them by connection).
const PublishTopic = "device-server"

// otaRefused records a refused OTA or activation request against the
// source's budget (shared with the device endpoints) and answers it.
func (h *otaHandler) otaRefused(w http.ResponseWriter, r *http.Request, status int, device, msg string) {
	h.s.hub.authFailed(transportOTA, device, r.Header.Get("Client-Id"), remoteHost(r.RemoteAddr), msg)
	writeJSONError(w, status, msg)
}

// transportOTA names the OTA endpoint in refusal records.
const transportOTA = "ota"

func remoteHost(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

func (h *otaHandler) serveOTA(w http.ResponseWriter, r *http.Request) {
	if wait := h.s.hub.throttled(transportOTA, r.RemoteAddr); wait > 0 {
		tooManyFailures(w, wait)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, xzproto.MaxOTABody))
	if err != nil {
		h.otaRefused(w, r, http.StatusRequestEntityTooLarge, "", "body too large")
		return
	}
	req, err := xzproto.ParseOTARequest(r.Header, body)
	if err != nil {
		h.otaRefused(w, r, http.StatusBadRequest, "", strings.TrimPrefix(err.Error(), xzproto.ErrMalformed.Error()+": "))
		return
	}
	device, err := wire.CanonicalDevice(req.DeviceID)
	if err != nil {
		h.otaRefused(w, r, http.StatusBadRequest, "", "Device-Id is not a MAC address or device id")
		return
	}
	ctx := r.Context()
	log := h.s.log.With("device", device, "client_id", req.ClientID, "remote_addr", r.RemoteAddr)

	var resp otaResponse
	resp.ServerTime.Timestamp = time.Now().UnixMilli()
	resp.ServerTime.TimezoneOffset = h.cfg.TimezoneOffset
	resp.Firmware.Version = req.FirmwareVersion // the running version: never an upgrade

	tenant, act, err := h.tenantOf(ctx, device, req)
	if err != nil {
		log.Error("devicehub: OTA: activation store failed", "err", err)
		writeJSONError(w, http.StatusServiceUnavailable, "activation unavailable")
		return
	}
	if tenant == "" {
		resp.Activation = &otaActivation{Code: act.Code, Message: h.cfg.ActivationMessage + "\n" + act.Code,
			Challenge: act.Challenge, TimeoutMs: 30000}
		log.Info("devicehub: OTA: device awaits activation", "code", act.Code)
		writeJSON(w, http.StatusOK, resp)
		return
	}
	for _, t := range h.cfg.Transports {
		switch t {
		case wire.TransportWebSocket:
			tok, err := h.cfg.Credentials.MintDeviceToken(ctx, tenant, req.ClientID, req.DeviceID)
			if err != nil {
				log.Error("devicehub: OTA: token not minted", "tenant", tenant, "err", err)
				writeJSONError(w, http.StatusServiceUnavailable, "credentials unavailable")
				return
			}
			resp.WebSocket = &otaWebSocket{URL: h.webSocketURL(r), Token: tok}
		case wire.TransportMQTT:
			mac := mqttDevicePart(req.DeviceID, device)
			clientID := "GID_" + h.cfg.MQTTGroup + "@@@" + mac + "@@@" + req.ClientID
			user, pass, err := h.cfg.Credentials.MintMQTTCredentials(ctx, tenant, clientID)
			if err != nil {
				log.Error("devicehub: OTA: MQTT credentials not minted", "tenant", tenant, "err", err)
				writeJSONError(w, http.StatusServiceUnavailable, "credentials unavailable")
				return
			}
			resp.MQTT = &otaMQTT{Endpoint: h.mqttEndpoint(r), ClientID: clientID, Username: user, Password: pass,
				PublishTopic: PublishTopic, SubscribeTopic: xzproto.P2PTopic(mac)}
		}
	}
	log.Debug("devicehub: OTA: configuration handed out", "tenant", tenant, "transports", h.cfg.Transports)
	writeJSON(w, http.StatusOK, resp)
}

// tenantOf returns the device's tenant, binding it to AutoActivateTenant
// when it has none; with no tenant, the pending activation.
func (h *otaHandler) tenantOf(ctx context.Context, device string, req xzproto.OTARequest) (string, activation.Record, error) {
	tenant, err := h.act.TenantOf(ctx, device)
	if err != nil || tenant != "" {
		return tenant, activation.Record{}, err
	}
	act, err := h.act.Request(ctx, device, req.DeviceID, req.ClientID)
	if err != nil || act.Bound() {
		return act.Tenant, act, err
	}
	if h.cfg.AutoActivateTenant == "" {
		return "", act, nil
	}
	bound, err := h.act.Bind(ctx, act.Code, h.cfg.AutoActivateTenant)
	if err != nil {
		return "", act, err
	}
	h.s.log.Info("devicehub: device activated automatically", "device", device, "tenant", bound.Tenant)
	return bound.Tenant, bound, nil
}

// serveActivate answers the firmware's activation poll: 200 once the
// device is bound, 202 while its code waits for an operator.
func (h *otaHandler) serveActivate(w http.ResponseWriter, r *http.Request) {
	if wait := h.s.hub.throttled(transportOTA, r.RemoteAddr); wait > 0 {
		tooManyFailures(w, wait)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, xzproto.MaxActivateBody))
	if err != nil {
		h.otaRefused(w, r, http.StatusRequestEntityTooLarge, "", "body too large")
		return
	}
	areq, err := xzproto.ParseActivateRequest(body)
	if err != nil {
		h.otaRefused(w, r, http.StatusBadRequest, "", strings.TrimPrefix(err.Error(), xzproto.ErrMalformed.Error()+": "))
		return
	}
	device, err := wire.CanonicalDevice(strings.TrimSpace(r.Header.Get("Device-Id")))
	if err != nil {
		h.otaRefused(w, r, http.StatusBadRequest, "", "Device-Id missing or invalid")
		return
	}
	ctx := r.Context()
	tenant, act, err := h.pendingOrBound(ctx, device)
	switch {
	case err != nil:
		h.s.log.Error("devicehub: activate: activation store failed", "device", device, "err", err)
		writeJSONError(w, http.StatusServiceUnavailable, "activation unavailable")
	case tenant != "":
		writeJSON(w, http.StatusOK, map[string]string{"status": "activated"})
	case act.Code == "":
		writeJSONError(w, http.StatusNotFound, "no activation pending for this device; request "+OTAPath+" first")
	case areq.Challenge != "" && areq.Challenge != act.Challenge:
		h.otaRefused(w, r, http.StatusBadRequest, device, "challenge does not match")
	default:
		writeJSON(w, http.StatusAccepted, map[string]string{"status": "pending"})
	}
}

// pendingOrBound returns the device's tenant, or its pending activation
// (auto-activating it when configured), without creating a new code.
func (h *otaHandler) pendingOrBound(ctx context.Context, device string) (string, activation.Record, error) {
	act, err := h.act.Lookup(ctx, device)
	if errors.Is(err, activation.ErrNotFound) {
		return "", activation.Record{}, nil
	}
	if err != nil || act.Bound() {
		return act.Tenant, act, err
	}
	if h.cfg.AutoActivateTenant != "" {
		bound, err := h.act.Bind(ctx, act.Code, h.cfg.AutoActivateTenant)
		return bound.Tenant, bound, err
	}
	return "", act, nil
}

func (h *otaHandler) webSocketURL(r *http.Request) string {
	if h.cfg.WebSocketURL != "" {
		return h.cfg.WebSocketURL
	}
	scheme := "ws"
	if r.TLS != nil {
		scheme = "wss"
	}
	return scheme + "://" + r.Host + WebSocketPath
}

func (h *otaHandler) mqttEndpoint(r *http.Request) string {
	if h.cfg.MQTTEndpoint != "" {
		return h.cfg.MQTTEndpoint
	}
	host := r.Host
	if hh, _, err := net.SplitHostPort(r.Host); err == nil {
		host = hh
	}
	_, port, _ := net.SplitHostPort(h.s.MQTTAddr())
	return net.JoinHostPort(host, port)
}

// mqttDevicePart is the device part of a minted client id: a MAC in lower
// case with "_" (as the firmware's convention), else the canonical id.
func mqttDevicePart(raw, canonical string) string {
	if hw, err := net.ParseMAC(raw); err == nil && len(hw) == 6 {
		return strings.ReplaceAll(hw.String(), ":", "_")
	}
	if len(raw) == 17 {
		if hw, err := net.ParseMAC(strings.ReplaceAll(raw, "_", ":")); err == nil && len(hw) == 6 {
			return strings.ReplaceAll(hw.String(), ":", "_")
		}
	}
	return canonical
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		writeJSONError(w, http.StatusInternalServerError, "response not encodable")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}
