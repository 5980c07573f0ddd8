package telemetry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// Log attribute keys shared by the services, so one query finds a tenant's
// or a trace's lines in every service.
const (
	LogKeyTraceID   = "trace_id"
	LogKeySpanID    = "span_id"
	LogKeyTenant    = "tenant"
	LogKeyNode      = "node"
	LogKeyDevice    = "device"
	LogKeyPrincipal = "principal"
	LogKeyCommand   = "command"
	LogKeyTool      = "tool"
	LogKeyRequestID = "request_id"
	LogKeyService   = "service"
	LogKeyInstance  = "instance"
)

// Redacted replaces the value of a secret in log output.
const Redacted = "[REDACTED]"

// NewLogger returns a logger writing to w in format "json" (production) or
// "text" (dev), at the level held by level (a nil level means a fixed INFO).
// Its handler adds trace_id and span_id from the context's span, adds the
// attributes stored with ContextWithLogAttrs, and redacts secrets: the value
// of any attribute whose key, or the key of a group holding it, names a
// secret (token, password, secret, authorization, cookie, credential, key,
// ...; any case, '_', '-' and '.' ignored) and credentials inside the
// message and string values (URL passwords, "Bearer <token>",
// "password=..." and `"token":"..."` forms). Use the *Context logging
// methods so the trace ids are found.
func NewLogger(w io.Writer, format string, level *slog.LevelVar) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{ReplaceAttr: redact}
	if level != nil {
		opts.Level = level
	}
	var inner slog.Handler
	switch format {
	case "json", "":
		inner = slog.NewJSONHandler(w, opts)
	case "text":
		inner = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("telemetry: log format %q: want json or text", format)
	}
	return slog.New(&handler{inner: inner}), nil
}

// handler adds what ReplaceAttr cannot: attributes taken from the context
// (trace ids, ContextWithLogAttrs), which only Handle sees. It keeps the
// groups opened with WithGroup itself, rather than in the inner handler, so
// those land at the top level of the line. Redaction is the inner handler's
// ReplaceAttr, which sees every attribute, at any group depth.
type handler struct {
	inner  slog.Handler // carries the attributes added before the first group
	groups []openGroup  // groups opened by WithGroup, outermost first
}

// openGroup is a group opened with WithGroup and the attributes added to it
// (before the next group was opened). Groups are kept here rather than in
// the inner handler so trace ids always land at the top level.
type openGroup struct {
	name  string
	attrs []slog.Attr
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	if len(h.groups) == 0 {
		return &handler{inner: h.inner.WithAttrs(attrs)}
	}
	groups := slices.Clone(h.groups)
	last := &groups[len(groups)-1]
	last.attrs = append(slices.Clip(last.attrs), attrs...)
	return &handler{inner: h.inner, groups: groups}
}

func (h *handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &handler{inner: h.inner, groups: append(slices.Clip(h.groups), openGroup{name: name})}
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	nr := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		nr.AddAttrs(slog.String(LogKeyTraceID, sc.TraceID().String()), slog.String(LogKeySpanID, sc.SpanID().String()))
	}
	if ca, ok := ctx.Value(logAttrsKey{}).([]slog.Attr); ok {
		nr.AddAttrs(ca...)
	}
	if len(h.groups) == 0 {
		r.Attrs(func(a slog.Attr) bool {
			nr.AddAttrs(a)
			return true
		})
		return h.inner.Handle(ctx, nr)
	}
	leaf := make([]slog.Attr, 0, r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool {
		leaf = append(leaf, a)
		return true
	})
	for i := len(h.groups) - 1; i >= 0; i-- {
		g := h.groups[i]
		content := append(slices.Clip(g.attrs), leaf...)
		leaf = []slog.Attr{{Key: g.name, Value: slog.GroupValue(content...)}}
	}
	nr.AddAttrs(leaf...)
	return h.inner.Handle(ctx, nr)
}

type logAttrsKey struct{}

// ContextWithLogAttrs returns ctx carrying attrs (tenant, node, request id,
// ...) that the logger's handler adds to every line logged with ctx,
// redacted as any attribute.
func ContextWithLogAttrs(ctx context.Context, attrs ...slog.Attr) context.Context {
	prev, _ := ctx.Value(logAttrsKey{}).([]slog.Attr)
	return context.WithValue(ctx, logAttrsKey{}, append(slices.Clip(prev), attrs...))
}

// IsSecretKey reports whether an attribute or field named key holds a secret
// by name: it contains token, password, passwd, secret, authorization,
// cookie, credential or privatekey, or it is "key" or ends in "key" (apikey,
// hmac_key, device-key), except idempotency, public and node keys. Case and
// the separators '_', '-', '.' and ' ' are ignored.
func IsSecretKey(key string) bool {
	var buf [64]byte
	n := normalizeKey(buf[:0], key)
	k := string(n)
	for _, s := range secretKeyParts {
		if strings.Contains(k, s) {
			return true
		}
	}
	if strings.HasSuffix(k, "key") {
		for _, ok := range publicKeyNames {
			if strings.HasSuffix(k, ok) {
				return false
			}
		}
		return true
	}
	return false
}

var (
	secretKeyParts = []string{"token", "password", "passwd", "secret", "authorization", "cookie", "credential", "privatekey"}
	publicKeyNames = []string{"idempotencykey", "publickey", "nodekey"}
)

func normalizeKey(dst []byte, key string) []byte {
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c == '_' || c == '-' || c == '.' || c == ' ':
			continue
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

// redact is the handlers' ReplaceAttr: it gets every attribute but groups
// (their members come one by one, with the names of the groups holding
// them) and the message, with LogValuers already resolved.
func redact(groups []string, a slog.Attr) slog.Attr {
	if a.Key != "" && IsSecretKey(a.Key) || slices.ContainsFunc(groups, IsSecretKey) {
		if a.Value.Kind() == slog.KindString && a.Value.String() == "" {
			return a // an empty secret reveals nothing, and says it is unset
		}
		return slog.String(a.Key, Redacted)
	}
	v := a.Value
	switch v.Kind() {
	case slog.KindString:
		s := v.String()
		if r := Scrub(s); r != s {
			return slog.String(a.Key, r)
		}
	case slog.KindAny:
		switch x := v.Any().(type) {
		case slog.Level:
			// With a ReplaceAttr, slog's JSON handler writes the level
			// through encoding/json, an allocation a line; as a string the
			// same text is written directly.
			if a.Key == slog.LevelKey && len(groups) == 0 {
				return slog.String(a.Key, x.String())
			}
		case error:
			s := x.Error()
			if r := Scrub(s); r != s {
				return slog.String(a.Key, r)
			}
		case *url.URL:
			if x != nil {
				return slog.String(a.Key, x.Redacted())
			}
		case url.URL:
			return slog.String(a.Key, x.Redacted())
		case []byte:
			s := string(x)
			if r := Scrub(s); r != s {
				return slog.String(a.Key, r)
			}
		}
	}
	return a
}

// Scrub removes credentials from free text: the password of a URL
// (scheme://user:pass@host), the token after "Bearer ", and the value of a
// secret-named key in key=value or "key":"value" form. It returns s itself
// when there is nothing to remove.
func Scrub(s string) string {
	if !strings.ContainsAny(s, "@=:") && !containsFold(s, "bearer ") {
		return s
	}
	b := []byte(nil) // copy made on the first change
	out := func() []byte {
		if b == nil {
			b = []byte(s)
		}
		return b
	}
	cur := func() string {
		if b == nil {
			return s
		}
		return string(b)
	}

	// URL userinfo: scheme://user:password@host
	for i := 0; ; {
		t := cur()
		j := strings.Index(t[i:], "://")
		if j < 0 {
			break
		}
		start := i + j + 3
		end := start
		for end < len(t) && !isURLStop(t[end]) {
			end++
		}
		auth := t[start:end]
		if at := strings.LastIndexByte(auth, '@'); at >= 0 {
			if colon := strings.IndexByte(auth[:at], ':'); colon >= 0 {
				p0, p1 := start+colon+1, start+at
				nb := append(append(append([]byte{}, out()[:p0]...), Redacted...), out()[p1:]...)
				b = nb
				end = p0 + len(Redacted) + (end - p1)
			}
		}
		i = end
	}

	// Bearer <token>
	for i := 0; ; {
		t := cur()
		j := indexFold(t[i:], "bearer ")
		if j < 0 {
			break
		}
		p0 := i + j + len("bearer ")
		for p0 < len(t) && t[p0] == ' ' {
			p0++
		}
		p1 := p0
		for p1 < len(t) && !isValueStop(t[p1]) {
			p1++
		}
		if p1 > p0 && t[p0:p1] != Redacted {
			b = append(append(append([]byte{}, out()[:p0]...), Redacted...), out()[p1:]...)
			p1 = p0 + len(Redacted)
		}
		i = p1
	}

	// key=value and "key":"value" / "key": value
	for i := 0; i < len(cur()); i++ {
		t := cur()
		c := t[i]
		if c != '=' && c != ':' {
			continue
		}
		// the key ends right before '=' or before `":`
		kEnd := i
		if c == ':' {
			k := i
			for k > 0 && t[k-1] == ' ' {
				k--
			}
			if k == 0 || t[k-1] != '"' {
				continue
			}
			kEnd = k - 1
		}
		kStart := kEnd
		for kStart > 0 && isKeyChar(t[kStart-1]) {
			kStart--
		}
		if kStart == kEnd || !IsSecretKey(t[kStart:kEnd]) {
			continue
		}
		p0 := i + 1
		for p0 < len(t) && t[p0] == ' ' {
			p0++
		}
		quoted := p0 < len(t) && t[p0] == '"'
		if quoted {
			p0++
		}
		p1 := p0
		for p1 < len(t) {
			if quoted {
				if t[p1] == '\\' && p1+1 < len(t) {
					p1 += 2
					continue
				}
				if t[p1] == '"' {
					break
				}
			} else if isValueStop(t[p1]) {
				break
			}
			p1++
		}
		if p1 > len(t) {
			p1 = len(t)
		}
		if p1 > p0 && t[p0:p1] != Redacted {
			b = append(append(append([]byte{}, out()[:p0]...), Redacted...), out()[p1:]...)
			p1 = p0 + len(Redacted)
		}
		i = p1 - 1
	}
	return cur()
}

func isKeyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.'
}

func isValueStop(c byte) bool {
	return c == ' ' || c == '&' || c == ';' || c == ',' || c == '"' || c == '\'' || c == '\n' || c == '\r' || c == '\t' || c == '}' || c == ')'
}

func isURLStop(c byte) bool {
	return c == '/' || c == ' ' || c == '"' || c == '\'' || c == '\n' || c == '\t' || c == '?' || c == '#' || c == ','
}

// indexFold is strings.Index ignoring ASCII case of sub (given in lowercase).
func indexFold(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return i
		}
	}
	return -1
}

func containsFold(s, sub string) bool { return indexFold(s, sub) >= 0 }

// redactURL removes the password of a URL for error messages and logs.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return Scrub(s)
}
