package eventually_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
)

func TestTrueReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	go func() {
		for range 3 {
			n.Add(1)
		}
	}()
	eventually.True(t, "three increments", func() bool { return n.Load() == 3 })
	ch := make(chan struct{})
	go close(ch)
	eventually.Closed(t, ch, "the channel to close")
}

// failRecorder records a Fatalf without ending the test.
type failRecorder struct {
	testing.TB
	failed bool
	msg    string
}

func (f *failRecorder) Helper() {}

func (f *failRecorder) Fatalf(format string, args ...any) {
	f.failed = true
	f.msg = format
	panic(f)
}

func TestWithinFailsAfterTheDeadline(t *testing.T) {
	rec := &failRecorder{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil && r != rec {
				panic(r)
			}
		}()
		eventually.Within(rec, 30*time.Millisecond, "a condition that never holds", func() bool { return false })
	}()
	if !rec.failed {
		t.Fatal("Within returned without failing for a condition that never holds")
	}
}

func TestUntilReportsWhetherTheConditionHeld(t *testing.T) {
	var n atomic.Int32
	if !eventually.Until(eventually.Limit, func() bool { return n.Add(1) == 3 }) {
		t.Fatal("Until gave up on a condition that held at the third look")
	}
	if eventually.Until(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("Until reported a condition that never holds as held")
	}
}
