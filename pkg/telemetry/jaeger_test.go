//go:build jaeger

package telemetry_test

// Run with: scripts/jaeger.sh build && go test -tags jaeger -run Jaeger ./pkg/telemetry/
// The test starts its own Jaeger (through scripts/jaeger.sh, on free
// loopback ports) and fails when the binary has not been built.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry/telemetrytest"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.work above the test directory")
		}
		dir = parent
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// jaegerTrace is the part of Jaeger's /api/traces/<id> answer the test reads.
type jaegerTrace struct {
	Data []struct {
		TraceID string `json:"traceID"`
		Spans   []struct {
			SpanID        string `json:"spanID"`
			OperationName string `json:"operationName"`
			ProcessID     string `json:"processID"`
			References    []struct {
				RefType string `json:"refType"`
				SpanID  string `json:"spanID"`
			} `json:"references"`
			Tags []struct {
				Key   string `json:"key"`
				Value any    `json:"value"`
			} `json:"tags"`
		} `json:"spans"`
		Processes map[string]struct {
			ServiceName string `json:"serviceName"`
		} `json:"processes"`
	} `json:"data"`
}

func TestJaegerReceivesAndServesTraces(t *testing.T) {
	root := repoRoot(t)
	script := filepath.Join(root, "scripts", "jaeger.sh")
	if _, err := os.Stat(filepath.Join(root, ".tools", "bin", "jaeger")); err != nil {
		t.Fatalf("Jaeger is not built (%v): run scripts/jaeger.sh build first (about 5 minutes)", err)
	}
	grpcPort, httpPort, queryPort, queryGRPCPort := freePort(t), freePort(t), freePort(t), freePort(t)
	env := append(os.Environ(),
		"JAEGER_STATE_DIR="+t.TempDir(),
		"JAEGER_OTLP_GRPC_PORT="+grpcPort, "JAEGER_OTLP_HTTP_PORT="+httpPort,
		"JAEGER_QUERY_PORT="+queryPort, "JAEGER_QUERY_GRPC_PORT="+queryGRPCPort,
	)
	run := func(args ...string) string {
		cmd := exec.Command(script, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("jaeger.sh %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("start")
	t.Cleanup(func() { run("stop") })
	api := "http://127.0.0.1:" + queryPort

	for _, tc := range []struct{ protocol, endpoint string }{
		{"grpc", "http://127.0.0.1:" + grpcPort},
		{"http/protobuf", "http://127.0.0.1:" + httpPort},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			service := "xiaoclaw-jaeger-test-" + strings.ReplaceAll(tc.protocol, "/", "-")
			telemetrytest.SetEnv(t, map[string]string{
				"OTEL_TRACES_EXPORTER":        "otlp",
				"OTEL_EXPORTER_OTLP_PROTOCOL": tc.protocol,
				"OTEL_EXPORTER_OTLP_ENDPOINT": tc.endpoint,
			})
			tp, err := telemetry.NewTracerProvider(context.Background(), service, telemetry.Config{Instance: "test-1"})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(tp.String(), "otlp "+tc.protocol) {
				t.Fatalf("provider %q, want otlp %s", tp, tc.protocol)
			}
			tr := tp.Tracer(telemetry.ScopeName)
			ctx, span := telemetry.StartOperatorRequest(context.Background(), tr, "node.invoke", "",
				telemetry.CallInfo{Tenant: "acme", Node: "xz-a1b2c3d4e5f6", Tool: "self.light.on"})
			msg := nats.NewMsg("xc.acme.node.invoke")
			telemetry.InjectMsg(ctx, msg)
			_, child := telemetry.StartNATSHandler(context.Background(), tr, msg, telemetry.CallInfo{})
			child.End("", nil)
			span.End("", nil)
			if err := tp.Shutdown(context.Background()); err != nil {
				t.Fatalf("export to Jaeger: %v", err)
			}
			traceID, _ := telemetry.TraceIDs(ctx)

			var got jaegerTrace
			deadline := time.Now().Add(15 * time.Second)
			for {
				res, err := http.Get(api + "/api/traces/" + traceID)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				got = jaegerTrace{}
				if res.StatusCode == http.StatusOK && json.Unmarshal(body, &got) == nil && len(got.Data) == 1 && len(got.Data[0].Spans) == 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("trace %s not queryable in Jaeger: %d %s", traceID, res.StatusCode, body)
				}
				time.Sleep(100 * time.Millisecond)
			}
			tr0 := got.Data[0]
			byName := map[string]int{}
			for i, s := range tr0.Spans {
				byName[s.OperationName] = i
				if svc := tr0.Processes[s.ProcessID].ServiceName; svc != service {
					t.Errorf("span %s from service %q, want %q", s.OperationName, svc, service)
				}
			}
			parent, ok1 := byName["node.invoke"]
			kid, ok2 := byName["process xc.{tenant}.node.invoke"]
			if !ok1 || !ok2 {
				t.Fatalf("span names %v", byName)
			}
			refs := tr0.Spans[kid].References
			if len(refs) != 1 || refs[0].RefType != "CHILD_OF" || refs[0].SpanID != tr0.Spans[parent].SpanID {
				t.Errorf("child references %+v, want CHILD_OF %s", refs, tr0.Spans[parent].SpanID)
			}
			tags := map[string]string{}
			for _, tag := range tr0.Spans[parent].Tags {
				tags[tag.Key] = fmt.Sprint(tag.Value)
			}
			if tags["xiaoclaw.tenant"] != "acme" || tags["xiaoclaw.tool"] != "self.light.on" {
				t.Errorf("tags %v", tags)
			}

			// The script's query command prints the same trace.
			if out := run("query", traceID); !strings.Contains(out, traceID) || !strings.Contains(out, "node.invoke") {
				t.Errorf("jaeger.sh query printed %.200s", out)
			}
			if out := run("recent", service); !strings.Contains(out, traceID) {
				t.Errorf("jaeger.sh recent %s printed %q, want %s", service, out, traceID)
			}
		})
	}
}
