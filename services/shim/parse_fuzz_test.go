package shim

import (
	"encoding/json"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/catalog"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/translate"
)

const fuzzTools = `[{"name":"self.audio_speaker.set_volume","inputSchema":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}},{"name":"self.get_device_status","inputSchema":{"type":"object","properties":{}}}]`

// FuzzInvokeRequest runs arbitrary node.invoke bodies through the parse and
// translation an invoke goes through before anything reaches a device.
func FuzzInvokeRequest(f *testing.F) {
	for _, s := range []string{
		`{"nodeId":"xz-a1b2c3d4e5f6","command":"mcp.tools.call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}},"idempotencyKey":"k"}`,
		`{"nodeId":"xz-a1b2c3d4e5f6","command":"mcp.tools.call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":5000}}}`,
		`{"nodeId":"xz-a1b2c3d4e5f6","command":"mcp.tools.call.v1","params":{"server":"xiaozhi","tool":"self.get_device_status"}}`,
		`{"nodeId":"xz-a1b2c3d4e5f6","command":"mcp.tools.list","params":{"cursor":"x"}}`,
		`{"nodeId":"xz-a1b2c3d4e5f6","command":"mcp.initialize","params":null}`,
		`{"nodeId":"","command":""}`,
		`{"nodeId":"xz-a1b2c3d4e5f6","command":"mcp.tools.call","params":"x"}`,
		`[]`,
	} {
		f.Add("xc.acme.node.invoke", []byte(s))
	}
	f.Add("xc.ACME.node.invoke", []byte(`{}`))
	f.Add("xc..node.invoke", []byte(`{}`))
	target := translate.Target{Catalog: catalog.New(json.RawMessage(fuzzTools), catalog.NewSchemas(0)), Board: "b"}
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		tenant, req, fault := parseInvoke(subject, data)
		if fault != nil {
			if fault.Code != wire.FaultInvalidRequest || fault.Message == "" {
				t.Fatalf("fault = %+v", fault)
			}
			return
		}
		if wire.ValidTenant(tenant) != nil || req.NodeID == "" || req.Command == "" {
			t.Fatalf("accepted tenant %q request %+v", tenant, req)
		}
		call, fault := translate.Prepare(req.Command, req.Params, target)
		if fault == nil && !json.Valid(call.Request) {
			t.Fatalf("request %q is not valid JSON", call.Request)
		}
	})
}

// FuzzDeviceEvent feeds arbitrary devicehub events: accepted events always
// name the subject's canonical device and tenant.
func FuzzDeviceEvent(f *testing.F) {
	for _, s := range []string{
		`{"kind":"online","tenant":"acme","device":"a1b2c3d4e5f6","sessionId":"s","hub":"h","atMs":1,"mcp":true,"tools":[{"name":"x"}],"serverInfo":{"name":"b"}}`,
		`{"kind":"tools","device":"a1b2c3d4e5f6","sessionId":"s","tools":null}`,
		`{"kind":"offline","sessionId":"s","reason":"bye"}`,
		`{"kind":"notification","notification":{"jsonrpc":"2.0","method":"notifications/x"}}`,
		`{"kind":"online","tenant":"other","sessionId":"s"}`,
		`{"kind":"tools","sessionId":"s","tools":{}}`,
		`{"kind":"reboot"}`,
	} {
		f.Add("xc.acme.dev.a1b2c3d4e5f6.state", []byte(s))
	}
	f.Add("xc.acme.dev.A1B2C3D4E5F6.state", []byte(`{"kind":"offline","sessionId":"s"}`))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		ev, err := decodeDeviceEvent(subject, data)
		if err != nil {
			return
		}
		tenant, device, ok := wire.DeviceFromSubject(subject)
		if !ok || ev.Tenant != tenant || ev.Device != device {
			t.Fatalf("accepted event %+v on %q", ev, subject)
		}
		if c, err := wire.CanonicalDevice(ev.Device); err != nil || c != ev.Device {
			t.Fatalf("accepted non-canonical device %q", ev.Device)
		}
		if ev.Kind != wire.DeviceNotification && ev.SessionID == "" {
			t.Fatalf("accepted %s without session", ev.Kind)
		}
	})
}
