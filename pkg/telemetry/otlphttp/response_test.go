package otlphttp

import (
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func marshalResponse(tb testing.TB, ps *coltracepb.ExportTracePartialSuccess) []byte {
	tb.Helper()
	b, err := proto.Marshal(&coltracepb.ExportTraceServiceResponse{PartialSuccess: ps})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestParsePartialSuccess(t *testing.T) {
	ps := func(fields ...[]byte) []byte {
		var inner []byte
		for _, f := range fields {
			inner = append(inner, f...)
		}
		return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), inner)
	}
	varint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), v)
	}
	str := func(num protowire.Number, s string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), s)
	}
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	for _, c := range []struct {
		name     string
		body     []byte
		rejected int64
		msg      string
		bad      bool
	}{
		{name: "empty body"},
		{name: "empty partial success", body: marshalResponse(t, &coltracepb.ExportTracePartialSuccess{})},
		{name: "both", body: marshalResponse(t, &coltracepb.ExportTracePartialSuccess{RejectedSpans: 12, ErrorMessage: "nope"}), rejected: 12, msg: "nope"},
		{name: "negative reads as zero", body: ps(varint(1, uint64(1<<64-5)), str(2, "m")), msg: "m"},
		{name: "merged occurrences", body: cat(ps(varint(1, 3), str(2, "first")), ps(str(2, "second"))), rejected: 3, msg: "second"},
		{name: "last wins", body: ps(varint(1, 3), varint(1, 4)), rejected: 4},
		{name: "unknown fields skipped", body: cat(varint(9, 1), ps(str(7, "x"), varint(1, 2), protowire.AppendFixed32(protowire.AppendTag(nil, 3, protowire.Fixed32Type), 1)), str(5, "y")), rejected: 2},
		{name: "wrong wire type is an unknown field", body: cat(varint(1, 5), ps(str(1, "x"), varint(2, 1))), rejected: 0},
		{name: "truncated", body: marshalResponse(t, &coltracepb.ExportTracePartialSuccess{RejectedSpans: 1, ErrorMessage: "abc"})[:5], bad: true},
		{name: "json", body: []byte(`{"partialSuccess":{}}`), bad: true},
	} {
		rejected, msg, err := parsePartialSuccess(c.body)
		if (err != nil) != c.bad {
			t.Errorf("%s: error %v", c.name, err)
			continue
		}
		if !c.bad && (rejected != c.rejected || msg != c.msg) {
			t.Errorf("%s: %d %q, want %d %q", c.name, rejected, msg, c.rejected, c.msg)
		}
	}
}

// FuzzPartialSuccess feeds the response parser arbitrary bytes: it must not
// panic, never report a negative count, and agree with proto.Unmarshal
// whenever that accepts the bytes (proto.Unmarshal also rejects invalid
// UTF-8, which this parser has no reason to).
func FuzzPartialSuccess(f *testing.F) {
	f.Add([]byte{})
	f.Add(marshalResponse(f, &coltracepb.ExportTracePartialSuccess{RejectedSpans: 3, ErrorMessage: "too old"}))
	f.Add(marshalResponse(f, &coltracepb.ExportTracePartialSuccess{RejectedSpans: -1}))
	f.Add(marshalResponse(f, &coltracepb.ExportTracePartialSuccess{}))
	f.Add([]byte{0x0a, 0x02, 0x08, 0x01, 0x0a, 0x03, 0x12, 0x01, 'x'})
	f.Add([]byte{0x0b, 0x0c}) // a group
	f.Add([]byte(`{"partialSuccess":{"rejectedSpans":"1"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		rejected, msg, err := parsePartialSuccess(body)
		if rejected < 0 {
			t.Fatalf("negative count %d", rejected)
		}
		var resp coltracepb.ExportTraceServiceResponse
		if proto.Unmarshal(body, &resp) != nil {
			return
		}
		if err != nil {
			t.Fatalf("proto.Unmarshal accepts what the parser rejects: %v", err)
		}
		want := max(resp.GetPartialSuccess().GetRejectedSpans(), 0)
		if rejected != want || msg != resp.GetPartialSuccess().GetErrorMessage() {
			t.Fatalf("parsed %d %q, proto.Unmarshal %d %q", rejected, msg, want, resp.GetPartialSuccess().GetErrorMessage())
		}
	})
}

func TestExcerpt(t *testing.T) {
	long := make([]byte, 0, 600)
	for len(long) < 600 {
		long = append(long, "é"...)
	}
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"  hello\n", "hello"},
		{"bad \xff utf8", "bad \uFFFD utf8"},
	} {
		if got := excerpt([]byte(c.in)); got != c.want {
			t.Errorf("excerpt(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got := excerpt(long); len(got) > maxErrorExcerptSize+2 {
		t.Errorf("excerpt of %d bytes", len(got))
	}
}
