//go:build interop

package devstack

// How many bridged devices one real OpenClaw gateway takes from xiaoclaw:
// run with
//
//	go test -tags interop -run '^$' -bench UpstreamRamp -benchtime 1x ./internal/devstack/
//
// It prints figures and asserts nothing.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/openclawref"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// groupCPU is the CPU time (user + system) used so far by the processes
// of process group pgid, from /proc.
func groupCPU(pgid int) time.Duration {
	entries, _ := os.ReadDir("/proc")
	var ticks int64
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command (which may hold spaces) in parentheses.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) < 13 || f[2] != strconv.Itoa(pgid) {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + st
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ 100
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkUpstreamRampRealGateway adds simulated devices in stages until
// a stage does not get every link online upstream within a minute, or the
// ramp has taken two minutes.
func BenchmarkUpstreamRampRealGateway(b *testing.B) {
	bin, env := openclawref.Require(b)
	gw := startRefGateway(b, bin, env)
	home := startStack(b, Config{Upstream: upstream.Upstream{Name: "ref", URL: gw.url(), Token: refGatewayToken}})
	stages := []int{50, 100, 200, 400, 800, 1600}
	rampLimit := 2 * time.Minute
	stageLimit := 60 * time.Second
	start := time.Now()
	var fleets []*xzsim.Fleet
	defer func() {
		for _, f := range fleets {
			f.Close()
		}
	}()
	have := 0
	for _, n := range stages {
		if time.Since(start) > rampLimit {
			b.Logf("ramp: stopped before %d devices, 2 minutes of ramp spent", n)
			break
		}
		f, err := xzsim.NewFleet(xzsim.FleetConfig{Device: xzsim.Config{URL: home.DeviceURL(0), Token: testDeviceToken},
			Count: n - have, Seed: uint32(1000 + n)})
		if err != nil {
			b.Fatal(err)
		}
		fleets = append(fleets, f)
		gwCPU0, selfCPU0, t0 := groupCPU(gw.cmd.Process.Pid), selfCPU(), time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), stageLimit)
		err = f.ConnectAll(ctx)
		cancel()
		if err != nil {
			b.Logf("ramp: %d devices: the simulated devices could not connect to xiaoclaw: %v", n, err)
			break
		}
		hello := time.Since(t0)
		var first []time.Duration // hello of the stage to each new link online
		seen := map[string]bool{}
		var states map[upstream.State]int
		var lastErr string
		for {
			states = map[upstream.State]int{}
			for _, s := range home.Upstreams[0].Status() {
				states[s.State]++
				if s.State == upstream.StateOnline && !seen[s.NodeID] {
					seen[s.NodeID] = true
					first = append(first, time.Since(t0))
				}
				if s.State != upstream.StateOnline && s.LastError != "" {
					lastErr = s.LastError
				}
			}
			if states[upstream.StateOnline] == n || time.Since(t0) > stageLimit {
				break
			}
			time.Sleep(20 * time.Millisecond) // sampling the states for the figure
		}
		took := time.Since(t0)
		gwCPU, ourCPU := groupCPU(gw.cmd.Process.Pid)-gwCPU0, selfCPU()-selfCPU0
		slices.Sort(first)
		pct := func(p float64) time.Duration {
			if len(first) == 0 {
				return 0
			}
			return first[min(len(first)-1, int(p*float64(len(first))))].Round(time.Millisecond)
		}
		count, connected, err := refCLI{bin: bin, env: env, gw: gw}.listedXiaozhi()
		conn := 0
		for _, c := range connected {
			if c {
				conn++
			}
		}
		b.Logf("ramp: %4d devices (+%d): hello of all %s; online upstream %d/%d after %s (new links p50 %s p99 %s); "+
			"states %v; real gateway lists %d xiaozhi nodes, %d connected (%v); CPU over the stage: OpenClaw gateway %s (%.0f%% of a core), "+
			"xiaoclaw stack + simulated devices %s (%.0f%%); last link error %q",
			n, n-have, hello.Round(time.Millisecond), states[upstream.StateOnline], n, took.Round(time.Millisecond),
			pct(0.5), pct(0.99), states, len(count), conn, err, gwCPU, 100*gwCPU.Seconds()/took.Seconds(),
			ourCPU.Round(10*time.Millisecond), 100*ourCPU.Seconds()/took.Seconds(), lastErr)
		have = n
		if states[upstream.StateOnline] != n {
			b.Logf("ramp: degraded at %d devices: %s", n, fmt.Sprint(states))
			break
		}
	}
	b.ReportMetric(float64(have), "devices")
}
