package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/go-chi/chi/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"

	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/httpapi"
)

// NodeApprover approves tools that nodes gained after their first catalog
// (wire.NodeRecord.PendingTools).
type NodeApprover interface {
	// ApproveTools approves the named pending tools of a node, or all of
	// them when tools is empty. tenancy.ErrNotFound: no such node;
	// tenancy.ErrInvalid: a named tool is not pending.
	ApproveTools(ctx context.Context, tenant, nodeID string, tools []string) (ApproveToolsResponse, error)
}

// ApproveToolsRequest is the body of POST
// /api/tenants/{tenant}/nodes/{node}/approve-tools; no tools approves every
// pending one.
type ApproveToolsRequest struct {
	Tools []string `json:"tools,omitempty"`
}

// ApproveToolsResponse names what was approved and what still waits.
type ApproveToolsResponse struct {
	NodeID       string   `json:"nodeId"`
	Approved     []string `json:"approved"`
	Pending      []string `json:"pending"`
	ToolsVersion uint64   `json:"toolsVersion"`
}

func (a *api) approveTools(r *http.Request) (int, any, error) {
	if a.cfg.Nodes == nil {
		return 0, nil, httpapi.Fail(httpapi.CodeNotFound, "node approvals are not available on this server")
	}
	var req ApproveToolsRequest
	if err := a.decode(r, &req); err != nil {
		return 0, nil, err
	}
	node := chi.URLParam(r, "node")
	if wire.ValidNodeID(node) != nil {
		return 0, nil, invalid("invalid node id %q", node)
	}
	res, err := a.cfg.Nodes.ApproveTools(r.Context(), tenantParam(r), node, req.Tools)
	return http.StatusOK, res, err
}

// KVNodeApprover approves tools in the node registry bucket
// (wire.BucketNodes) with compare-and-set, so a concurrent catalog change
// by a shim is never lost.
func KVNodeApprover(js jetstream.JetStream) NodeApprover { return kvApprover{js} }

type kvApprover struct{ js jetstream.JetStream }

// maxApproveAttempts bounds the retries when a shim writes the record meanwhile.
const maxApproveAttempts = 16

func (k kvApprover) ApproveTools(ctx context.Context, tenant, nodeID string, tools []string) (ApproveToolsResponse, error) {
	kv, err := k.js.KeyValue(ctx, wire.BucketNodes)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return ApproveToolsResponse{}, fmt.Errorf("node %q: %w", nodeID, tenancy.ErrNotFound)
	}
	if err != nil {
		return ApproveToolsResponse{}, fmt.Errorf("node registry: %w", err)
	}
	key := wire.NodeKey(tenant, nodeID)
	for range maxApproveAttempts {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return ApproveToolsResponse{}, fmt.Errorf("node %q: %w", nodeID, tenancy.ErrNotFound)
		}
		if err != nil {
			return ApproveToolsResponse{}, fmt.Errorf("node %q: %w", nodeID, err)
		}
		var rec wire.NodeRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return ApproveToolsResponse{}, fmt.Errorf("node %q: record: %w", nodeID, err)
		}
		approved, kept := tools, []string(nil)
		if len(tools) == 0 {
			approved = rec.PendingTools
		} else {
			for _, t := range tools {
				if !slices.Contains(rec.PendingTools, t) {
					return ApproveToolsResponse{}, fmt.Errorf("%w: tool %q of node %s is not awaiting approval", tenancy.ErrInvalid, t, nodeID)
				}
			}
			for _, t := range rec.PendingTools {
				if !slices.Contains(tools, t) {
					kept = append(kept, t)
				}
			}
		}
		res := ApproveToolsResponse{NodeID: nodeID, Approved: nonNil(approved), Pending: nonNil(kept), ToolsVersion: rec.ToolsVersion}
		if len(approved) == 0 {
			return res, nil
		}
		rec.PendingTools = kept
		data, err := json.Marshal(rec)
		if err != nil {
			return ApproveToolsResponse{}, err
		}
		_, err = kv.Update(ctx, key, data, e.Revision())
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // a shim wrote the record meanwhile: read it again
		}
		if err != nil {
			return ApproveToolsResponse{}, fmt.Errorf("node %q: %w", nodeID, err)
		}
		return res, nil
	}
	return ApproveToolsResponse{}, fmt.Errorf("node %q: gave up after %d conflicting writes", nodeID, maxApproveAttempts)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
