package upstream

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
)

// envFakeGateway makes TestFakeGatewayProcess serve a fake gateway in a
// child process, so that a benchmark measures the links' memory alone.
const envFakeGateway = "XIAOCLAW_UPSTREAM_FAKE_GATEWAY"

// TestFakeGatewayProcess is the child of BenchmarkLinkMemory; it does
// nothing in a normal test run.
func TestFakeGatewayProcess(t *testing.T) {
	if os.Getenv(envFakeGateway) != "1" {
		return
	}
	gw := newFakeGateway(t)
	gw.tickMs, gw.sendTicks = 30000, true
	go func() {
		for range gw.conns {
		}
	}()
	fmt.Println(gw.url())
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes stdin
}

// BenchmarkLinkMemory reports the heap and stack one online link holds in
// the shim (its WebSocket, read loop, tick watchdog, state and published
// tool catalog), with the upstream gateway in another process.
func BenchmarkLinkMemory(b *testing.B) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestFakeGatewayProcess$")
	cmd.Env = append(os.Environ(), envFakeGateway+"=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	url := strings.TrimSpace(line)

	const n = 300
	if os.Getenv("XC_HEAP_PROFILE") != "" {
		runtime.MemProfileRate = 1
	}
	measure := func() (heap, stack uint64) {
		// Each GC halves a stack that uses under a quarter of it; a
		// long-running worker has run many.
		for range 4 {
			runtime.GC()
		}
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc, m.StackInuse
	}
	// A XiaoZhi board's catalog: four tools with their schemas, as the
	// simulated devices list them; each link keeps its descriptors.
	catalog := catalogOf("self.get_device_status", "self.audio_speaker.set_volume", "self.screen.set_brightness",
		"self.screen.set_theme")
	for range b.N {
		identities := make([]ed25519.PrivateKey, n)
		for i := range identities {
			identities[i] = occlient.NewIdentity()
		}
		heap0, stack0 := measure()
		g0 := runtime.NumGoroutine()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		links := make([]*link, n)
		for i := range links {
			links[i] = newLink(linkConfig{
				upstream: Upstream{Name: "home", Tenant: "acme", URL: url, Token: linkToken},
				node:     Node{NodeID: fmt.Sprintf("xz-%012x", i), DisplayName: "speaker", Version: "1.6.0"},
				identity: identities[i], invoker: &fakeInvoker{}, timing: Timing{ConnectTimeout: 30 * time.Second},
				log: slog.New(slog.DiscardHandler),
			})
			links[i].setCatalog(catalog)
			wg.Add(1)
			links[i].start(ctx, wg.Done)
		}
		deadline := time.Now().Add(2 * time.Minute)
		for _, l := range links {
			for l.Status().State != StateOnline {
				if time.Now().After(deadline) {
					b.Fatalf("link %+v not online", l.Status())
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		heap1, stack1 := measure()
		if p := os.Getenv("XC_HEAP_PROFILE"); p != "" {
			f, _ := os.Create(p)
			_ = pprof.WriteHeapProfile(f)
			f.Close()
		}
		b.ReportMetric(float64(heap1+stack1-heap0-stack0)/n, "bytes/link")
		b.ReportMetric(float64(stack1-stack0)/n, "stack-bytes/link")
		b.ReportMetric(float64(runtime.NumGoroutine()-g0)/n, "goroutines/link")
		cancel()
		wg.Wait()
	}
}
