package console_test

import (
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/services/gateway/console"
)

func serve(t *testing.T, cfg console.Config) *httptest.Server {
	t.Helper()
	h, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(console.Prefix, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	// A transport that does not add or undo gzip on its own.
	res, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var r io.Reader = res.Body
	if res.Header.Get("Content-Encoding") == "gzip" {
		if r, err = gzip.NewReader(res.Body); err != nil {
			t.Fatal(err)
		}
	}
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

func TestConsolePageIsServedWithAStrictPolicy(t *testing.T) {
	srv := serve(t, console.Config{Version: "v1.2.3"})
	res, body := get(t, srv.URL+"/ui/", nil)
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") || !strings.Contains(body, `src="app.js"`) {
		t.Fatalf("index: %d %s %.200s", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	csp := res.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'self';", "style-src 'self';", "frame-ancestors 'none'", "ws://" + strings.TrimPrefix(srv.URL, "http://")} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	if strings.Contains(csp, "unsafe") {
		t.Errorf("CSP allows unsafe sources: %q", csp)
	}
	if res.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Error("no nosniff")
	}

	// Every module and stylesheet the page names is served with its type.
	for _, name := range []string{"app.js", "lib.js", "gateway.js", "schemaform.js", "nodes.js", "manage.js", "style.css"} {
		res, body := get(t, srv.URL+"/ui/"+name, nil)
		want := "text/javascript"
		if strings.HasSuffix(name, ".css") {
			want = "text/css"
		}
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), want) || len(body) < 100 {
			t.Errorf("%s: %d %q %d bytes", name, res.StatusCode, res.Header.Get("Content-Type"), len(body))
		}
	}

	res, body = get(t, srv.URL+"/ui/config.json", nil)
	var cfg console.ClientConfig
	if res.StatusCode != 200 || json.Unmarshal([]byte(body), &cfg) != nil || cfg.Version != "v1.2.3" || cfg.JaegerURL != "" {
		t.Errorf("config: %d %s", res.StatusCode, body)
	}
	if res, _ := get(t, srv.URL+"/ui/nope.js", nil); res.StatusCode != 404 {
		t.Errorf("unknown file: %d", res.StatusCode)
	}
	if res, _ := get(t, srv.URL+"/ui/../go.mod", nil); res.StatusCode == 200 {
		t.Errorf("path escape answered 200")
	}
}

// The CSP forbids inline scripts and styles; a page that used them would
// break in the browser, so none may be embedded.
func TestConsoleAssetsHaveNothingInline(t *testing.T) {
	srv := serve(t, console.Config{})
	_, index := get(t, srv.URL+"/ui/", nil)
	if m := regexp.MustCompile(`<script(?:\s[^>]*)?>([^<]+)</script>|<style|\sstyle=|\son[a-z]+=`).FindString(index); m != "" {
		t.Errorf("index.html has inline code: %q", m)
	}
	for _, name := range []string{"app.js", "lib.js", "nodes.js", "manage.js", "schemaform.js", "gateway.js"} {
		_, js := get(t, srv.URL+"/ui/"+name, nil)
		for _, bad := range []string{"innerHTML", "eval(", "new Function", "setAttribute('style'", ".style.", "http://", "https://"} {
			if strings.Contains(js, bad) {
				t.Errorf("%s uses %q", name, bad)
			}
		}
	}
}

func TestConsoleCompressesAndRevalidates(t *testing.T) {
	srv := serve(t, console.Config{})
	plain, body := get(t, srv.URL+"/ui/app.js", nil)
	zipped, unzipped := get(t, srv.URL+"/ui/app.js", map[string]string{"Accept-Encoding": "br, gzip"})
	if plain.Header.Get("Content-Encoding") != "" || zipped.Header.Get("Content-Encoding") != "gzip" || body != unzipped {
		t.Fatalf("gzip: plain %q zipped %q, same body %v", plain.Header.Get("Content-Encoding"), zipped.Header.Get("Content-Encoding"), body == unzipped)
	}
	if n := zipped.ContentLength; n <= 0 || n >= int64(len(body)) {
		t.Errorf("gzipped length %d of %d", n, len(body))
	}
	if no, _ := get(t, srv.URL+"/ui/app.js", map[string]string{"Accept-Encoding": "gzip;q=0"}); no.Header.Get("Content-Encoding") != "" {
		t.Error("gzip sent although refused")
	}
	etag := plain.Header.Get("ETag")
	again, _ := get(t, srv.URL+"/ui/app.js", map[string]string{"If-None-Match": etag})
	if etag == "" || again.StatusCode != http.StatusNotModified {
		t.Errorf("revalidation with %q: %d", etag, again.StatusCode)
	}
}

func TestConsoleConfigCarriesTheJaegerURL(t *testing.T) {
	srv := serve(t, console.Config{JaegerURL: "http://jaeger.example:16686/"})
	_, body := get(t, srv.URL+"/ui/config.json", nil)
	if !strings.Contains(body, `"jaegerUrl":"http://jaeger.example:16686"`) {
		t.Errorf("config: %s", body)
	}
	for _, bad := range []string{"jaeger:16686", "ftp://x", "/relative", "http://"} {
		if _, err := console.New(console.Config{JaegerURL: bad}); err == nil {
			t.Errorf("Jaeger URL %q accepted", bad)
		}
	}
}

func TestConsoleRefusesWrites(t *testing.T) {
	srv := serve(t, console.Config{})
	res, err := http.Post(srv.URL+"/ui/", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", res.StatusCode)
	}
}
