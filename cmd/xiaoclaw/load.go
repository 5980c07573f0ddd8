package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
)

// loadConfig describes one load run against a gateway.
type loadConfig struct {
	Nodes       []string        // node ids to spread calls over
	Command     string          // node command
	Params      json.RawMessage // command params
	Rate        int             // invokes per second; 0 = closed loop (each worker waits for its answer)
	Duration    time.Duration
	Conns       int // operator connections
	MaxInFlight int // open loop: calls beyond this are counted as dropped
	Timeout     time.Duration
}

// loadResult summarises a run. Latency is measured from the moment a call
// was due, not when it was sent, so a stalled system cannot hide its queue
// (no coordinated omission).
type loadResult struct {
	Sent, OK, Failed, Dropped int64
	Elapsed                   time.Duration
	P50, P90, P99, Max        time.Duration
	FirstError                string
}

func (r loadResult) String() string {
	s := fmt.Sprintf("sent=%d ok=%d failed=%d dropped=%d throughput=%.0f/s p50=%s p90=%s p99=%s max=%s",
		r.Sent, r.OK, r.Failed, r.Dropped, float64(r.OK)/r.Elapsed.Seconds(),
		r.P50.Round(time.Microsecond), r.P90.Round(time.Microsecond), r.P99.Round(time.Microsecond), r.Max.Round(time.Microsecond))
	if r.FirstError != "" {
		s += " first_error=" + r.FirstError
	}
	return s
}

// runLoad drives node.invoke through the given clients.
func runLoad(ctx context.Context, clients []*occlient.Client, cfg loadConfig) (loadResult, error) {
	if len(clients) == 0 || len(cfg.Nodes) == 0 {
		return loadResult{}, errors.New("load: need at least one connection and one node")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	var (
		mu        sync.Mutex
		lat       = make([]time.Duration, 0, 1<<16)
		res       loadResult
		inFlight  atomic.Int64
		n         atomic.Uint64
		wg        sync.WaitGroup
		firstErr  sync.Once
		timeoutMs = cfg.Timeout.Milliseconds()
	)
	one := func(due time.Time) {
		defer wg.Done()
		defer inFlight.Add(-1)
		i := n.Add(1)
		c := clients[int(i)%len(clients)]
		node := cfg.Nodes[int(i)%len(cfg.Nodes)]
		cctx, cancel := context.WithTimeout(ctx, cfg.Timeout+time.Second)
		_, err := c.Invoke(cctx, occlient.InvokeParams{NodeID: node, Command: cfg.Command, Params: cfg.Params, TimeoutMs: timeoutMs})
		cancel()
		d := time.Since(due)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			res.Failed++
			firstErr.Do(func() { res.FirstError = err.Error() })
			return
		}
		res.OK++
		lat = append(lat, d)
	}
	start := time.Now()
	end := start.Add(cfg.Duration)
	if cfg.Rate > 0 {
		interval := time.Second / time.Duration(cfg.Rate)
		for k := 0; ; k++ {
			due := start.Add(time.Duration(k) * interval)
			if !due.Before(end) || ctx.Err() != nil {
				break
			}
			if d := time.Until(due); d > 0 {
				time.Sleep(d) // pacing the generator, not waiting on a condition
			}
			res.Sent++
			if cfg.MaxInFlight > 0 && inFlight.Load() >= int64(cfg.MaxInFlight) {
				res.Dropped++
				continue
			}
			inFlight.Add(1)
			wg.Add(1)
			go one(due)
		}
	} else {
		workers := cfg.MaxInFlight
		if workers <= 0 {
			workers = len(clients)
		}
		var sent atomic.Int64
		var ww sync.WaitGroup
		for w := 0; w < workers; w++ {
			ww.Add(1)
			go func() {
				defer ww.Done()
				for time.Now().Before(end) && ctx.Err() == nil {
					sent.Add(1)
					inFlight.Add(1)
					wg.Add(1)
					one(time.Now())
				}
			}()
		}
		ww.Wait()
		res.Sent = sent.Load()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		i := int(p*float64(len(lat))+0.5) - 1
		return lat[max(0, min(i, len(lat)-1))]
	}
	res.P50, res.P90, res.P99 = pct(0.50), pct(0.90), pct(0.99)
	if len(lat) > 0 {
		res.Max = lat[len(lat)-1]
	}
	return res, nil
}

func loadCommand(env func(string) string, stdout io.Writer) *cobra.Command {
	f := &operatorFlags{}
	cfg := loadConfig{}
	var params string
	cmd := &cobra.Command{
		Use:   "load NODE [NODE...]",
		Short: "Drive node.invoke at a fixed rate (or closed loop) and report latency percentiles and throughput",
		Long: `load opens --conns operator connections to the gateway and calls node.invoke on the given
nodes, round robin. With --rate it is open loop: calls start on schedule whether or not earlier
ones finished, and latency counts from the scheduled start. Without --rate, --in-flight workers
each call back to back (closed loop, for peak throughput).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !json.Valid([]byte(params)) {
				return &exitError{exitUsage, fmt.Errorf("--params is not valid JSON")}
			}
			cfg.Params = json.RawMessage(params)
			cfg.Nodes = args
			ctx := cmd.Context()
			var clients []*occlient.Client
			defer func() {
				for _, c := range clients {
					c.Close()
				}
			}()
			for range cfg.Conns {
				dctx, cancel := context.WithTimeout(ctx, f.timeout)
				c, err := f.dial(dctx, nil)
				cancel()
				if err != nil {
					return err
				}
				clients = append(clients, c)
			}
			res, err := runLoad(ctx, clients, cfg)
			if err != nil {
				return err
			}
			if f.json {
				return json.NewEncoder(stdout).Encode(res)
			}
			fmt.Fprintln(stdout, res)
			if res.OK == 0 {
				return &exitError{exitGatewayErr, errors.New("no call succeeded")}
			}
			return nil
		},
	}
	f.register(cmd, env)
	cmd.Flags().StringVar(&cfg.Command, "command", "mcp.tools.call", "node command")
	cmd.Flags().StringVar(&params, "params", `{"name":"self.get_device_status","arguments":{}}`, "command params (JSON)")
	cmd.Flags().IntVar(&cfg.Rate, "rate", 0, "invokes per second (open loop); 0 = closed loop")
	cmd.Flags().DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to run")
	cmd.Flags().IntVar(&cfg.Conns, "conns", 4, "operator connections")
	cmd.Flags().IntVar(&cfg.MaxInFlight, "in-flight", 64, "closed loop: workers; open loop: calls in flight before new ones are dropped")
	cmd.Flags().DurationVar(&cfg.Timeout, "invoke-timeout", 10*time.Second, "node.invoke timeoutMs")
	return cmd
}
