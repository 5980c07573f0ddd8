package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

func newTestLogger(t *testing.T, format string, level *slog.LevelVar) (*slog.Logger, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	log, err := telemetry.NewLogger(&buf, format, level)
	if err != nil {
		t.Fatal(err)
	}
	return log, &buf
}

func jsonLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func TestLogLinesCarryTraceAndContextAttributes(t *testing.T) {
	log, buf := newTestLogger(t, "json", nil)
	ctx, _ := telemetry.ContextWithTraceparent(context.Background(), validTP)
	ctx = telemetry.ContextWithLogAttrs(ctx, slog.String(telemetry.LogKeyTenant, "acme"))
	ctx = telemetry.ContextWithLogAttrs(ctx, slog.String(telemetry.LogKeyNode, "xz-a1b2c3d4e5f6"))
	log.With("service", "gateway").WithGroup("call").InfoContext(ctx, "invoke done", "command", "mcp.tools.call")
	log.InfoContext(context.Background(), "no trace here")

	lines := jsonLines(t, buf)
	l := lines[0]
	want := map[string]any{
		"msg": "invoke done", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7",
		"tenant": "acme", "node": "xz-a1b2c3d4e5f6", "service": "gateway",
	}
	for k, v := range want {
		if l[k] != v {
			t.Errorf("%s = %v, want %v (line %v)", k, l[k], v, l)
		}
	}
	// Groups hold the call's attributes; the trace ids stay at the top level.
	if g, _ := l["call"].(map[string]any); g["command"] != "mcp.tools.call" {
		t.Errorf("group call = %v", l["call"])
	}
	if _, ok := lines[1]["trace_id"]; ok {
		t.Errorf("trace_id on a line without a span: %v", lines[1])
	}
}

func TestTextFormatAndBadFormat(t *testing.T) {
	log, buf := newTestLogger(t, "text", nil)
	ctx, _ := telemetry.ContextWithTraceparent(context.Background(), validTP)
	log.InfoContext(ctx, "hello", "token", "tok-123")
	out := buf.String()
	if !strings.Contains(out, "msg=hello") || !strings.Contains(out, "trace_id=4bf92f3577b34da6a3ce929d0e0e4736") || strings.Contains(out, "tok-123") {
		t.Fatalf("text output %q", out)
	}
	if _, err := telemetry.NewLogger(buf, "xml", nil); err == nil {
		t.Fatal("format xml accepted")
	}
}

func TestLevelChangesAtRunTime(t *testing.T) {
	var lv slog.LevelVar
	log, buf := newTestLogger(t, "json", &lv)
	log.Debug("hidden")
	lv.Set(slog.LevelDebug)
	log.Debug("shown")
	lines := jsonLines(t, buf)
	if len(lines) != 1 || lines[0]["msg"] != "shown" {
		t.Fatalf("lines %v", lines)
	}
}

type credentials struct{ user, pass string }

func (c credentials) LogValue() slog.Value {
	return slog.GroupValue(slog.String("user", c.user), slog.String("password", c.pass))
}

// TestNoSecretInLogOutput plants secrets in every way a service might log
// them and scans the whole output for them.
func TestNoSecretInLogOutput(t *testing.T) {
	secrets := []string{
		"op-token-4f9a2c", "pg-pass-77d1e", "hmac-sk-91b3", "device-key-5e8f", "bearer-tok-2c4d",
		"nats-pass-8a1b", "api-key-0f3e", "json-secret-6b2a", "cookie-val-3d9c", "ctx-token-1a7e",
		"group-pass-2b8f", "err-pass-9c0d", "url-obj-pass-4e1a", "bytes-token-7f2b", "with-token-5d3c",
	}
	for _, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			log, buf := newTestLogger(t, format, nil)
			ctx := telemetry.ContextWithLogAttrs(context.Background(), slog.String("accessToken", "ctx-token-1a7e"))
			u, _ := url.Parse("postgres://app:url-obj-pass-4e1a@db:5432/x")
			log.With("operator_token", "with-token-5d3c").InfoContext(ctx, "start",
				"token", "op-token-4f9a2c",
				"DB_PASSWORD", "pg-pass-77d1e",
				"hmac-secret", "hmac-sk-91b3",
				"deviceKey", "device-key-5e8f",
				"Authorization", "Bearer bearer-tok-2c4d",
				"nats_url", "nats://svc:nats-pass-8a1b@nats:4222",
				"header", "X-Api-Key=api-key-0f3e; other=1",
				"body", `{"client_secret": "json-secret-6b2a","name":"x"}`,
				"Cookie", "sid=cookie-val-3d9c",
				"db", credentials{"app", "group-pass-2b8f"},
				"url", u,
				"raw", []byte(`token=bytes-token-7f2b`),
				slog.Group("auth", slog.String("password", "group-pass-2b8f")),
			)
			log.ErrorContext(ctx, "connect failed", "err", fmt.Errorf("dial postgres://app:err-pass-9c0d@db/x: %w", errors.New("refused")))
			log.Info("sent Authorization: Bearer bearer-tok-2c4d to upstream")
			out := buf.String()
			for _, s := range secrets {
				if strings.Contains(out, s) {
					t.Errorf("secret %q in log output", s)
				}
			}
			// What is not secret stays readable.
			for _, keep := range []string{"nats:4222", "app", "refused", "other=1", `name`, "upstream"} {
				if !strings.Contains(out, keep) {
					t.Errorf("%q missing from log output", keep)
				}
			}
			if !strings.Contains(out, telemetry.Redacted) {
				t.Error("no redaction marker in the output")
			}
			if t.Failed() {
				t.Log(out)
			}
		})
	}
}

// A group named for a secret hides all it holds, at any depth, and the
// trace ids stay at the top level of a line logged inside groups.
func TestSecretGroupsAtAnyDepth(t *testing.T) {
	log, buf := newTestLogger(t, "json", nil)
	ctx, _ := telemetry.ContextWithTraceparent(context.Background(), validTP)
	log.WithGroup("db").With("host", "pg").WithGroup("credentials").InfoContext(ctx, "x",
		"user", "app-user-1d2e", slog.Group("inner", slog.String("note", "inner-val-7c3b")))
	out := buf.String()
	for _, s := range []string{"app-user-1d2e", "inner-val-7c3b"} {
		if strings.Contains(out, s) {
			t.Errorf("%q in %s", s, out)
		}
	}
	line := jsonLines(t, buf)[0]
	if line["trace_id"] != "4bf92f3577b34da6a3ce929d0e0e4736" || line["db"].(map[string]any)["host"] != "pg" {
		t.Fatalf("line %v", line)
	}
}

func TestIsSecretKey(t *testing.T) {
	for _, k := range []string{"token", "Token", "operator_token", "ACCESS-TOKEN", "password", "db.password", "passwd",
		"secret", "hmacSecret", "authorization", "Proxy-Authorization", "cookie", "set-cookie", "credentials",
		"private_key", "key", "api_key", "apiKey", "device-key", "signing.key"} {
		if !telemetry.IsSecretKey(k) {
			t.Errorf("%q not treated as secret", k)
		}
	}
	for _, k := range []string{"tenant", "node", "keyId", "key_id", "idempotencyKey", "idempotency_key", "publicKey",
		"node_key", "monkeys", "trace_id", "command", "tool", "author"} {
		if telemetry.IsSecretKey(k) {
			t.Errorf("%q treated as secret", k)
		}
	}
}

// FuzzRedaction checks, on any text, that a secret planted after a secret
// key (as key=value, "key":"value" or a URL password) never survives, and
// that the handler never fails.
func FuzzRedaction(f *testing.F) {
	f.Add("prefix ", " suffix", "s3cr3tv4lue")
	f.Add(`{"a":1,`, `}`, "xyzzy-1234")
	f.Add("nats://", "@host", "pw-0000")
	f.Add("", "", "Bearer")
	f.Fuzz(func(t *testing.T, prefix, suffix, secret string) {
		if len(secret) < 6 || strings.ContainsAny(secret, " &;,\"'\n\r\t})\\/@?#:=%") || strings.Contains(prefix+suffix, secret) {
			return
		}
		const fixed = `password= "token":"" https://user:@example.com/x Bearer `
		if strings.Contains(strings.ToLower(fixed), strings.ToLower(secret)) {
			return
		}
		for _, planted := range []string{
			prefix + "password=" + secret + " " + suffix,
			prefix + `"token":"` + secret + `"` + suffix,
			prefix + " https://user:" + secret + "@example.com/x " + suffix,
			prefix + " Bearer " + secret + " " + suffix,
		} {
			var buf bytes.Buffer
			log, _ := telemetry.NewLogger(&buf, "json", nil)
			log.Info(planted, "v", planted)
			var line struct{ Msg, V string }
			if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
				t.Fatalf("log line %q: %v", buf.String(), err)
			}
			if strings.Contains(line.Msg, secret) || strings.Contains(line.V, secret) {
				t.Fatalf("secret %q survived in %q", secret, buf.String())
			}
		}
	})
}
