package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// toolFailure is a tool that ran and failed (non-zero exit, HTTP error
// status): the caller gets a result with isError set.
type toolFailure struct{ msg string }

func (f *toolFailure) Error() string { return f.msg }

// TimeoutError is a call that overran its tool's timeout_ms.
type TimeoutError struct {
	Tool  string
	After time.Duration
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("tool %s timed out after %s", e.Tool, e.After)
}

// errOutputTooLarge ends a tool whose answer exceeds max_output_bytes.
var errOutputTooLarge = errors.New("output too large")

// inheritedEnv lists the only variables a subprocess tool inherits.
var inheritedEnv = []string{"PATH", "HOME", "LANG", "TZ"}

// runLocal runs one call of a config tool within its timeout and returns
// its text answer. args is the validated JSON object.
func runLocal(ctx context.Context, t *LocalTool, args json.RawMessage, env func(string) string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	var out string
	var err error
	switch t.Type {
	case toolTypeSubprocess:
		out, err = runSubprocess(ctx, t, args, env)
	case toolTypeHTTP:
		out, err = runHTTP(ctx, t, args)
	case toolTypeTCP:
		out, err = runTCP(ctx, t, args)
	default:
		err = fmt.Errorf("unknown tool type %q", t.Type)
	}
	if err != nil && (ctx.Err() == context.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded)) {
		return "", &TimeoutError{Tool: t.Name, After: t.timeout}
	}
	if errors.Is(err, errOutputTooLarge) {
		return "", &toolFailure{msg: fmt.Sprintf("tool %s answered more than %d bytes", t.Name, t.MaxOutputBytes)}
	}
	return out, err
}

// runSubprocess starts the executable without a shell, in a process group
// of its own, with a minimal environment, writes the arguments to its
// stdin and returns its stdout. At the timeout, or when stdout exceeds the
// limit, the whole group is killed; so is whatever the tool left running
// when it exits.
func runSubprocess(ctx context.Context, t *LocalTool, args json.RawMessage, env func(string) string) (string, error) {
	cmd := exec.CommandContext(ctx, t.argv[0], t.argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = []string{}
	for _, k := range inheritedEnv {
		if v := env(k); v != "" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	if env("PATH") == "" {
		cmd.Env = append(cmd.Env, "PATH=/usr/local/bin:/usr/bin:/bin")
	}
	cmd.Stdin = bytes.NewReader(append(args, '\n'))
	overflow := make(chan struct{})
	var once sync.Once
	stdout := &cappedBuffer{max: t.MaxOutputBytes, full: func() { once.Do(func() { close(overflow) }) }}
	stderr := &cappedBuffer{max: 4096}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.Cancel = func() error { return killGroup(cmd.Process) }
	// The pipes close this long after the process ended or ctx is done,
	// even if a grandchild still holds them.
	cmd.WaitDelay = 200 * time.Millisecond
	if err := cmd.Start(); err != nil {
		return "", &toolFailure{msg: fmt.Sprintf("tool %s: cannot start %s: %v", t.Name, t.argv[0], err)}
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var err error
	select {
	case err = <-waited:
	case <-overflow:
		_ = killGroup(cmd.Process)
		<-waited
		return "", errOutputTooLarge
	}
	_ = killGroup(cmd.Process) // nothing of the call outlives it
	if stdout.overflowed() {
		return "", errOutputTooLarge
	}
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return "", &toolFailure{msg: fmt.Sprintf("tool %s failed (%v): %s", t.Name, exitText(err), msg)}
	}
	return strings.TrimRight(stdout.String(), "\n"), nil
}

func exitText(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ProcessState.String()
	}
	return err.Error()
}

// killGroup kills the process group led by p.
func killGroup(p *os.Process) error {
	if p == nil {
		return nil
	}
	err := syscall.Kill(-p.Pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// cappedBuffer keeps at most max bytes; the first write beyond calls full.
type cappedBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	max  int
	over bool
	full func()
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	room := b.max - b.buf.Len()
	if len(p) > room {
		b.buf.Write(p[:max(room, 0)])
		if !b.over && b.full != nil {
			b.over = true
			b.full()
		}
		b.over = true
		return len(p), nil // keep draining: the group is being killed
	}
	b.buf.Write(p)
	return len(p), nil
}

func (b *cappedBuffer) overflowed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.over && b.full != nil
}

func (b *cappedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// httpClient is shared by every HTTP tool; each call carries its deadline.
var httpTransport = &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second}

// runHTTP posts the arguments as a JSON body, or with GET sends them as
// query parameters (strings as they are, other values as JSON), and returns
// the response body. A status of 400 or above is a tool failure.
func runHTTP(ctx context.Context, t *LocalTool, args json.RawMessage) (string, error) {
	var req *http.Request
	var err error
	if t.Method == "GET" {
		u, _ := url.Parse(t.URL)
		q := u.Query()
		var m map[string]json.RawMessage
		_ = json.Unmarshal(args, &m)
		for k, v := range m {
			var s string
			if len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &s) == nil {
				q.Set(k, s)
			} else {
				q.Set(k, string(v))
			}
		}
		u.RawQuery = q.Encode()
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	} else {
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, t.URL, bytes.NewReader(args))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	if err != nil {
		return "", fmt.Errorf("tool %s: %w", t.Name, err)
	}
	req.Header.Set("Accept", "application/json, text/plain, */*")
	resp, err := (&http.Client{Transport: httpTransport}).Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", &toolFailure{msg: fmt.Sprintf("tool %s: %v", t.Name, err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(t.MaxOutputBytes)+1))
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", &toolFailure{msg: fmt.Sprintf("tool %s: reading the response: %v", t.Name, err)}
	}
	if len(body) > t.MaxOutputBytes {
		return "", errOutputTooLarge
	}
	if resp.StatusCode >= 400 {
		return "", &toolFailure{msg: fmt.Sprintf("tool %s: HTTP %d: %s", t.Name, resp.StatusCode, strings.TrimSpace(string(body)))}
	}
	return string(body), nil
}

// runTCP connects, writes the arguments as one JSON line and returns what
// the peer sends until it closes the connection or ends a line.
func runTCP(ctx context.Context, t *LocalTool, args json.RawMessage) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", t.Address)
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", &toolFailure{msg: fmt.Sprintf("tool %s: %v", t.Name, err)}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.Write(append(append([]byte(nil), args...), '\n')); err != nil {
		return "", tcpErr(ctx, t, err)
	}
	r := bufio.NewReaderSize(io.LimitReader(conn, int64(t.MaxOutputBytes)+1), 4096)
	var out bytes.Buffer
	for {
		line, err := r.ReadSlice('\n')
		out.Write(line)
		if out.Len() > t.MaxOutputBytes {
			return "", errOutputTooLarge
		}
		if err == nil {
			break // one line: the answer
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) {
			break
		}
		return "", tcpErr(ctx, t, err)
	}
	return strings.TrimRight(out.String(), "\r\n"), nil
}

func tcpErr(ctx context.Context, t *LocalTool, err error) error {
	var ne net.Error
	if ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout() {
		return context.DeadlineExceeded
	}
	return &toolFailure{msg: fmt.Sprintf("tool %s: %v", t.Name, err)}
}
