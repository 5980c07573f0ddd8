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
	ids := make(chan string)
	seen := map[string]bool{}
	const tasks = 200
	for range tasks {
		p.Go(func() { ids <- goroutineID() })
		seen[<-ids] = true
	}
	// One task at a time: a worker is idle again a moment after its task,
	// so a handful of workers serve them all (one each would mean no reuse).
	if len(seen) > tasks/4 {
		t.Fatalf("%d tasks ran on %d goroutines", tasks, len(seen))
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
