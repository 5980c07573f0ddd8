// Package console is the operator console: a browser application served by
// the gateway under /ui/, embedded in the binary (no CDN, no network at run
// time, no build step). The page talks only to the gateway's own APIs: the
// operator WebSocket (OpenClaw protocol) for nodes, invokes and live events,
// the audit API and the admin API. Every answer carries a strict
// Content-Security-Policy: scripts and styles from these files only.
package console

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
)

//go:embed assets
var assets embed.FS

// Prefix is the path the console is served under.
const Prefix = "/ui/"

// Config configures the console.
type Config struct {
	// JaegerURL, when set, is the base URL of a Jaeger UI; audit rows and
	// invoke results link to JaegerURL + "/trace/<trace id>".
	JaegerURL string
	// Version is shown in the page footer.
	Version string
}

// ClientConfig is the answer of GET /ui/config.json: what the page needs to
// know about its server before anyone signs in. It holds nothing secret.
type ClientConfig struct {
	JaegerURL string `json:"jaegerUrl,omitempty"`
	Version   string `json:"version,omitempty"`
}

type file struct {
	body, gz []byte // gz: gzipped, when that is smaller
	ctype    string
	etag     string
}

type handler struct {
	files  map[string]file // by path under /ui/
	config []byte
}

// New returns the handler of every path under /ui/. Mount it as
// mux.Handle("/ui/", h).
func New(cfg Config) (http.Handler, error) {
	if cfg.JaegerURL != "" {
		u, err := url.Parse(cfg.JaegerURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, errors.New("console: the Jaeger URL must be an absolute http(s) URL")
		}
		cfg.JaegerURL = strings.TrimRight(cfg.JaegerURL, "/")
	}
	h := &handler{files: map[string]file{}}
	err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := assets.ReadFile(p)
		if err != nil {
			return err
		}
		ctype := mime.TypeByExtension(path.Ext(p))
		if ctype == "" {
			ctype = "application/octet-stream"
		}
		sum := sha256.Sum256(b)
		f := file{body: b, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		var gz bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
		_, _ = zw.Write(b)
		if zw.Close() == nil && gz.Len() < len(b) {
			f.gz = gz.Bytes()
		}
		h.files[strings.TrimPrefix(p, "assets/")] = f
		return nil
	})
	if err != nil {
		return nil, err
	}
	if _, ok := h.files["index.html"]; !ok {
		return nil, errors.New("console: index.html is not embedded")
	}
	if h.config, err = json.Marshal(ClientConfig(cfg)); err != nil {
		return nil, err
	}
	return h, nil
}

// securityHeaders sets the policy of every answer: scripts, styles and
// connections to this origin only (the WebSocket included), nothing inline,
// no framing, no referrer.
func securityHeaders(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	connect := "'self'"
	if r.Host != "" && !strings.ContainsAny(r.Host, " ;,'\"") {
		connect += " ws://" + r.Host + " wss://" + r.Host
	}
	hdr.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src "+connect+"; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("X-Frame-Options", "DENY")
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w, r)
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, Prefix)
	if !ok {
		http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
		return
	}
	if name == "config.json" {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(h.config)
		return
	}
	if name == "" {
		name = "index.html"
	}
	f, ok := h.files[name]
	if !ok {
		http.NotFound(w, r)
		return
	}
	hdr := w.Header()
	hdr.Set("Content-Type", f.ctype)
	// Revalidate every time: the files change with the binary, and an
	// unchanged file costs a 304.
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("ETag", f.etag)
	hdr.Set("Vary", "Accept-Encoding")
	if match := r.Header.Get("If-None-Match"); match != "" && strings.Contains(match, f.etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	body := f.body
	if f.gz != nil && acceptsGzip(r.Header.Get("Accept-Encoding")) {
		body = f.gz
		hdr.Set("Content-Encoding", "gzip")
	}
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(body)
}

// acceptsGzip reports whether an Accept-Encoding header admits gzip.
func acceptsGzip(accept string) bool {
	for _, part := range strings.Split(accept, ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(coding), "gzip") {
			return strings.ReplaceAll(strings.TrimSpace(params), " ", "") != "q=0"
		}
	}
	return false
}
