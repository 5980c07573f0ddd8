package gopool

// TryGo hands task to a worker already waiting for one and reports whether
// one was: the half of Go that reuses a worker, for tests to await.
func (p *Pool) TryGo(task func()) bool {
	select {
	case p.tasks <- task:
		return true
	default:
		return false
	}
}
