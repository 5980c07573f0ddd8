// Package eventually is the tests' wait for a condition that another
// goroutine, process or server makes true: it polls the condition until it
// holds and fails the test, naming what it waited for, once a deadline has
// passed. Limit is the one deadline the test packages share for conditions
// that normally hold within milliseconds, so a slow machine is given the
// same room everywhere and no test sleeps for a fixed time.
package eventually

import (
	"testing"
	"time"
)

// Limit bounds a wait for a condition that normally holds within
// milliseconds.
const Limit = 10 * time.Second

// pollEvery is the pause between two looks at a condition.
const pollEvery = 5 * time.Millisecond

// True polls cond until it holds, failing t after Limit.
func True(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Within(t, Limit, what, cond)
}

// Within polls cond until it holds, failing t after d.
func Within(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Until(d, cond) {
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// Until polls cond until it holds or d has passed, and reports whether it
// held: for a caller whose failure names what cond last saw.
func Until(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollEvery)
	}
	return true
}

// Closed waits until ch is closed (or receives), failing t after Limit.
func Closed(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(Limit):
		t.Fatalf("timed out after %v waiting for %s", Limit, what)
	}
}
