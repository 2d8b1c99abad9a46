package edge

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/backhaul"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// bodySink is an upstream that reads each request's body whole and
// records how many bytes it got and whether the body ended cleanly.
type bodySink struct {
	srv  *httptest.Server
	mu   sync.Mutex
	got  []string // "<n> ok" or "<n> broken"
	done chan struct{}
}

func newBodySink(t *testing.T) *bodySink {
	s := &bodySink{done: make(chan struct{}, 100)}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		if err != nil {
			s.got = append(s.got, fmt.Sprintf("%d broken", n))
		} else {
			s.got = append(s.got, fmt.Sprintf("%d ok", n))
		}
		s.mu.Unlock()
		s.done <- struct{}{}
		fmt.Fprintf(w, "took %d", n)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *bodySink) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

func TestBodyLimit(t *testing.T) {
	sink := newBodySink(t)
	ups := []node.Upstream{{Node: "n", Address: sink.srv.Listener.Addr().String()}}
	limit := func(n int64) *int64 { return &n }
	doc := &node.Document{V: 1, Routes: []node.Route{{Host: "node.example", Application: "node", Upstreams: ups}}}
	op := &node.OperatorDocument{V: 1, Routes: []node.OperatorRoute{
		{Host: "small.example", Upstreams: ups, MaxBodyBytes: limit(10)},
		{Host: "big.example", Upstreams: ups, MaxBodyBytes: limit(1000)},
		{Host: "unbounded.example", Upstreams: ups, MaxBodyBytes: limit(0)},
		{Host: "inherits.example", Upstreams: ups},
	}}
	tbl, drops, _ := CompileWith(doc, op)
	if len(drops) > 0 {
		t.Fatal(drops)
	}
	live := &Live{}
	live.Store(tbl)
	obs := &recorder{}
	proxy := testsupport.Must(backhaul.New(backhaul.Options{}))
	t.Cleanup(proxy.Close)
	srv := httptest.NewServer(&Handler{Table: live, Forwarder: proxy, Observer: obs, MaxBodyBytes: 100})
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()

	chunked := func(n int) string {
		return fmt.Sprintf("Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", n, strings.Repeat("x", n))
	}
	sized := func(n int) string {
		return fmt.Sprintf("Content-Length: %d\r\n\r\n%s", n, strings.Repeat("x", n))
	}
	tests := []struct {
		name, host, rest string
		wantStatus       string
		wantUpstream     string // what the upstream saw, "" for nothing
	}{
		{"a Content-Length over --max-body-bytes is 413, nothing forwarded", "node.example", sized(101), "413 Request Entity Too Large", ""},
		{"a Content-Length at the limit passes", "node.example", sized(100), "200 OK", "100 ok"},
		{"a chunked body at the limit passes", "node.example", chunked(100), "200 OK", "100 ok"},
		{"a chunked body over the limit is 413 and never whole upstream", "node.example", chunked(101), "413 Request Entity Too Large", "broken"},
		{"a route's smaller limit wins", "small.example", sized(11), "413 Request Entity Too Large", ""},
		{"a route's larger limit wins", "big.example", sized(500), "200 OK", "500 ok"},
		{"a route's 0 lifts the limit", "unbounded.example", sized(5000), "200 OK", "5000 ok"},
		{"an operator route without its own limit has the flag's", "inherits.example", sized(101), "413 Request Entity Too Large", ""},
		{"a bodiless request is not affected", "node.example", "\r\n", "200 OK", "0 ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(sink.seen())
			status, _ := rawRequest(t, addr, "POST / HTTP/1.1\r\nHost: "+tt.host+"\r\n"+tt.rest)
			if status != tt.wantStatus {
				t.Errorf("status = %s, want %s", status, tt.wantStatus)
			}
			if tt.wantUpstream == "" {
				if got := sink.seen()[before:]; len(got) > 0 {
					t.Errorf("upstream saw %v, want nothing", got)
				}
			} else {
				select {
				case <-sink.done:
				case <-time.After(5 * time.Second):
					t.Fatal("upstream never finished the request")
				}
				if got := sink.seen()[before:]; len(got) != 1 || !strings.HasSuffix(got[0], tt.wantUpstream) {
					t.Errorf("upstream saw %v, want %q", got, tt.wantUpstream)
				}
			}
			if strings.HasPrefix(tt.wantStatus, "413") {
				if rec := obs.awaitLast(t); rec.Reason != ReasonBodyTooLarge {
					t.Errorf("reason = %q, want %q", rec.Reason, ReasonBodyTooLarge)
				}
			}
		})
	}

	t.Run("a client expecting 100-continue is refused before it sends", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "POST / HTTP/1.1\r\nHost: node.example\r\nExpect: 100-continue\r\nContent-Length: 1000000\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 413 {
			t.Fatalf("response = %v, %v; want 413 with no 100 Continue first", resp, err)
		}
	})
	// net/http reads up to 256 KiB of an unread body after the handler
	// returns, with no deadline: a small body that never comes would
	// hold the connection for ever despite Connection: close.
	for _, expect := range []string{"", "Expect: 100-continue\r\n"} {
		t.Run("the connection closes after a 413 whose body never comes, "+strings.TrimSpace(expect), func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			io.WriteString(c, "POST / HTTP/1.1\r\nHost: node.example\r\n"+expect+"Content-Length: 101\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 413 {
				t.Fatalf("response = %v, %v; want 413", resp, err)
			}
			io.Copy(io.Discard, resp.Body)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if n, err := br.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("after the 413: read %d bytes, %v; want the connection closed (EOF)", n, err)
			}
		})
	}
	t.Run("the route's limit shows in its features", func(t *testing.T) {
		r := tbl.ResolveHost("small.example")
		if f := r.Features(); len(f) != 1 || f[0] != "max body 10 bytes" {
			t.Errorf("Features() = %q", f)
		}
	})
}

func TestCutBody(t *testing.T) {
	for _, tt := range []struct {
		name    string
		body    string
		limit   int64
		want    string
		crossed bool
	}{
		{"shorter than the limit", "abc", 5, "abc", false},
		{"exactly the limit", "abcde", 5, "abcde", false},
		{"one byte over", "abcdef", 5, "abcde", true},
		{"far over", strings.Repeat("x", 100000), 10, "xxxxxxxxxx", true},
		{"a limit of one", "ab", 1, "a", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := &cutBody{rc: io.NopCloser(strings.NewReader(tt.body)), left: tt.limit}
			got, err := io.ReadAll(b)
			if string(got) != tt.want || b.crossed.Load() != tt.crossed || (err == errBodyTooLarge) != tt.crossed {
				t.Errorf("read %q, %v, crossed %t; want %q, crossed %t", got, err, b.crossed.Load(), tt.want, tt.crossed)
			}
			if tt.crossed {
				if n, err := b.Read(make([]byte, 10)); n != 0 || err != errBodyTooLarge {
					t.Errorf("a read after the cut = %d, %v; want 0, errBodyTooLarge", n, err)
				}
			}
		})
	}
}
