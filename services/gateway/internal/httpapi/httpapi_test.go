package httpapi

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// The envelope is the wire format documented in api/admin-openapi.yaml.
func TestWriteErrorEnvelope(t *testing.T) {
	w := httptest.NewRecorder()
	WriteError(w, &Error{Status: http.StatusConflict, Code: CodeConflict, Message: `tenant "acme" exists`})
	if w.Code != http.StatusConflict || w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("status %d, headers %v", w.Code, w.Header())
	}
	if got, want := w.Body.String(), `{"error":{"code":"already_exists","message":"tenant \"acme\" exists"}}`+"\n"; got != want {
		t.Fatalf("body %q, want %q", got, want)
	}
}
