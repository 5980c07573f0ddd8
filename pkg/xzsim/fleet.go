package xzsim

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// MAC returns the MAC address of device index i of a fleet with seed: a
// locally administered unicast address 02:SS:II:II:II:II, where SS is the
// low byte of the seed and II the index. Devices of one fleet never
// collide; fleets whose seeds differ in the low byte never collide either.
func MAC(seed uint32, i int) string {
	var b [6]byte
	b[0] = 0x02
	b[1] = byte(seed)
	binary.BigEndian.PutUint32(b[2:], uint32(i))
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4], b[5])
}

// ClientID returns the Client-Id (a version 4 UUID) of device index i of a
// fleet with seed; deterministic, so a restarted fleet keeps its identities.
func ClientID(seed uint32, i int) string {
	var in [12]byte
	binary.BigEndian.PutUint32(in[0:], seed)
	binary.BigEndian.PutUint64(in[4:], uint64(i))
	return uuidFrom(in[:])
}

// uuidFrom derives a version 4 (random-format) UUID from seed bytes.
func uuidFrom(seed []byte) string {
	h := sha256.Sum256(seed)
	h[6] = h[6]&0x0f | 0x40
	h[8] = h[8]&0x3f | 0x80
	s := hex.EncodeToString(h[:16])
	return s[0:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:32]
}

// FleetConfig describes N devices of one model.
type FleetConfig struct {
	// Device is the template of every device: URL, Token, ExtraTools,
	// Latency, ... MAC and ClientID are set per device from Seed and index.
	Device Config
	// Count is the number of devices (at least 1).
	Count int
	// Seed makes the identities of this fleet distinct from another's.
	Seed uint32
	// Concurrency bounds simultaneous connection attempts; default 64.
	Concurrency int
	// ReconnectDelay is how long Run waits before reconnecting a device
	// whose connection ended; default 1 s (the firmware reconnects on the
	// next wake word, so any value is realistic).
	ReconnectDelay time.Duration
}

func (c *FleetConfig) setDefaults() {
	if c.Concurrency <= 0 {
		c.Concurrency = 64
	}
	if c.ReconnectDelay <= 0 {
		c.ReconnectDelay = time.Second
	}
}

// Fleet is a set of simulated devices sharing one tool catalog.
type Fleet struct {
	cfg     FleetConfig
	devices []*Device
}

// NewFleet builds the devices of cfg without connecting them.
func NewFleet(cfg FleetConfig) (*Fleet, error) {
	cfg.setDefaults()
	if cfg.Count < 1 {
		return nil, errors.New("xzsim: fleet Count must be at least 1")
	}
	tmpl := cfg.Device
	tmpl.MAC = MAC(cfg.Seed, 0)
	tmpl.setDefaults()
	if err := tmpl.Validate(); err != nil {
		return nil, err
	}
	if tmpl.HTTPClient == nil {
		tmpl.HTTPClient = newDialClient()
	}
	cat := newCatalog(tmpl.ExtraTools)
	f := &Fleet{cfg: cfg, devices: make([]*Device, cfg.Count)}
	for i := range f.devices {
		dc := tmpl
		dc.MAC = MAC(cfg.Seed, i)
		dc.ClientID = ClientID(cfg.Seed, i)
		f.devices[i] = newDevice(dc, cat)
	}
	return f, nil
}

// StartFleet builds the fleet and connects every device; on the first
// failure it closes the devices already connected and returns the error.
func StartFleet(ctx context.Context, cfg FleetConfig) (*Fleet, error) {
	f, err := NewFleet(cfg)
	if err != nil {
		return nil, err
	}
	if err := f.ConnectAll(ctx); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// ConnectAll connects every device, Concurrency at a time.
func (f *Fleet) ConnectAll(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	sem := make(chan struct{}, f.cfg.Concurrency)
	for _, d := range f.devices {
		sem <- struct{}{}
		if ctx.Err() != nil {
			<-sem
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := d.Connect(ctx); err != nil {
				errOnce.Do(func() { firstErr = fmt.Errorf("device %s: %w", d.MAC(), err); cancel() })
			}
		}()
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return firstErr
}

// Devices returns the devices in index order.
func (f *Fleet) Devices() []*Device { return f.devices }

// Close closes every device's connection (normal closure) and waits.
func (f *Fleet) Close() {
	var wg sync.WaitGroup
	sem := make(chan struct{}, f.cfg.Concurrency)
	for _, d := range f.devices {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			d.Close()
		}()
	}
	wg.Wait()
}

// Stats counts a running fleet's devices.
type Stats struct {
	Connected  int64 // devices with a session now
	Connects   int64 // successful connects so far
	Failures   int64 // failed connection attempts so far
	Disconnect int64 // sessions that ended so far
	Calls      int64 // tools/call requests answered so far
}

// Run keeps a fleet connected until ctx is done: it connects every device
// (Concurrency at a time), reconnects a device ReconnectDelay after its
// connection ends or an attempt fails, and logs Stats every interval (0:
// never). It returns nil when ctx ends, after closing every connection.
func Run(ctx context.Context, cfg FleetConfig, log *slog.Logger, interval time.Duration) error {
	f, err := NewFleet(cfg)
	if err != nil {
		return err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var st struct{ connected, connects, failures, disconnects atomic.Int64 }
	sem := make(chan struct{}, f.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, d := range f.devices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				sem <- struct{}{}
				err := d.Connect(ctx)
				<-sem
				if err != nil {
					if ctx.Err() == nil {
						st.failures.Add(1)
						log.Debug("xzsim: connect failed", "mac", d.MAC(), "err", err)
					}
				} else {
					st.connects.Add(1)
					st.connected.Add(1)
					select {
					case <-d.Done():
					case <-ctx.Done():
						d.Close()
					}
					st.connected.Add(-1)
					st.disconnects.Add(1)
				}
				t := time.NewTimer(f.cfg.ReconnectDelay)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
				}
			}
		}()
	}
	stats := func() Stats {
		var calls int64
		for _, d := range f.devices {
			calls += d.Calls()
		}
		return Stats{Connected: st.connected.Load(), Connects: st.connects.Load(), Failures: st.failures.Load(),
			Disconnect: st.disconnects.Load(), Calls: calls}
	}
	if interval > 0 {
		tick := time.NewTicker(interval)
		defer tick.Stop()
	loop:
		for {
			select {
			case <-tick.C:
				s := stats()
				log.Info("xzsim: fleet", "devices", len(f.devices), "connected", s.Connected, "connects", s.Connects,
					"failures", s.Failures, "disconnects", s.Disconnect, "calls", s.Calls)
			case <-ctx.Done():
				break loop
			}
		}
	}
	wg.Wait()
	return nil
}
