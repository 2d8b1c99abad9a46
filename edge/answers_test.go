package edge

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/clock"
)

func TestPrefersJSON(t *testing.T) {
	tests := []struct {
		name   string
		accept []string
		want   bool
	}{
		{"no Accept: text", nil, false},
		{"application/json alone", []string{"application/json"}, true},
		{"a browser's Accept", []string{"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}, false},
		{"*/* alone weighs both the same: text", []string{"*/*"}, false},
		{"json above html by q", []string{"text/html;q=0.5, application/json"}, true},
		{"html above json by q", []string{"application/json;q=0.5, text/html"}, false},
		{"equal q: text", []string{"application/json, text/html"}, false},
		{"application/* beats */* for json", []string{"application/*, */*;q=0.1"}, true},
		{"the most specific range decides, not the highest", []string{"application/json;q=0.2, application/*;q=1, text/html;q=0.5"}, false},
		{"case-insensitive type", []string{"Application/JSON"}, true},
		{"spread over two fields", []string{"text/html;q=0.1", "application/json"}, true},
		{"q=0 refuses json", []string{"application/json;q=0"}, false},
		{"a malformed q counts as 0", []string{"application/json;q=abc"}, false},
		{"a q over 1 counts as 0", []string{"application/json;q=1.5"}, false},
		{"a q with four decimals counts as 0", []string{"application/json;q=0.1234"}, false},
		{"spaces around parameters", []string{"application/json ; q = 0.9 , text/html ; q=0.8"}, true},
		{"garbage without a slash is skipped", []string{"garbage, application/json"}, true},
		{"empty elements are skipped", []string{",,application/json,,"}, true},
		{"other parameters before q", []string{"application/json;charset=utf-8;q=0.9, text/html;q=0.8"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := prefersJSON(tt.accept); got != tt.want {
				t.Errorf("prefersJSON(%q) = %t, want %t", tt.accept, got, tt.want)
			}
		})
	}
}

func TestJSONAnswers(t *testing.T) {
	for reason, a := range selfAnswers {
		var got struct {
			Status  int    `json:"status"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(jsonAnswers[reason], &got); err != nil {
			t.Fatalf("jsonAnswers[%s]: %v", reason, err)
		}
		if got.Status != a.status || got.Reason != string(reason) || got.Message == "" || strings.Contains(got.Message, "scafo-edge:") {
			t.Errorf("jsonAnswers[%s] = %+v, want status %d, its reason and a bare message", reason, got, a.status)
		}
	}
}

// pagesFixture is an error pages directory on a fake clock, logging to log.
type pagesFixture struct {
	dir   string
	clock *clock.Fake
	log   bytes.Buffer
	pages *ErrorPages
}

func newPagesFixture(t *testing.T, files map[string]string) *pagesFixture {
	t.Helper()
	f := &pagesFixture{dir: t.TempDir(), clock: clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	for name, body := range files {
		f.write(t, name, body)
	}
	var err error
	f.pages, err = NewErrorPages(ErrorPagesOptions{Dir: f.dir, Every: 2 * time.Second, Log: zerolog.New(&f.log), Clock: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *pagesFixture) write(t *testing.T, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// answer is the handler's self-answer for reason, as a client sending
// accept sees it.
func (f *pagesFixture) answer(reason Reason, accept string) *httptest.ResponseRecorder {
	h := &Handler{ErrorPages: f.pages}
	r := httptest.NewRequest("GET", "/", nil)
	if accept != "" {
		r.Header.Set("Accept", accept)
	}
	w := httptest.NewRecorder()
	h.answer(w, r, &Record{}, reason)
	return w
}

func TestErrorPages(t *testing.T) {
	t.Run("a page in the directory answers for its status, as HTML", func(t *testing.T) {
		f := newPagesFixture(t, map[string]string{"502.html": "<h1>down</h1>"})
		w := f.answer(ReasonNoUpstream, "")
		if w.Code != 502 || w.Body.String() != "<h1>down</h1>" || w.Header().Get("Content-Type") != "text/html; charset=utf-8" {
			t.Errorf("got %d %q %q, want 502 with the page as HTML", w.Code, w.Header().Get("Content-Type"), w.Body)
		}
		if w.Header().Get("Vary") != "Accept" || w.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("header = %v, want Vary: Accept and nosniff", w.Header())
		}
	})
	t.Run("one page serves every reason of its status, Retry-After kept", func(t *testing.T) {
		f := newPagesFixture(t, map[string]string{"503.html": "busy", "429.html": "slow down"})
		for _, reason := range []Reason{ReasonNoDocument, ReasonOverloaded, ReasonAppBusy} {
			if w := f.answer(reason, ""); w.Body.String() != "busy" || w.Header().Get("Retry-After") == "" {
				t.Errorf("%s: got %q Retry-After %q, want the 503 page with Retry-After", reason, w.Body, w.Header().Get("Retry-After"))
			}
		}
		if w := f.answer(ReasonClientRate, ""); w.Code != 429 || w.Body.String() != "slow down" {
			t.Errorf("client_rate: got %d %q, want the 429 page", w.Code, w.Body)
		}
	})
	t.Run("a status without a page keeps the edge's text", func(t *testing.T) {
		f := newPagesFixture(t, map[string]string{"502.html": "down"})
		if w := f.answer(ReasonNoRoute, ""); w.Code != 404 || !strings.Contains(w.Body.String(), "no route") {
			t.Errorf("got %d %q, want the edge's 404 text", w.Code, w.Body)
		}
		if w := f.answer(ReasonDenied, ""); !strings.Contains(w.Body.String(), "not served publicly") {
			t.Errorf("403: got %q, want the edge's text (no page is read for it)", w.Body)
		}
	})
	t.Run("a client preferring JSON gets JSON, page or not", func(t *testing.T) {
		f := newPagesFixture(t, map[string]string{"502.html": "down"})
		w := f.answer(ReasonNoUpstream, "application/json")
		if w.Header().Get("Content-Type") != "application/json" ||
			w.Body.String() != `{"status":502,"reason":"no_upstream","message":"no upstream could be reached"}`+"\n" {
			t.Errorf("got %q %q, want the JSON form", w.Header().Get("Content-Type"), w.Body)
		}
	})
	t.Run("without a directory a JSON client still gets JSON", func(t *testing.T) {
		h := &Handler{}
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Accept", "application/json")
		w := httptest.NewRecorder()
		h.answer(w, r, &Record{}, ReasonNoRoute)
		if !strings.HasPrefix(w.Body.String(), `{"status":404,"reason":"no_route"`) {
			t.Errorf("got %q, want the JSON form", w.Body)
		}
	})
	t.Run("a changed page is served once the interval has passed", func(t *testing.T) {
		f := newPagesFixture(t, map[string]string{"404.html": "old"})
		f.write(t, "404.html", "new page")
		if w := f.answer(ReasonNoRoute, ""); w.Body.String() != "old" {
			t.Errorf("before the interval: %q, want the old page", w.Body)
		}
		f.clock.Advance(2 * time.Second)
		if w := f.answer(ReasonNoRoute, ""); w.Body.String() != "new page" {
			t.Errorf("after the interval: %q, want the new page", w.Body)
		}
	})
	t.Run("a page added later is served, one removed falls back and is logged once", func(t *testing.T) {
		f := newPagesFixture(t, nil)
		f.write(t, "504.html", "slow")
		f.clock.Advance(2 * time.Second)
		if w := f.answer(ReasonTimeout, ""); w.Body.String() != "slow" {
			t.Errorf("added: %q, want the page", w.Body)
		}
		os.Remove(filepath.Join(f.dir, "504.html"))
		for range 3 {
			f.clock.Advance(2 * time.Second)
			if w := f.answer(ReasonTimeout, ""); !strings.Contains(w.Body.String(), "did not answer in time") {
				t.Errorf("removed: %q, want the edge's text", w.Body)
			}
		}
		if n := strings.Count(f.log.String(), "error page gone"); n != 1 {
			t.Errorf("logged the removal %d times, want once:\n%s", n, f.log.String())
		}
	})
	t.Run("a page over the size limit is not served and is logged once", func(t *testing.T) {
		f := newPagesFixture(t, map[string]string{"404.html": strings.Repeat("x", MaxErrorPageSize+1)})
		for range 3 {
			f.clock.Advance(2 * time.Second)
			if w := f.answer(ReasonNoRoute, ""); !strings.Contains(w.Body.String(), "no route") {
				t.Errorf("got %d bytes, want the edge's text", w.Body.Len())
			}
		}
		if n := strings.Count(f.log.String(), "error page not served"); n != 1 {
			t.Errorf("logged %d times, want once:\n%s", n, f.log.String())
		}
	})
	t.Run("a directory in a page's place is not served", func(t *testing.T) {
		f := newPagesFixture(t, nil)
		os.Mkdir(filepath.Join(f.dir, "404.html"), 0o755)
		f.clock.Advance(2 * time.Second)
		if w := f.answer(ReasonNoRoute, ""); !strings.Contains(w.Body.String(), "no route") {
			t.Errorf("got %q, want the edge's text", w.Body)
		}
		if !strings.Contains(f.log.String(), "not a regular file") {
			t.Errorf("log = %s, want the reason", f.log.String())
		}
	})
	t.Run("a FIFO in a page's place does not block the request", func(t *testing.T) {
		f := newPagesFixture(t, nil)
		if err := syscall.Mkfifo(filepath.Join(f.dir, "404.html"), 0o644); err != nil {
			t.Skip("no FIFO here:", err)
		}
		f.clock.Advance(2 * time.Second)
		done := make(chan string, 1)
		go func() { done <- f.answer(ReasonNoRoute, "").Body.String() }()
		select {
		case body := <-done:
			if !strings.Contains(body, "no route") {
				t.Errorf("got %q, want the edge's text", body)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the request blocked opening a FIFO")
		}
	})
	t.Run("an unreadable page falls back to the edge's text", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root reads any file")
		}
		f := newPagesFixture(t, map[string]string{"404.html": "secret"})
		os.Chmod(filepath.Join(f.dir, "404.html"), 0)
		os.Chtimes(filepath.Join(f.dir, "404.html"), time.Now(), time.Now().Add(time.Minute))
		f.clock.Advance(2 * time.Second)
		if w := f.answer(ReasonNoRoute, ""); !strings.Contains(w.Body.String(), "no route") {
			t.Errorf("got %q, want the edge's text", w.Body)
		}
	})
	t.Run("an empty page is served empty", func(t *testing.T) {
		f := newPagesFixture(t, map[string]string{"404.html": ""})
		if w := f.answer(ReasonNoRoute, ""); w.Body.Len() != 0 || w.Header().Get("Content-Type") != "text/html; charset=utf-8" {
			t.Errorf("got %q %q, want an empty HTML page", w.Header().Get("Content-Type"), w.Body)
		}
	})
	t.Run("a directory that is not one is refused", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "f")
		os.WriteFile(file, nil, 0o644)
		for _, dir := range []string{file, filepath.Join(t.TempDir(), "missing")} {
			if _, err := NewErrorPages(ErrorPagesOptions{Dir: dir}); err == nil {
				t.Errorf("NewErrorPages(%q) = nil error, want one", dir)
			}
		}
	})
}
