package protocol

import "testing"

func TestParseRequestTraceparent(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, c := range []struct {
		name, frame, want string
	}{
		{"v4 frame", `{"type":"req","id":"1","method":"node.invoke","traceparent":"` + tp + `"}`, tp},
		{"v3 frame without it", `{"type":"req","id":"1","method":"node.invoke"}`, ""},
		{"not a string", `{"type":"req","id":"1","method":"node.invoke","traceparent":42}`, ""},
		{"escaped", `{"type":"req","id":"1","method":"node.invoke","traceparent":"00-\u0034bf"}`, ""},
		{"over 128 characters", `{"type":"req","id":"1","method":"node.invoke","traceparent":"` + tp + tp + tp + `"}`, ""},
	} {
		req, fe := ParseRequest([]byte(c.frame))
		if fe != nil {
			t.Fatalf("%s: frame refused: %v", c.name, fe)
		}
		if req.Traceparent != c.want {
			t.Errorf("%s: Traceparent = %q, want %q", c.name, req.Traceparent, c.want)
		}
	}
}
