package otlphttp

import (
	"math"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of the OTLP messages written here
// (opentelemetry/proto/{collector/trace,trace,resource,common}/v1).
const (
	// ExportTraceServiceRequest
	reqResourceSpans protowire.Number = 1

	// ResourceSpans
	rsResource   protowire.Number = 1
	rsScopeSpans protowire.Number = 2
	rsSchemaURL  protowire.Number = 3

	// Resource
	resAttributes protowire.Number = 1

	// ScopeSpans
	ssScope     protowire.Number = 1
	ssSpans     protowire.Number = 2
	ssSchemaURL protowire.Number = 3

	// InstrumentationScope
	scopeName       protowire.Number = 1
	scopeVersion    protowire.Number = 2
	scopeAttributes protowire.Number = 3

	// Span
	spanTraceID           protowire.Number = 1
	spanSpanID            protowire.Number = 2
	spanTraceState        protowire.Number = 3
	spanParentSpanID      protowire.Number = 4
	spanName              protowire.Number = 5
	spanKind              protowire.Number = 6
	spanStartTime         protowire.Number = 7
	spanEndTime           protowire.Number = 8
	spanAttributes        protowire.Number = 9
	spanDroppedAttributes protowire.Number = 10
	spanEvents            protowire.Number = 11
	spanDroppedEvents     protowire.Number = 12
	spanLinks             protowire.Number = 13
	spanDroppedLinks      protowire.Number = 14
	spanStatus            protowire.Number = 15
	spanFlags             protowire.Number = 16

	// Span.Event
	eventTime              protowire.Number = 1
	eventName              protowire.Number = 2
	eventAttributes        protowire.Number = 3
	eventDroppedAttributes protowire.Number = 4

	// Span.Link (field 3, trace_state, is not written: see appendLink)
	linkTraceID           protowire.Number = 1
	linkSpanID            protowire.Number = 2
	linkAttributes        protowire.Number = 4
	linkDroppedAttributes protowire.Number = 5
	linkFlags             protowire.Number = 6

	// Status
	statusMessage protowire.Number = 2
	statusCode    protowire.Number = 3

	// KeyValue
	kvKey   protowire.Number = 1
	kvValue protowire.Number = 2

	// AnyValue (a oneof: the chosen field is written even when zero)
	avString protowire.Number = 1
	avBool   protowire.Number = 2
	avInt    protowire.Number = 3
	avDouble protowire.Number = 4
	avArray  protowire.Number = 5
	avKvlist protowire.Number = 6
	avBytes  protowire.Number = 7

	// ArrayValue and KeyValueList
	listValues protowire.Number = 1
)

// OTLP enum values and span flag bits.
const (
	statusCodeOK    = 1
	statusCodeError = 2

	// SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK and SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK.
	flagHasIsRemote = 0x100
	flagIsRemote    = 0x200
)

// Bytes reserved for the length prefix of a sub-message before its content is
// known. A wrong guess costs one memmove of the content (see endMessage), so
// the guesses follow the usual sizes: a span is 128 B to 16 KiB, a scope's or
// resource's span list up to 2 MiB.
const (
	reserveSmall = 1
	reserveSpan  = 2
	reserveGroup = 3
)

// AppendExportRequest appends to dst the protobuf encoding of an
// opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest holding
// spans and returns the extended buffer.
//
// The message is the one otlptracehttp v1.47.0 sends for the same spans:
// spans grouped by resource, then by instrumentation scope, with the same
// fields, flags, status and attribute mapping (and, like it, links without
// their trace_state). Groups appear in the order of
// their first span (the official exporter's resource order is that of a Go
// map, so random). Nil spans are skipped. With no spans the request is empty
// and nothing is appended.
//
// Reusing dst between calls avoids allocations: for spans whose attributes
// are scalars (bool, int64, float64, string) the encoder allocates nothing.
// Slice- and byte-valued attributes cost the copy the attribute package makes
// when they are read.
func AppendExportRequest(dst []byte, spans []sdktrace.ReadOnlySpan) []byte {
	e := encoderPool.Get().(*encoder)
	dst = e.appendRequest(dst, spans)
	encoderPool.Put(e)
	return dst
}

var encoderPool = sync.Pool{New: func() any { return new(encoder) }}

// encoder holds the scratch space of the grouping pass; it is reused so that
// steady-state encoding does not allocate.
type encoder struct {
	resources []resourceGroup
	scopes    []scopeGroup
	// next links the spans of one scope group: next[i] is the index of the
	// group's span after spans[i], or -1.
	next []int32
	// index finds scope groups once there are too many to scan.
	index map[groupKey]int32
}

// maxScanGroups is the number of scope groups searched linearly before the
// encoder switches to a map.
const maxScanGroups = 8

type groupKey struct {
	res   attribute.Distinct
	scope instrumentation.Scope
}

type resourceGroup struct {
	key attribute.Distinct
	// res is the resource of the group's first span, the one whose attributes
	// and schema URL are written (the official exporter keys resources the
	// same way and also writes the first one).
	res                   *resource.Resource
	firstScope, lastScope int32
}

type scopeGroup struct {
	key                 groupKey
	firstSpan, lastSpan int32
	nextScope           int32
}

// group fills e.resources, e.scopes and e.next for spans.
func (e *encoder) group(spans []sdktrace.ReadOnlySpan) {
	if cap(e.next) < len(spans) {
		e.next = make([]int32, len(spans))
	}
	e.next = e.next[:len(spans)]
	last := int32(-1)
	for i, sd := range spans {
		if sd == nil {
			continue
		}
		res := sd.Resource()
		k := groupKey{res: res.Equivalent(), scope: sd.InstrumentationScope()}
		g := last
		if g < 0 || e.scopes[g].key != k {
			g = e.findScope(k)
			if g < 0 {
				g = e.addScope(k, res)
			}
			last = g
		}
		sg := &e.scopes[g]
		e.next[i] = -1
		if sg.lastSpan >= 0 {
			e.next[sg.lastSpan] = int32(i)
		} else {
			sg.firstSpan = int32(i)
		}
		sg.lastSpan = int32(i)
	}
}

func (e *encoder) findScope(k groupKey) int32 {
	if e.index != nil && len(e.scopes) > maxScanGroups {
		if g, ok := e.index[k]; ok {
			return g
		}
		return -1
	}
	for g := range e.scopes {
		if e.scopes[g].key == k {
			return int32(g)
		}
	}
	return -1
}

func (e *encoder) addScope(k groupKey, res *resource.Resource) int32 {
	g := int32(len(e.scopes))
	e.scopes = append(e.scopes, scopeGroup{key: k, firstSpan: -1, lastSpan: -1, nextScope: -1})
	if len(e.scopes) > maxScanGroups {
		if e.index == nil {
			e.index = make(map[groupKey]int32)
		}
		if len(e.index) == 0 {
			for i := range e.scopes {
				e.index[e.scopes[i].key] = int32(i)
			}
		} else {
			e.index[k] = g
		}
	}

	r := -1
	for i := range e.resources {
		if e.resources[i].key == k.res {
			r = i
			break
		}
	}
	if r < 0 {
		e.resources = append(e.resources, resourceGroup{key: k.res, res: res, firstScope: g, lastScope: g})
		return g
	}
	rg := &e.resources[r]
	e.scopes[rg.lastScope].nextScope = g
	rg.lastScope = g
	return g
}

// reset drops the references the groups hold so that a pooled encoder does
// not keep resources and scope attributes alive.
func (e *encoder) reset() {
	clear(e.resources)
	e.resources = e.resources[:0]
	clear(e.scopes)
	e.scopes = e.scopes[:0]
	clear(e.index)
}

func (e *encoder) appendRequest(b []byte, spans []sdktrace.ReadOnlySpan) []byte {
	e.group(spans)
	for ri := range e.resources {
		rg := &e.resources[ri]
		var rs int
		b, rs = beginMessage(b, reqResourceSpans, reserveGroup)
		if rg.res != nil {
			b = appendResource(b, rg.res)
		}
		for g := rg.firstScope; g >= 0; g = e.scopes[g].nextScope {
			sg := &e.scopes[g]
			var ss int
			b, ss = beginMessage(b, rsScopeSpans, reserveGroup)
			if sg.key.scope != (instrumentation.Scope{}) {
				b = appendScope(b, &sg.key.scope)
			}
			for i := sg.firstSpan; i >= 0; i = e.next[i] {
				b = appendSpan(b, spans[i])
			}
			b = appendStringField(b, ssSchemaURL, sg.key.scope.SchemaURL)
			b = endMessage(b, ss)
		}
		b = appendStringField(b, rsSchemaURL, rg.res.SchemaURL())
		b = endMessage(b, rs)
	}
	e.reset()
	return b
}

func appendResource(b []byte, res *resource.Resource) []byte {
	var m int
	b, m = beginMessage(b, rsResource, reserveSmall)
	for it := res.Iter(); it.Next(); {
		kv := it.Attribute()
		b = appendKeyValue(b, resAttributes, &kv)
	}
	return endMessage(b, m)
}

func appendScope(b []byte, s *instrumentation.Scope) []byte {
	var m int
	b, m = beginMessage(b, ssScope, reserveSmall)
	b = appendStringField(b, scopeName, s.Name)
	b = appendStringField(b, scopeVersion, s.Version)
	for it := s.Attributes.Iter(); it.Next(); {
		kv := it.Attribute()
		b = appendKeyValue(b, scopeAttributes, &kv)
	}
	return endMessage(b, m)
}

func appendSpan(b []byte, sd sdktrace.ReadOnlySpan) []byte {
	var m int
	b, m = beginMessage(b, ssSpans, reserveSpan)

	sc := sd.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	b = append(b, bytesTag(spanTraceID), byte(len(tid)))
	b = append(b, tid[:]...)
	b = append(b, bytesTag(spanSpanID), byte(len(sid)))
	b = append(b, sid[:]...)
	b = appendTraceState(b, spanTraceState, sc.TraceState())
	parent := sd.Parent()
	if psid := parent.SpanID(); psid.IsValid() {
		b = append(b, bytesTag(spanParentSpanID), byte(len(psid)))
		b = append(b, psid[:]...)
	}
	b = appendStringField(b, spanName, sd.Name())
	b = appendVarintField(b, spanKind, otlpSpanKind(sd.SpanKind()))
	b = appendFixed64Field(b, spanStartTime, uint64(max(0, sd.StartTime().UnixNano())))
	b = appendFixed64Field(b, spanEndTime, uint64(max(0, sd.EndTime().UnixNano())))
	b = appendAttributes(b, spanAttributes, sd.Attributes())
	b = appendVarintField(b, spanDroppedAttributes, clampUint32(sd.DroppedAttributes()))
	for i, evs := 0, sd.Events(); i < len(evs); i++ {
		b = appendEvent(b, &evs[i])
	}
	b = appendVarintField(b, spanDroppedEvents, clampUint32(sd.DroppedEvents()))
	for i, links := 0, sd.Links(); i < len(links); i++ {
		b = appendLink(b, &links[i])
	}
	b = appendVarintField(b, spanDroppedLinks, clampUint32(sd.DroppedLinks()))
	b = appendStatus(b, sd.Status())
	b = append(b, spanFlagsTag...)
	b = protowire.AppendFixed32(b, spanFlagsOf(sc.TraceFlags(), parent))

	return endMessage(b, m)
}

func appendEvent(b []byte, ev *sdktrace.Event) []byte {
	var m int
	b, m = beginMessage(b, spanEvents, reserveSmall)
	b = appendFixed64Field(b, eventTime, uint64(max(0, ev.Time.UnixNano())))
	b = appendStringField(b, eventName, ev.Name)
	b = appendAttributes(b, eventAttributes, ev.Attributes)
	b = appendVarintField(b, eventDroppedAttributes, clampUint32(ev.DroppedAttributeCount))
	return endMessage(b, m)
}

// appendLink writes a Span.Link. Like otlptracehttp v1.47.0 it leaves out the
// link's trace_state, so that both exporters send the same thing.
func appendLink(b []byte, l *sdktrace.Link) []byte {
	var m int
	b, m = beginMessage(b, spanLinks, reserveSmall)
	tid, sid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
	b = protowire.AppendTag(b, linkTraceID, protowire.BytesType)
	b = protowire.AppendBytes(b, tid[:])
	b = protowire.AppendTag(b, linkSpanID, protowire.BytesType)
	b = protowire.AppendBytes(b, sid[:])
	b = appendAttributes(b, linkAttributes, l.Attributes)
	b = appendVarintField(b, linkDroppedAttributes, clampUint32(l.DroppedAttributeCount))
	b = protowire.AppendTag(b, linkFlags, protowire.Fixed32Type)
	b = protowire.AppendFixed32(b, spanFlagsOf(l.SpanContext.TraceFlags(), l.SpanContext))
	return endMessage(b, m)
}

// appendStatus writes the span's Status; like the official exporter it always
// writes the message, empty for an unset status.
func appendStatus(b []byte, s sdktrace.Status) []byte {
	var code uint64
	switch s.Code {
	case codes.Ok:
		code = statusCodeOK
	case codes.Error:
		code = statusCodeError
	}
	size := 0
	if s.Description != "" {
		size += 1 + sizeLen(len(s.Description)) + len(s.Description)
	}
	if code != 0 {
		size += 2 // one-byte tag, one-byte code
	}
	b = append(b, bytesTag(spanStatus))
	b = appendLen(b, size)
	b = appendStringField(b, statusMessage, s.Description)
	return appendVarintField(b, statusCode, code)
}

// appendTraceState writes ts in its W3C form (what TraceState.String
// returns) without building the string.
func appendTraceState(b []byte, num protowire.Number, ts trace.TraceState) []byte {
	if ts.Len() == 0 {
		return b
	}
	n := -1 // no comma before the first member
	ts.Walk(func(k, v string) bool {
		n += len(k) + 1 + len(v) + 1
		return true
	})
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	first := true
	ts.Walk(func(k, v string) bool {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, k...)
		b = append(b, '=')
		b = append(b, v...)
		return true
	})
	return b
}

// spanFlagsOf mirrors the official exporter: the W3C trace flags in the low
// byte, "has is_remote" always set and "is_remote" when remote is.
func spanFlagsOf(tf trace.TraceFlags, remote trace.SpanContext) uint32 {
	flags := uint32(tf) | flagHasIsRemote
	if remote.IsRemote() {
		flags |= flagIsRemote
	}
	return flags
}

// otlpSpanKind maps the API's span kinds to OTLP's; the numbers coincide, and
// unknown kinds become SPAN_KIND_UNSPECIFIED.
func otlpSpanKind(k trace.SpanKind) uint64 {
	switch k {
	case trace.SpanKindInternal, trace.SpanKindServer, trace.SpanKindClient,
		trace.SpanKindProducer, trace.SpanKindConsumer:
		return uint64(k)
	default:
		return 0
	}
}

func clampUint32(v int) uint64 {
	if v < 0 {
		return 0
	}
	if int64(v) > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint64(v)
}

// appendAttributes writes attrs as KeyValue messages in field num. Strings,
// the common case, are dispatched here so that they skip appendKeyValue's
// larger frame.
func appendAttributes(b []byte, num protowire.Number, attrs []attribute.KeyValue) []byte {
	for i := range attrs {
		kv := &attrs[i] // not a copy of the 72-byte KeyValue
		if kv.Value.Type() == attribute.STRING {
			b = appendStringKeyValue(b, bytesTag(num), string(kv.Key), kv.Value.AsString())
		} else {
			b = appendKeyValue(b, num, kv)
		}
	}
	return b
}

// appendStringKeyValue writes a KeyValue with a string value, the type of
// nearly every attribute, behind the one-byte tag. Its tags are constants and
// its lengths mostly one byte, so they are appended directly rather than
// through protowire's general varint code.
func appendStringKeyValue(b []byte, fieldTag byte, key, v string) []byte {
	// The usual case: with a key and under 128 bytes in all, every length
	// is one byte and the message takes four appends. Its size is the key
	// and the value with two tags and two lengths each, the value's being
	// its AnyValue's.
	if key != "" && len(key)+len(v) < 0x80-6 {
		b = append(b, fieldTag, byte(6+len(key)+len(v)), bytesTag(kvKey), byte(len(key)))
		b = append(b, key...)
		b = append(b, bytesTag(kvValue), byte(2+len(v)), bytesTag(avString), byte(len(v)))
		return append(b, v...)
	}
	vs := 1 + sizeLen(len(v)) + len(v) // the AnyValue: tag, length, bytes
	size := 1 + sizeLen(vs) + vs
	if key != "" {
		size += 1 + sizeLen(len(key)) + len(key)
	}
	b = append(b, fieldTag)
	b = appendLen(b, size)
	if key != "" {
		b = append(b, bytesTag(kvKey))
		b = appendLen(b, len(key))
		b = append(b, key...)
	}
	b = append(b, bytesTag(kvValue))
	b = appendLen(b, vs)
	b = append(b, bytesTag(avString))
	b = appendLen(b, len(v))
	return append(b, v...)
}

// tag is the one-byte tag of field num < 16 with wire type typ; with
// constant arguments it is a constant.
func tag(num protowire.Number, typ protowire.Type) byte {
	return byte(num)<<3 | byte(typ)
}

// bytesTag is the tag of length-delimited field num < 16.
func bytesTag(num protowire.Number) byte {
	return tag(num, protowire.BytesType)
}

// spanFlagsTag is the tag of Span.flags, field 16 of wire type fixed32, the
// one field written here whose tag takes two bytes: the varint of 16<<3|5.
const spanFlagsTag = "\x85\x01"

// sizeLen is protowire.SizeVarint for a length, with the common one-byte
// case inlined.
func sizeLen(n int) int {
	if n < 0x80 {
		return 1
	}
	return protowire.SizeVarint(uint64(n))
}

// appendLen is protowire.AppendVarint for a length, with the common
// one-byte case inlined.
func appendLen(b []byte, n int) []byte {
	if n < 0x80 {
		return append(b, byte(n))
	}
	return protowire.AppendVarint(b, uint64(n))
}

// appendKeyValue writes kv as a KeyValue message in field num, which must be
// below 16 (a one-byte tag), as all attribute fields are. Scalar values
// have sizes known up front and are written without a length fix-up.
func appendKeyValue(b []byte, num protowire.Number, kv *attribute.KeyValue) []byte {
	if kv.Value.Type() == attribute.STRING { // the common case
		return appendStringKeyValue(b, bytesTag(num), string(kv.Key), kv.Value.AsString())
	}
	if vs, ok := scalarValueSize(kv.Value); ok {
		size := protowire.SizeTag(kvValue) + protowire.SizeBytes(vs)
		if kv.Key != "" {
			size += protowire.SizeTag(kvKey) + protowire.SizeBytes(len(kv.Key))
		}
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(size))
		b = appendStringField(b, kvKey, string(kv.Key))
		b = protowire.AppendTag(b, kvValue, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(vs))
		return appendScalarValue(b, kv.Value)
	}
	var m int
	b, m = beginMessage(b, num, reserveSmall)
	b = appendStringField(b, kvKey, string(kv.Key))
	b = appendAnyValue(b, kvValue, kv.Value)
	return endMessage(b, m)
}

// scalarValueSize returns the encoded size of the AnyValue for v when v is
// not a list or map.
func scalarValueSize(v attribute.Value) (int, bool) {
	switch v.Type() {
	case attribute.EMPTY:
		return 0, true
	case attribute.BOOL:
		return protowire.SizeTag(avBool) + 1, true
	case attribute.INT64:
		return protowire.SizeTag(avInt) + protowire.SizeVarint(uint64(v.AsInt64())), true
	case attribute.FLOAT64:
		return protowire.SizeTag(avDouble) + protowire.SizeFixed64(), true
	case attribute.STRING:
		return protowire.SizeTag(avString) + protowire.SizeBytes(len(v.AsString())), true
	}
	return 0, false
}

// appendScalarValue writes the content of the AnyValue of a value accepted by
// scalarValueSize.
func appendScalarValue(b []byte, v attribute.Value) []byte {
	switch v.Type() {
	case attribute.BOOL:
		b = protowire.AppendTag(b, avBool, protowire.VarintType)
		return protowire.AppendVarint(b, protowire.EncodeBool(v.AsBool()))
	case attribute.INT64:
		b = protowire.AppendTag(b, avInt, protowire.VarintType)
		return protowire.AppendVarint(b, uint64(v.AsInt64()))
	case attribute.FLOAT64:
		b = protowire.AppendTag(b, avDouble, protowire.Fixed64Type)
		return protowire.AppendFixed64(b, math.Float64bits(v.AsFloat64()))
	case attribute.STRING:
		b = protowire.AppendTag(b, avString, protowire.BytesType)
		return protowire.AppendString(b, v.AsString())
	}
	return b
}

// appendArray writes xs as the ArrayValue of an AnyValue, each element as
// the AnyValue of val(x).
func appendArray[T any](b []byte, xs []T, val func(T) attribute.Value) []byte {
	b, l := beginMessage(b, avArray, reserveSmall)
	for _, x := range xs {
		b = appendAnyValue(b, listValues, val(x))
	}
	return endMessage(b, l)
}

func value(v attribute.Value) attribute.Value { return v }

// appendAnyValue writes v as an AnyValue message in field num, mapping the
// attribute types the way the official exporter does.
func appendAnyValue(b []byte, num protowire.Number, v attribute.Value) []byte {
	if vs, ok := scalarValueSize(v); ok {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(vs))
		return appendScalarValue(b, v)
	}
	var m int
	b, m = beginMessage(b, num, reserveSmall)
	switch v.Type() {
	case attribute.BYTESLICE:
		b = protowire.AppendTag(b, avBytes, protowire.BytesType)
		b = protowire.AppendBytes(b, v.AsByteSlice())
	case attribute.BOOLSLICE:
		b = appendArray(b, v.AsBoolSlice(), attribute.BoolValue)
	case attribute.INT64SLICE:
		b = appendArray(b, v.AsInt64Slice(), attribute.Int64Value)
	case attribute.FLOAT64SLICE:
		b = appendArray(b, v.AsFloat64Slice(), attribute.Float64Value)
	case attribute.STRINGSLICE:
		b = appendArray(b, v.AsStringSlice(), attribute.StringValue)
	case attribute.SLICE:
		b = appendArray(b, v.AsSlice(), value)
	case attribute.MAP:
		var l int
		b, l = beginMessage(b, avKvlist, reserveSmall)
		b = appendAttributes(b, listValues, v.AsMap())
		b = endMessage(b, l)
	default:
		// A type this package does not know: the official exporter sends
		// the string "INVALID".
		b = protowire.AppendTag(b, avString, protowire.BytesType)
		b = protowire.AppendString(b, "INVALID")
	}
	return endMessage(b, m)
}

// appendStringField, appendVarintField and appendFixed64Field write field
// num unless its value is zero. num must be below 16 (a one-byte tag), as
// every field they write is.
func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = append(b, bytesTag(num))
	b = appendLen(b, len(s))
	return append(b, s...)
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	if v < 0x80 { // span kinds and status codes
		return append(b, tag(num, protowire.VarintType), byte(v))
	}
	return protowire.AppendVarint(append(b, tag(num, protowire.VarintType)), v)
}

func appendFixed64Field(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendFixed64(append(b, tag(num, protowire.Fixed64Type)), v)
}

// beginMessage starts a length-delimited field num: it writes the tag and
// reserves 1 to 3 bytes for the length. It returns a mark for endMessage: the
// offset where the content starts, shifted left by two, and the reserved
// byte count minus one in the low bits.
func beginMessage(b []byte, num protowire.Number, reserve int) ([]byte, int) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = append(b, make([]byte, reserve)...)
	return b, len(b)<<2 | (reserve - 1)
}

// endMessage writes the length of the content started by beginMessage into
// the reserved room, moving the content when its length needs a different
// number of bytes, so the varint stays minimal as proto.Marshal writes it.
func endMessage(b []byte, mark int) []byte {
	start, reserve := mark>>2, (mark&3)+1
	n := len(b) - start
	size := protowire.SizeVarint(uint64(n))
	at := start - reserve
	if size != reserve {
		if size > reserve {
			b = append(b, make([]byte, size-reserve)...)
		}
		copy(b[at+size:], b[start:start+n])
		b = b[:at+size+n]
	}
	protowire.AppendVarint(b[:at], uint64(n))
	return b
}
