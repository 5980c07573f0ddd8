package xzsim

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// maxToolsPage is the firmware's size budget for one tools/list result.
const maxToolsPage = 8000

// rpcRequest is the part of an incoming JSON-RPC message the firmware reads.
type rpcRequest struct {
	id     int64
	method string
	params map[string]json.RawMessage // nil when absent
}

// parseRequest applies the firmware's acceptance rules to one MCP payload
// and reports whether it is a request the device answers. Everything else is
// dropped without a reply: no jsonrpc "2.0", no string method,
// notifications, params that are not an object, and ids that are not
// numbers.
func parseRequest(payload []byte) (rpcRequest, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(payload, &m) != nil || m == nil {
		return rpcRequest{}, false
	}
	var version, method string
	if json.Unmarshal(m["jsonrpc"], &version) != nil || version != "2.0" {
		return rpcRequest{}, false
	}
	if raw := m["method"]; len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &method) != nil {
		return rpcRequest{}, false
	}
	if strings.HasPrefix(method, "notifications") {
		return rpcRequest{}, false
	}
	req := rpcRequest{method: method}
	if raw, ok := m["params"]; ok && string(raw) != "null" {
		if raw[0] != '{' || json.Unmarshal(raw, &req.params) != nil {
			return rpcRequest{}, false
		}
	}
	raw := m["id"]
	if len(raw) == 0 || !(raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') {
		return rpcRequest{}, false
	}
	var f float64
	if json.Unmarshal(raw, &f) != nil {
		return rpcRequest{}, false
	}
	req.id = int64(f) // the firmware reads the id as an int
	return req, true
}

// replyResult renders a JSON-RPC success response.
func replyResult(id int64, result []byte) []byte {
	b := make([]byte, 0, len(result)+48)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `,"result":`...)
	b = append(b, result...)
	return append(b, '}')
}

// replyError renders a JSON-RPC error the firmware's way: a message, no code.
func replyError(id int64, message string) []byte {
	msg, _ := json.Marshal(message)
	b := make([]byte, 0, len(msg)+56)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `,"error":{"message":`...)
	b = append(b, msg...)
	return append(b, "}}"...)
}

// toolsPage renders one tools/list page: tools from the one named cursor
// (from the start when empty), user-only tools only when withUser, as many
// as fit into the page budget; the first tool that does not fit becomes
// nextCursor. Like the firmware, a page that cannot hold even one tool (or
// a cursor that names no tool) is an error.
func (c *catalog) toolsPage(cursor string, withUser bool) ([]byte, string) {
	var b bytes.Buffer
	b.WriteString(`{"tools":[`)
	found := cursor == ""
	next := ""
	n := 0
	for _, t := range c.tools {
		if !found {
			if t.name != cursor {
				continue
			}
			found = true
		}
		if t.userOnly && !withUser {
			continue
		}
		if b.Len()+len(t.schema)+1+30 > maxToolsPage {
			next = t.name
			break
		}
		if n > 0 {
			b.WriteByte(',')
		}
		b.Write(t.schema)
		n++
	}
	if n == 0 && len(c.tools) > 0 {
		return nil, "Failed to add tool " + next + " because of payload size limit"
	}
	b.WriteByte(']')
	if next != "" {
		b.WriteString(`,"nextCursor":`)
		q, _ := json.Marshal(next)
		b.Write(q)
	}
	b.WriteByte('}')
	return b.Bytes(), ""
}

// callResult renders a successful tools/call result; isError is always false.
func callResult(r toolResult) []byte {
	text, _ := json.Marshal(resultText(r))
	b := make([]byte, 0, len(text)+64)
	b = append(b, `{"content":[{"type":"text","text":`...)
	b = append(b, text...)
	return append(b, `}],"isError":false}`...)
}
