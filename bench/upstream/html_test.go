package main

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHTMLPage: /html64k is exactly 64 KiB of HTML, the same every time,
// served as text/html with its Content-Length, and compresses as a page
// does: several times, not to nothing.
func TestHTMLPage(t *testing.T) {
	h := &handler{html: htmlBody(64 << 10)}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/html64k", nil))
	page := rec.Body.Bytes()
	if len(page) != 65536 {
		t.Fatalf("%d bytes, want 65536", len(page))
	}
	if got := rec.Header().Get("Content-Length"); got != "65536" {
		t.Errorf("Content-Length %q, want 65536", got)
	}
	if got := rec.Header().Get("Content-Type"); !strings.HasPrefix(got, "text/html") {
		t.Errorf("Content-Type %q, want text/html", got)
	}
	if !bytes.HasPrefix(page, []byte("<!DOCTYPE html>")) || !bytes.HasSuffix(page, []byte("</html>\n")) {
		t.Errorf("not a whole page: %q ... %q", page[:20], page[len(page)-20:])
	}
	if again := htmlPage(64 << 10); again != string(page) {
		t.Error("a second page differs from the first")
	}
	var z bytes.Buffer
	w, _ := gzip.NewWriterLevel(&z, gzip.DefaultCompression)
	w.Write(page)
	w.Close()
	if ratio := float64(len(page)) / float64(z.Len()); ratio < 3 || ratio > 15 {
		t.Errorf("gzip ratio %.1f (%d bytes), want a page's 3 to 15", ratio, z.Len())
	}
	t.Logf("gzip -6: %d bytes, ratio %.1f", z.Len(), float64(len(page))/float64(z.Len()))
	// The other bodies keep their type.
	rec = httptest.NewRecorder()
	(&handler{small: newBody(1024)}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/1k", nil))
	if got := rec.Header().Get("Content-Type"); got != "application/octet-stream" {
		t.Errorf("/1k Content-Type %q, want application/octet-stream", got)
	}
}
