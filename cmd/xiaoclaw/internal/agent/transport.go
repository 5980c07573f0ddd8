package agent

import (
	"context"
	"io"
	"log/slog"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
)

// deviceTransport carries the MCP server's JSON-RPC over one XiaoZhi
// device session: each message travels in the device protocol's mcp
// envelope. It is both the mcp.Transport and its one Connection.
type deviceTransport struct {
	dev  *xzsim.Device
	log  *slog.Logger
	in   chan []byte
	done chan struct{}
	once sync.Once
}

func newDeviceTransport(log *slog.Logger) *deviceTransport {
	return &deviceTransport{log: log, in: make(chan []byte, 64), done: make(chan struct{})}
}

// deliver is the device's MCP callback: it runs on the connection's reader
// and hands every payload to Read (back-pressure: it blocks when full).
func (t *deviceTransport) deliver(payload []byte) {
	p := append([]byte(nil), payload...)
	select {
	case t.in <- p:
	case <-t.done:
	}
}

func (t *deviceTransport) Connect(context.Context) (mcp.Connection, error) { return t, nil }

// Read returns the next message from the hub; io.EOF once the session ended.
func (t *deviceTransport) Read(ctx context.Context) (jsonrpc.Message, error) {
	for {
		select {
		case p := <-t.in:
			msg, err := jsonrpc.DecodeMessage(p)
			if err != nil {
				t.log.Debug("agent: unreadable JSON-RPC message dropped", "err", err)
				continue
			}
			return msg, nil
		case <-t.dev.Done():
			return nil, io.EOF
		case <-t.done:
			return nil, io.EOF
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (t *deviceTransport) Write(ctx context.Context, msg jsonrpc.Message) error {
	b, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	return t.dev.SendMCP(ctx, b)
}

// Close ends the device session.
func (t *deviceTransport) Close() error {
	t.once.Do(func() {
		close(t.done)
		_ = t.dev.Close()
	})
	return nil
}

func (t *deviceTransport) SessionID() string { return t.dev.SessionID() }
