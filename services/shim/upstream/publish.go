package upstream

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
)

// Retry of a node.pluginTools.update that failed for a passing reason (the
// answer timed out), as OpenClaw's node host retries its publications.
const (
	publishRetryMin = 250 * time.Millisecond
	publishRetryMax = 5 * time.Second
)

// Events a link sends or receives about its own node.
const (
	eventPairResolved  = "node.pair.resolved"  // the upstream approved (or rejected) the node
	eventPresenceAlive = "node.presence.alive" // the node says it is there
	presenceConnect    = "connect"             // NodePresenceAlivePayload.trigger
)

// catalogState is what a link publishes as agent tools: the device's
// current descriptors and what the upstream already has on which
// connection. A change waits ToolsDebounce, so that a burst of catalog
// updates (a device listing its tools page by page, an admin approving
// several) costs one request.
type catalogState struct {
	rawSum   [sha256.Size]byte // of the catalog params were made from
	params   []byte            // node.pluginTools.update params; nil until the first catalog
	count    int               // descriptors in params
	debounce *time.Timer
	sentTo   *occlient.Client // connection that has sent (or needs nothing)
	sent     []byte
	running  bool   // a publishTools loop is at work
	resend   uint64 // counts republish calls, so one during a send is not lost
}

// setCatalog takes the device's MCP catalog (its node record's tools); a
// change is published after the debounce. It never blocks.
func (l *link) setCatalog(tools json.RawMessage) {
	sum := sha256.Sum256(tools)
	l.catMu.Lock()
	same := l.cat.params != nil && sum == l.cat.rawSum
	l.catMu.Unlock()
	if same { // most record updates leave the catalog as it is
		return
	}
	desc := pluginToolsOf(tools)
	params, err := json.Marshal(pluginToolsParams{Tools: desc})
	if err != nil {
		return
	}
	l.catMu.Lock()
	defer l.catMu.Unlock()
	l.cat.rawSum = sum
	if bytes.Equal(params, l.cat.params) {
		return
	}
	l.cat.params, l.cat.count = params, len(desc)
	if l.cat.debounce == nil {
		l.cat.debounce = time.AfterFunc(l.cfg.timing.ToolsDebounce, l.publishTools)
		return
	}
	l.cat.debounce.Reset(l.cfg.timing.ToolsDebounce)
}

// republish forgets what the current connection has, so that the next
// publishTools sends the catalog again (after approval, the upstream
// answers with the tools it now admits).
func (l *link) republish() {
	l.catMu.Lock()
	l.cat.sentTo = nil
	l.cat.resend++
	l.catMu.Unlock()
	go l.publishTools()
}

// publishTools brings the upstream's copy of the catalog up to date on the
// current connection; one loop runs at a time per link and it ends when
// there is nothing left to send or no connection.
func (l *link) publishTools() {
	l.catMu.Lock()
	if l.cat.running {
		l.catMu.Unlock()
		return
	}
	l.cat.running = true
	l.catMu.Unlock()
	retry := publishRetryMin
	for {
		l.mu.Lock()
		c := l.conn
		l.mu.Unlock()
		l.catMu.Lock()
		want, resend := l.cat.params, l.cat.resend
		switch {
		case c == nil || want == nil:
			l.cat.running = false
			l.catMu.Unlock()
			return
		case c == l.cat.sentTo && bytes.Equal(want, l.cat.sent):
			l.cat.running = false
			l.catMu.Unlock()
			return
		case c != l.cat.sentTo && l.cat.count == 0:
			// A new connection starts without plugin tools: nothing to clear.
			l.cat.sentTo, l.cat.sent, l.cat.running = c, want, false
			l.catMu.Unlock()
			return
		}
		l.catMu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), resultTimeout)
		res, err := c.Call(ctx, methodPluginToolsUpdate, json.RawMessage(want))
		cancel()
		var oe *occlient.Error
		switch {
		case err == nil:
			var ok struct {
				Tools []json.RawMessage `json:"tools"`
			}
			_ = json.Unmarshal(res, &ok)
			l.published(c, want, resend)
			l.status.update(func(st *Status) { st.Tools, st.ToolsError = len(ok.Tools), "" })
			retry = publishRetryMin
		case errors.As(err, &oe):
			// Refused (an upstream without the method, or params it does
			// not take): sending the same again would not help.
			l.published(c, want, resend)
			l.status.update(func(st *Status) { st.Tools, st.ToolsError = 0, oe.Error() })
			l.cfg.log.Info("upstream refused the plugin tools", "upstream", l.cfg.upstream.Name,
				"node", l.cfg.node.NodeID, "err", oe.Error())
		default:
			select {
			case <-c.Done(): // the next connection publishes afresh
			case <-time.After(retry):
				retry = min(2*retry, publishRetryMax)
			}
		}
	}
}

// published records what c has, unless a republish came meanwhile.
func (l *link) published(c *occlient.Client, params []byte, resend uint64) {
	l.catMu.Lock()
	if l.cat.resend == resend {
		l.cat.sentTo, l.cat.sent = c, params
	}
	l.catMu.Unlock()
}

// presence is the payload of node.presence.alive for this node.
func (l *link) presence() json.RawMessage {
	p := map[string]any{"trigger": presenceConnect, "sentAtMs": time.Now().UnixMilli(), "platform": Platform}
	if n := l.cfg.node; n.DisplayName != "" {
		p["displayName"] = n.DisplayName
	}
	if v := l.cfg.node.Version; v != "" {
		p["version"] = v
	}
	if f := l.cfg.node.DeviceFamily; f != "" {
		p["deviceFamily"] = f
	}
	b, _ := json.Marshal(p)
	return b
}
