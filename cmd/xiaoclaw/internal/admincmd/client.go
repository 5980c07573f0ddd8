package admincmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// client calls the admin API.
type client struct {
	base  string // scheme://host[:port], no trailing slash
	token string
	http  *http.Client
}

// APIError is an error answer of the admin API.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("server answered %d %s: %s", e.Status, e.Code, e.Message)
}

// newClient accepts the gateway's http(s) or ws(s) URL.
func newClient(server, token string, timeout time.Duration) (*client, error) {
	u, err := url.Parse(server)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("--server %q is not a URL such as http://127.0.0.1:18789", server)
	}
	switch u.Scheme {
	case "http", "https":
	case "ws":
		u.Scheme = "http"
	case "wss":
		u.Scheme = "https"
	default:
		return nil, fmt.Errorf("--server %q: scheme must be http, https, ws or wss", server)
	}
	if token == "" {
		return nil, fmt.Errorf("no token: pass --token or set XIAOCLAW_TOKEN")
	}
	return &client{base: u.Scheme + "://" + u.Host + strings.TrimSuffix(u.Path, "/"), token: token,
		http: &http.Client{Timeout: timeout}}, nil
}

// call sends body (if not nil) as JSON and decodes the answer into out (if
// not nil). Path segments must already be escaped.
func (c *client) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the admin API: %w", err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	if res.StatusCode >= 300 {
		var env struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(raw, &env) != nil || env.Error.Code == "" {
			return &APIError{Status: res.StatusCode, Code: "unexpected", Message: strings.TrimSpace(string(raw))}
		}
		return &APIError{Status: res.StatusCode, Code: env.Error.Code, Message: env.Error.Message}
	}
	if out == nil || len(raw) == 0 {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("the answer is not the expected JSON: %w", err)
	}
	return nil
}

func seg(s string) string { return url.PathEscape(s) }
