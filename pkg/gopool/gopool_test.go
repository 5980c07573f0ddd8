package gopool_test

import (
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/gopool"
)

func TestTasksRunConcurrentlyWithoutBound(t *testing.T) {
	p := gopool.New(time.Minute)
	const n = 200
	release := make(chan struct{})
	var started, done sync.WaitGroup
	started.Add(n)
	done.Add(n)
	for range n {
		p.Go(func() {
			started.Done()
			<-release // every task holds its worker until all have started
			done.Done()
		})
	}
	started.Wait()
	close(release)
	done.Wait()
}

// goroutineID reads the running goroutine's id from its stack header
// ("goroutine 42 [running]:"), to tell workers apart.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := strings.Cut(strings.TrimPrefix(string(buf), "goroutine "), " ")
	return id
}

func TestWorkersAreReused(t *testing.T) {
	p := gopool.New(time.Minute)
	ids := make(chan string, 1)
	p.Go(func() { ids <- goroutineID() })
	worker := <-ids
	// One task at a time: each waits for the worker to be idle again (Go
	// would start a new goroutine while it is not), and runs on it.
	for i := range 50 {
		eventually.True(t, "an idle worker", func() bool { return p.TryGo(func() { ids <- goroutineID() }) })
		if id := <-ids; id != worker {
			t.Fatalf("task %d ran on goroutine %s, not on the idle worker %s", i, id, worker)
		}
	}
}

func TestIdleWorkersExit(t *testing.T) {
	base := runtime.NumGoroutine()
	p := gopool.New(20 * time.Millisecond)
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		p.Go(wg.Done)
	}
	wg.Wait()
	eventually.True(t, "idle workers to exit", func() bool { return runtime.NumGoroutine() <= base })
}
