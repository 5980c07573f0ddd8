// Package gopool runs short tasks on goroutines that outlive them. A new
// goroutine starts with a small stack and grows it, copying the stack each
// time it doubles, whenever a task calls deeper than that; a call path of
// JSON decoding, NATS publishing and span ends pays for two or three such
// copies per call when each call gets a fresh goroutine. A worker that runs
// one task after another keeps the stack it has grown (until the garbage
// collector finds it mostly unused and halves it).
package gopool

import (
	"time"
)

// DefaultIdle is how long a worker waits for its next task before it exits.
const DefaultIdle = 10 * time.Second

// Pool hands tasks to idle workers and starts a new one when none is idle;
// it bounds nothing, exactly like the go statement it replaces (callers
// bound their work themselves). The zero Pool is not usable; call New.
type Pool struct {
	tasks chan func()
	idle  time.Duration
}

// New returns a pool whose workers exit after idle without a task
// (DefaultIdle when idle <= 0).
func New(idle time.Duration) *Pool {
	if idle <= 0 {
		idle = DefaultIdle
	}
	return &Pool{tasks: make(chan func()), idle: idle}
}

// Go runs task on an idle worker, or on a new one.
func (p *Pool) Go(task func()) {
	select {
	case p.tasks <- task: // an idle worker took it
	default:
		go p.work(task)
	}
}

// work runs task, then whatever it is handed until it has been idle too long.
func (p *Pool) work(task func()) {
	task()
	timer := time.NewTimer(p.idle)
	defer timer.Stop()
	for {
		select {
		case task = <-p.tasks:
			task()
			timer.Reset(p.idle)
		case <-timer.C:
			return
		}
	}
}
