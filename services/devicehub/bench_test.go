package devicehub_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub"
)

// The memory benchmark runs the NATS server and the simulated devices in a
// child process (this test binary with benchChildEnv set), so that the
// parent's memory growth is the hub's alone.
const (
	benchChildEnv    = "DEVICEHUB_BENCH_CHILD"
	benchSessionsEnv = "DEVICEHUB_BENCH_SESSIONS" // default 2000; ulimit -n bounds it near 19000
)

func TestMain(m *testing.M) {
	if os.Getenv(benchChildEnv) != "" {
		os.Exit(runBenchChild())
	}
	os.Exit(m.Run())
}

// runBenchChild serves the parent over stdin/stdout:
//
//	child  -> "NATS <url>"
//	parent -> "CONNECT <transport> <url> <count> <extra-tools>" (mqtt: url is the OTA URL)
//	child  -> "ONLINE" once the hub announced every device (or "ERROR <text>")
//	parent closes stdin; the child closes the fleet and exits.
func runBenchChild() int {
	dir, err := os.MkdirTemp("", "devicehub-bench")
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ns, err := natsembed.Start(natsembed.Config{StoreDir: dir})
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	defer ns.Shutdown()
	fmt.Println("NATS", ns.ClientURL())

	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		return 1
	}
	var transport, url string
	var count, tools int
	if _, err := fmt.Sscanf(in.Text(), "CONNECT %s %s %d %d", &transport, &url, &count, &tools); err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	nc, err := ns.Connect("bench-watch")
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	defer nc.Close()
	online := make(chan struct{}, count)
	sub, err := nc.Subscribe(wire.SubjectDeviceStateAll, func(m *nats.Msg) {
		if strings.Contains(string(m.Data), `"kind":"online"`) {
			online <- struct{}{}
		}
	})
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	dc := xzsim.Config{URL: url, Token: testToken, ExtraTools: tools}
	if transport == wire.TransportMQTT {
		dc = xzsim.Config{OTAURL: url, ExtraTools: tools}
	}
	fleet, err := xzsim.StartFleet(context.Background(), xzsim.FleetConfig{Device: dc, Count: count, Seed: 0xbe, Concurrency: 32})
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	defer fleet.Close()
	timeout := time.After(2 * time.Minute)
	for range count {
		select {
		case <-online:
		case <-timeout:
			fmt.Println("ERROR not every device came online")
			return 1
		}
	}
	fmt.Println("ONLINE")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

type memSample struct {
	rss, heapStack uint64
	stack          uint64
	goroutines     int
	sockPages      int64
}

func sampleMemory(b *testing.B) memSample {
	// Each GC cycle halves a goroutine stack using under a quarter of it:
	// a few cycles reach the steady state of an idle server.
	for range 4 {
		runtime.GC()
	}
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	statm, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(statm))
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return memSample{
		rss: pages * uint64(os.Getpagesize()), heapStack: ms.HeapInuse + ms.StackInuse, stack: ms.StackInuse,
		goroutines: runtime.NumGoroutine(), sockPages: tcpSocketPages(),
	}
}

// tcpSocketPages is the kernel's TCP buffer memory, machine-wide, in pages.
func tcpSocketPages() int64 {
	b, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "TCP:") {
			continue
		}
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "mem" {
				n, _ := strconv.ParseInt(f[i+1], 10, 64)
				return n
			}
		}
	}
	return 0
}

// BenchmarkIdleSessionMemory measures the hub's memory per idle session
// over WebSocket and over MQTT, in one run, with DEVICEHUB_BENCH_SESSIONS
// (default 2000) simulated devices that finished MCP discovery (4 tools
// each, catalog interned). MQTT devices boot through the OTA endpoint.
func BenchmarkIdleSessionMemory(b *testing.B) {
	n := 2000
	if v := os.Getenv(benchSessionsEnv); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("%s=%q", benchSessionsEnv, v)
		}
	}
	for _, transport := range []string{wire.TransportWebSocket, wire.TransportMQTT} {
		b.Run(transport, func(b *testing.B) {
			measured := false
			for b.Loop() {
				if measured {
					continue
				}
				measured = true
				measureIdleSessions(b, transport, n)
			}
		})
	}
}

func measureIdleSessions(b *testing.B, transport string, n int) {
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), benchChildEnv+"=1")
	child.Stderr = os.Stderr
	stdin, err := child.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := child.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { stdin.Close(); _ = child.Wait() }()
	out := bufio.NewScanner(stdout)
	line := func() string {
		if !out.Scan() {
			b.Fatal("benchmark child ended early")
		}
		if strings.HasPrefix(out.Text(), "ERROR") {
			b.Fatal("benchmark child:", out.Text())
		}
		return out.Text()
	}
	natsURL, ok := strings.CutPrefix(line(), "NATS ")
	if !ok {
		b.Fatal("unexpected child output")
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	svc, err := devicehub.New(devicehub.Config{
		DeviceAddr: "127.0.0.1:0", MQTTAddr: "127.0.0.1:0", Auth: devCreds, IdleTimeout: time.Hour,
		OTA: devicehub.OTAConfig{Credentials: devCreds, AutoActivateTenant: testTenant},
	}, nc, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-svc.Ready()

	before := sampleMemory(b)
	start := time.Now()
	url := wsURL(svc)
	if transport == wire.TransportMQTT {
		url = otaURL(svc)
	}
	fmt.Fprintf(stdin, "CONNECT %s %s %d 0\n", transport, url, n)
	if line() != "ONLINE" {
		b.Fatal("unexpected child output")
	}
	connectTime := time.Since(start)
	if svc.Sessions() != n {
		b.Fatalf("hub holds %d sessions, want %d", svc.Sessions(), n)
	}
	after := sampleMemory(b)
	per := func(d float64) float64 { return d / float64(n) / 1024 }
	b.ReportMetric(per(float64(after.rss)-float64(before.rss)), "rss-KB/session")
	b.ReportMetric(per(float64(after.heapStack)-float64(before.heapStack)), "heap+stack-KB/session")
	b.ReportMetric(per(float64(after.stack)-float64(before.stack)), "stack-KB/session")
	b.ReportMetric(float64(after.goroutines-before.goroutines)/float64(n), "goroutines/session")
	if path := os.Getenv("DEVICEHUB_BENCH_HEAPPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	b.ReportMetric(per(float64(after.sockPages-before.sockPages)*float64(os.Getpagesize())), "kernel-sock-KB/session")
	b.ReportMetric(float64(n)/connectTime.Seconds(), "connects/s")
	b.ReportMetric(float64(n), "sessions")
}

// BenchmarkRPCRoundTrip compares a tools/call through NATS (nc.Request to
// DeviceRPC, as the shim sends it) with the same call made directly on the
// hub's session (Service.Call), alternating both in one run so the ratio
// holds on a noisy machine.
func BenchmarkRPCRoundTrip(b *testing.B) {
	e := newEnv(b)
	hub := startHub(b, e, devicehub.Config{})
	const mac = "aa:bb:cc:00:be:01"
	dev := canonical(b, mac)
	connectOnline(b, e, hub, mac, nil)
	body := []byte(callBody("self.audio_speaker.set_volume", `{"volume":50}`))
	ctx := context.Background()
	var direct, viaNATS []time.Duration
	msg := &nats.Msg{Subject: wire.DeviceRPC(testTenant, dev), Header: nats.Header{}, Data: body}
	wire.SetTimeout(msg.Header, time.Now().Add(time.Hour))
	for b.Loop() {
		t0 := time.Now()
		if _, err := hub.Call(ctx, testTenant, dev, body); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		r, err := e.nc.RequestMsg(msg, 5*time.Second)
		if err != nil || r.Header.Get(wire.HeaderFault) != "" {
			b.Fatal(err)
		}
		t2 := time.Now()
		direct = append(direct, t1.Sub(t0))
		viaNATS = append(viaNATS, t2.Sub(t1))
	}
	slices.Sort(direct)
	slices.Sort(viaNATS)
	pct := func(d []time.Duration, p float64) float64 {
		return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1000
	}
	b.ReportMetric(pct(direct, 0.5), "direct-p50-µs")
	b.ReportMetric(pct(direct, 0.99), "direct-p99-µs")
	b.ReportMetric(pct(viaNATS, 0.5), "nats-p50-µs")
	b.ReportMetric(pct(viaNATS, 0.99), "nats-p99-µs")
	b.ReportMetric(pct(viaNATS, 0.5)-pct(direct, 0.5), "nats-overhead-p50-µs")
	b.ReportMetric(pct(viaNATS, 0.5)/pct(direct, 0.5), "nats/direct-p50")
	b.ReportMetric(pct(viaNATS, 0.99)/pct(direct, 0.99), "nats/direct-p99")
}

// BenchmarkSubscriptionMemory weighs the two ways to serve one subject per
// device: a callback subscription each (nats.go starts a goroutine per
// subscription) or channel subscriptions into one shared channel (the
// hub's choice). Server-side cost is the same for both.
func BenchmarkSubscriptionMemory(b *testing.B) {
	const n = 2000
	for _, mode := range []string{"callback-per-device", "shared-channel"} {
		b.Run(mode, func(b *testing.B) {
			measured := false
			for b.Loop() {
				if measured {
					continue
				}
				measured = true
				ns, err := natsembed.Start(natsembed.Config{StoreDir: b.TempDir()})
				if err != nil {
					b.Fatal(err)
				}
				nc, err := ns.Connect("bench")
				if err != nil {
					b.Fatal(err)
				}
				shared := make(chan *nats.Msg, 1024)
				before := sampleMemory(b)
				subs := make([]*nats.Subscription, n)
				for i := range subs {
					subj := wire.DeviceRPC("dev", fmt.Sprintf("d%06d", i))
					if mode == "shared-channel" {
						subs[i], err = nc.ChanSubscribe(subj, shared)
					} else {
						subs[i], err = nc.Subscribe(subj, func(*nats.Msg) {})
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				if err := nc.Flush(); err != nil {
					b.Fatal(err)
				}
				after := sampleMemory(b)
				b.ReportMetric(float64(after.heapStack-before.heapStack)/n/1024, "heap+stack-KB/sub")
				b.ReportMetric(float64(after.goroutines-before.goroutines)/n, "goroutines/sub")
				runtime.KeepAlive(subs)
				nc.Close()
				ns.Shutdown()
			}
		})
	}
}

// BenchmarkInvokeByTransport compares a tools/call through NATS to a
// WebSocket device and to an MQTT device on the same hub, alternating
// both in one run so the ratio holds on a noisy machine.
func BenchmarkInvokeByTransport(b *testing.B) {
	e := newEnv(b)
	hub := startMQTTHub(b, e, nil)
	macs := map[string]string{wire.TransportWebSocket: "aa:bb:cc:00:be:11", wire.TransportMQTT: "aa:bb:cc:00:be:12"}
	msgs := map[string]*nats.Msg{}
	for transport, mac := range macs {
		w := watch(b, e, testTenant, canonical(b, mac))
		d := deviceOver(b, hub, transport, mac, nil)
		if err := d.Connect(context.Background()); err != nil {
			b.Fatal(err)
		}
		w.nextKind(wire.DeviceOnline)
		m := &nats.Msg{Subject: wire.DeviceRPC(testTenant, canonical(b, mac)), Header: nats.Header{},
			Data: []byte(callBody("self.audio_speaker.set_volume", `{"volume":50}`))}
		wire.SetTimeout(m.Header, time.Now().Add(time.Hour))
		msgs[transport] = m
	}
	lat := map[string][]time.Duration{}
	for b.Loop() {
		for _, transport := range []string{wire.TransportWebSocket, wire.TransportMQTT} {
			t0 := time.Now()
			r, err := e.nc.RequestMsg(msgs[transport], 5*time.Second)
			if err != nil || r.Header.Get(wire.HeaderFault) != "" {
				b.Fatal(transport, err)
			}
			lat[transport] = append(lat[transport], time.Since(t0))
		}
	}
	pct := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1000
	}
	ws50, ws99 := pct(lat[wire.TransportWebSocket], 0.5), pct(lat[wire.TransportWebSocket], 0.99)
	mq50, mq99 := pct(lat[wire.TransportMQTT], 0.5), pct(lat[wire.TransportMQTT], 0.99)
	b.ReportMetric(ws50, "ws-p50-µs")
	b.ReportMetric(ws99, "ws-p99-µs")
	b.ReportMetric(mq50, "mqtt-p50-µs")
	b.ReportMetric(mq99, "mqtt-p99-µs")
	b.ReportMetric(mq50/ws50, "mqtt/ws-p50")
}
