// Package inflight counts the invokes a shim replica runs, per tenant and
// per device, so that a limit can give every tenant its own share of the
// replica: one tenant with all its calls hanging on silent devices then
// takes only its share, never the slots of the others.
//
// Admission is one atomic add per tenant on the hot path; the tenant table
// is copy-on-write (tenants are few and rarely new), and a tenant's device
// table holds only devices with a call in flight.
package inflight

import (
	"strings"
	"sync"
	"sync/atomic"
)

// Table holds the counters of every tenant seen. The zero value is ready.
type Table struct {
	mu      sync.Mutex // serialises additions to tenants
	tenants atomic.Pointer[map[string]*Tenant]
}

// Tenant returns the counters of a tenant, adding them on first use.
func (t *Table) Tenant(name string) *Tenant {
	if m := t.tenants.Load(); m != nil {
		if c, ok := (*m)[name]; ok {
			return c
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.tenants.Load()
	if old != nil {
		if c, ok := (*old)[name]; ok {
			return c
		}
	}
	next := make(map[string]*Tenant, 1+lenOf(old))
	if old != nil {
		for k, v := range *old {
			next[k] = v
		}
	}
	// The name may be a slice of a message's subject: keep a copy of its own.
	c := &Tenant{devices: map[string]int{}}
	next[strings.Clone(name)] = c
	t.tenants.Store(&next)
	return c
}

func lenOf(m *map[string]*Tenant) int {
	if m == nil {
		return 0
	}
	return len(*m)
}

// Tenant counts one tenant's invokes in flight, in all and per device.
type Tenant struct {
	n atomic.Int64

	mu      sync.Mutex
	devices map[string]int // only devices with calls in flight
}

// Acquire takes one of the tenant's max slots; false when all are taken.
// A true answer must be followed by Release.
func (c *Tenant) Acquire(max int) bool {
	if c.n.Add(1) > int64(max) {
		c.n.Add(-1)
		return false
	}
	return true
}

// Release gives back a slot taken by Acquire.
func (c *Tenant) Release() { c.n.Add(-1) }

// InFlight is the number of slots taken now.
func (c *Tenant) InFlight() int { return int(c.n.Load()) }

// AcquireDevice takes one of max slots of the device; false when all are
// taken. device must be a string that outlives the call (it becomes a map
// key): the node registry's copy, not a slice of a request. A true answer
// must be followed by ReleaseDevice.
func (c *Tenant) AcquireDevice(device string, max int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.devices[device]
	if n >= max {
		return false
	}
	c.devices[device] = n + 1
	return true
}

// ReleaseDevice gives back a slot taken by AcquireDevice.
func (c *Tenant) ReleaseDevice(device string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.devices[device]; n > 1 {
		c.devices[device] = n - 1
	} else {
		delete(c.devices, device)
	}
}

// DeviceInFlight is the number of the device's slots taken now.
func (c *Tenant) DeviceInFlight(device string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.devices[device]
}
