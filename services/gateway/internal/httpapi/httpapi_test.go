package httpapi

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// The envelope is the wire format documented in api/admin-openapi.yaml.
func TestWriteErrorEnvelope(t *testing.T) {
	w := httptest.NewRecorder()
	WriteError(w, Fail(CodeConflict, `tenant "acme" exists`))
	if w.Code != http.StatusConflict || w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("status %d, headers %v", w.Code, w.Header())
	}
	if got, want := w.Body.String(), `{"error":{"code":"already_exists","message":"tenant \"acme\" exists"}}`+"\n"; got != want {
		t.Fatalf("body %q, want %q", got, want)
	}
}

// Every code has its status: none falls back to 500 by accident.
func TestEveryCodeHasItsStatus(t *testing.T) {
	for _, c := range []string{CodeRateLimited, CodeInvalid, CodeUnauthenticated, CodePermission, CodeNotFound, CodeConflict,
		CodeMethodNotAllowed, CodeTooLarge, CodeMediaType, CodeUnavailable} {
		if st := Fail(c, "").Status(); st == http.StatusInternalServerError || st < 400 {
			t.Errorf("%s: status %d", c, st)
		}
	}
}
