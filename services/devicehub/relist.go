package devicehub

import (
	"context"
	"unique"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub/internal/mcpclient"
)

// methodToolsListChanged is the MCP notification a server sends when its
// catalog changed.
const methodToolsListChanged = "notifications/tools/list_changed"

// relister re-reads a session's catalog after list_changed. At most one
// re-list runs per session; notifications that arrive meanwhile collapse
// into one more, so a chatty device costs one tools/list at a time.
type relister struct {
	running bool
	again   bool
}

// requestRelist starts a re-list of an online MCP session, or marks one
// due if a re-list is running. Before the session is online, discovery is
// still listing the tools and nothing is done.
func (s *session) requestRelist() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.hasMCP || !s.online || s.ended {
		return
	}
	if s.relist.running {
		s.relist.again = true
		return
	}
	s.relist.running = true
	go s.runRelist()
}

func (s *session) runRelist() {
	cfg := s.hub.cfg
	for {
		d, err := s.mcp.ListTools(func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), cfg.CallTimeout)
		}, mcpclient.DiscoverOptions{
			WithUserTools: cfg.WithUserTools, MaxCatalogBytes: cfg.MaxCatalogBytes,
			MaxPages: cfg.MaxToolPages, ClientVersion: cfg.Version,
		})
		s.mu.Lock()
		if s.ended {
			s.relist = relister{}
			s.mu.Unlock()
			return
		}
		if err != nil {
			s.hub.log.Warn("devicehub: re-list after tools/list_changed failed; keeping the last catalog",
				append(s.logAttrs(), "err", err)...)
		} else if h := unique.Make(string(d.Tools)); s.tools == nil || *s.tools != h {
			s.tools = &h
			ev := s.event(wire.DeviceTools)
			ev.Tools = d.Tools
			s.hub.publish(s.key, ev) // under s.mu: ordered before a later offline
		}
		if !s.relist.again {
			s.relist.running = false
			s.mu.Unlock()
			return
		}
		s.relist.again = false
		s.mu.Unlock()
	}
}
