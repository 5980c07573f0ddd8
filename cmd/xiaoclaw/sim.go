package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
)

func simCommand(env func(string) string, stdout io.Writer) *cobra.Command {
	var (
		fc        xzsim.FleetConfig
		seed      uint
		interval  time.Duration
		logLevel  string
		logFormat string
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run simulated XiaoZhi devices that behave like the firmware (WebSocket + MCP)",
		Long: `sim connects --count simulated XiaoZhi devices to a devicehub and keeps them connected
(reconnecting after a drop) until interrupted. Each answers MCP like the firmware: numeric ids,
paged tools/list, built-in tools such as self.audio_speaker.set_volume with the firmware's errors.
Device MACs are 02:SS:II:II:II:II (SS = --seed, II = index), so node ids are stable across runs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(os.Stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			if fc.Device.Token == "" && fc.Device.OTAURL == "" {
				return &exitError{exitUsage, fmt.Errorf("no device token: pass --token or set XIAOCLAW_DEVICE_TOKEN (xiaoclaw dev prints one), or boot through --ota")}
			}
			if fc.Count < 1 {
				return &exitError{exitUsage, fmt.Errorf("--count must be at least 1")}
			}
			fc.Seed = uint32(seed)
			shown := min(fc.Count, 5)
			where := fc.Device.URL
			if fc.Device.OTAURL != "" {
				where = "OTA " + fc.Device.OTAURL
			}
			fmt.Fprintf(stdout, "simulating %d devices via %s; node ids:", fc.Count, where)
			for i := range shown {
				dev, _ := wire.CanonicalDevice(xzsim.MAC(fc.Seed, i))
				fmt.Fprintf(stdout, " %s", wire.DeviceNodeID(dev))
			}
			if fc.Count > shown {
				fmt.Fprint(stdout, " …")
			}
			fmt.Fprintln(stdout)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return xzsim.Run(ctx, fc, log, interval)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&fc.Device.URL, "url", envOr(env, "XIAOCLAW_DEVICE_URL", "ws://127.0.0.1:8000/xiaozhi/v1/"), "devicehub WebSocket URL (env XIAOCLAW_DEVICE_URL)")
	fl.StringVar(&fc.Device.Token, "token", env("XIAOCLAW_DEVICE_TOKEN"), "device token (env XIAOCLAW_DEVICE_TOKEN)")
	fl.StringVar(&fc.Device.OTAURL, "ota", "", "boot through this OTA URL like the firmware (e.g. http://127.0.0.1:8000/xiaozhi/ota/); the reply picks WebSocket or MQTT and the credentials")
	fl.IntVar(&fc.Count, "count", 1, "number of devices")
	fl.UintVar(&seed, "seed", 0, "identity seed (0-255): fleets with different seeds never share a MAC")
	fl.IntVar(&fc.Device.ExtraTools, "tools", 0, "extra board tools per device (about 25 fit a tools/list page)")
	fl.DurationVar(&fc.Device.Latency, "latency", 0, "delay of every tools/call reply")
	fl.IntVar(&fc.Concurrency, "concurrency", 64, "simultaneous connection attempts")
	fl.DurationVar(&interval, "stats", 10*time.Second, "log fleet statistics this often (0: never)")
	fl.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&logFormat, "log-format", "text", "text or json")
	return cmd
}
