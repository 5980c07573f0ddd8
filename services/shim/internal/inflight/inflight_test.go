package inflight

import (
	"sync"
	"testing"
)

func TestTenantShares(t *testing.T) {
	var tab Table
	a, b := tab.Tenant("acme"), tab.Tenant("beta")
	if tab.Tenant("acme") != a {
		t.Fatal("a tenant's counters must be the same on every call")
	}
	for i := 0; i < 3; i++ {
		if !a.Acquire(3) {
			t.Fatalf("acquire %d of 3 refused", i+1)
		}
	}
	if a.Acquire(3) {
		t.Fatal("a fourth slot of 3 was granted")
	}
	if a.InFlight() != 3 {
		t.Fatalf("in flight = %d after a refusal, want 3", a.InFlight())
	}
	if !b.Acquire(3) {
		t.Fatal("another tenant was refused while the first was full")
	}
	a.Release()
	if !a.Acquire(3) {
		t.Fatal("a released slot was not granted again")
	}
}

func TestDeviceShares(t *testing.T) {
	var tab Table
	a := tab.Tenant("acme")
	for i := range 2 {
		if !a.AcquireDevice("d1", 2) {
			t.Fatalf("slot %d of 2 refused", i+1)
		}
	}
	if a.AcquireDevice("d1", 2) {
		t.Fatal("a third slot of 2 was granted")
	}
	if !a.AcquireDevice("d2", 2) {
		t.Fatal("another device was refused")
	}
	a.ReleaseDevice("d1")
	a.ReleaseDevice("d1")
	a.ReleaseDevice("d2")
	if len(a.devices) != 0 {
		t.Fatalf("idle devices stay in the table: %v", a.devices)
	}
}

func TestConcurrentAcquireNeverExceedsTheLimit(t *testing.T) {
	var tab Table
	const limit, workers = 5, 16
	var wg sync.WaitGroup
	var mu sync.Mutex
	peak, now := 0, 0
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for i := 0; i < 2000; i++ {
				c := tab.Tenant("acme") // also races the table's additions
				if !c.Acquire(limit) {
					continue
				}
				mu.Lock()
				now++
				peak = max(peak, now)
				mu.Unlock()
				mu.Lock()
				now--
				mu.Unlock()
				c.Release()
			}
		})
	}
	wg.Wait()
	if peak > limit {
		t.Fatalf("peak in flight %d exceeds the limit %d", peak, limit)
	}
	if n := tab.Tenant("acme").InFlight(); n != 0 {
		t.Fatalf("in flight after all released = %d", n)
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	var tab Table
	tab.Tenant("acme")
	name := []byte("xc.acme.node.invoke")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c := tab.Tenant(string(name[3:7]))
			if c.Acquire(1 << 30) {
				c.Release()
			}
		}
	})
}
