package backhaul

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/scafo/scafo-edge/node"
)

func TestStreamedResponsesArriveAsTheyAreWritten(t *testing.T) {
	tests := []struct {
		name        string
		contentType string
		length      bool // declare a Content-Length
	}{
		{name: "server-sent events flush per event", contentType: "text/event-stream; charset=utf-8"},
		{name: "a chunked body flushes per chunk", contentType: "application/octet-stream"},
		{name: "server-sent events flush even with a declared length", contentType: "text/event-stream", length: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			release := make(chan struct{})
			up := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tt.contentType)
				first, second := "data: one\n\n", "data: two\n\n"
				if tt.length {
					w.Header().Set("Content-Length", fmt.Sprint(len(first)+len(second)))
				}
				io.WriteString(w, first)
				http.NewResponseController(w).Flush()
				select { // the second event waits until the client saw the first
				case <-release:
				case <-r.Context().Done():
					return
				}
				io.WriteString(w, second)
			})
			e := startEdge(t, newProxy(t, Options{}), up)
			resp, err := client(t).Get(e.srv.URL + "/events")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			got := make(chan string, 1)
			go func() {
				line, _ := br.ReadString('\n')
				got <- line
			}()
			select {
			case line := <-got:
				if line != "data: one\n" {
					t.Errorf("first line = %q, want %q", line, "data: one\n")
				}
			case <-time.After(5 * time.Second):
				close(release)
				t.Fatal("the first event did not arrive before the upstream finished")
			}
			close(release)
			rest, err := io.ReadAll(br)
			if err != nil || string(rest) != "\ndata: two\n\n" {
				t.Errorf("rest = %q, %v; want the second event", rest, err)
			}
			e.next(t)
		})
	}
}

// randomBody returns n deterministic pseudo-random bytes as a stream and
// their SHA-256.
func randomBody(n int64, seed uint64) (io.Reader, string) {
	src := rand.NewChaCha8([32]byte{byte(seed)})
	h := sha256.New()
	io.Copy(h, io.LimitReader(src, n))
	src = rand.NewChaCha8([32]byte{byte(seed)})
	return io.LimitReader(src, n), hex.EncodeToString(h.Sum(nil))
}

func TestLargeBodiesStreamIntact(t *testing.T) {
	const size = 20 << 20
	hasher := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "GET" {
			body, _ := randomBody(size, 7)
			w.Header().Set("Content-Length", fmt.Sprint(size))
			io.Copy(w, body)
			return
		}
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
	})
	e := startEdge(t, newProxy(t, Options{}), hasher)
	c := client(t)

	for _, chunked := range []bool{false, true} {
		name := "a 20 MiB upload with a declared length arrives intact"
		if chunked {
			name = "a 20 MiB chunked upload arrives intact"
		}
		t.Run(name, func(t *testing.T) {
			body, sum := randomBody(size, 1)
			req, _ := http.NewRequest("PUT", e.srv.URL+"/upload", body)
			req.ContentLength = size
			if chunked {
				req.ContentLength = -1
				req.Body = io.NopCloser(body) // hide the length
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if want := fmt.Sprintf("%d %s", size, sum); string(got) != want {
				t.Errorf("upstream saw %q, want %q", got, want)
			}
			if res := e.next(t).res; res.BytesIn != size {
				t.Errorf("Result.BytesIn = %d, want %d", res.BytesIn, size)
			}
		})
	}
	t.Run("a 20 MiB download arrives intact", func(t *testing.T) {
		_, sum := randomBody(size, 7)
		resp, err := c.Get(e.srv.URL + "/download")
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		resp.Body.Close()
		if err != nil || n != size || hex.EncodeToString(h.Sum(nil)) != sum {
			t.Errorf("downloaded %d bytes (%v) with another hash, want %d intact", n, err, size)
		}
		if res := e.next(t).res; res.BytesOut != size {
			t.Errorf("Result.BytesOut = %d, want %d", res.BytesOut, size)
		}
	})
}

func TestTrailersAreForwarded(t *testing.T) {
	up := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "Grpc-Status")
		io.WriteString(w, "body")
		w.Header().Set("Grpc-Status", "0")
	})
	e := startEdge(t, newProxy(t, Options{}), up)
	resp, err := client(t).Get(e.srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if got := resp.Trailer.Get("Grpc-Status"); got != "0" {
		t.Errorf("trailer Grpc-Status = %q, want \"0\"", got)
	}
	e.next(t)
}

func TestWebSocketIsTunnelledBothWays(t *testing.T) {
	up := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(1 << 20)
		// Echo until the client closes; the server also speaks first, so
		// both directions are exercised independently.
		if err := c.Write(r.Context(), websocket.MessageText, []byte("hello")); err != nil {
			return
		}
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, msg); err != nil {
				return
			}
		}
	})
	p := newProxy(t, Options{ResponseHeaderTimeout: 5 * time.Second})
	e := startEdge(t, p, up)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hc := client(t)
	c, resp, err := websocket.Dial(ctx, "ws://"+e.addr+"/ws", &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status = %d, want 101", resp.StatusCode)
	}
	if _, msg, err := c.Read(ctx); err != nil || string(msg) != "hello" {
		t.Fatalf("first message = %q, %v; want the upstream's hello", msg, err)
	}
	big := strings.Repeat("x", 100<<10)
	for _, m := range []string{"one", big, "three"} {
		if err := c.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
			t.Fatal(err)
		}
		_, msg, err := c.Read(ctx)
		if err != nil || string(msg) != m {
			t.Fatalf("echo of %d bytes = %d bytes, %v", len(m), len(msg), err)
		}
	}
	if err := c.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Errorf("close: %v", err)
	}
	res := e.next(t)
	if res.err != nil || res.res.Status != http.StatusSwitchingProtocols || res.res.BytesIn == 0 || res.res.BytesOut == 0 {
		t.Errorf("Forward = %+v, %v; want a 101 with bytes both ways", res.res, res.err)
	}
}

func TestAnUpgradeTheUpstreamRefusesIsAPlainResponse(t *testing.T) {
	up := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no websockets here", http.StatusBadRequest)
	})
	e := startEdge(t, newProxy(t, Options{}), up)
	resp, body := rawDo(t, e.addr, "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	if resp.StatusCode != 400 || body != "no websockets here\n" {
		t.Errorf("got %d %q, want the upstream's 400", resp.StatusCode, body)
	}
	e.next(t)
}

// TestAnUpgradeToH2CIsAPlainRequest: an upstream that speaks h2c would
// otherwise get a tunnel in which every later request skips the edge.
func TestAnUpgradeToH2CIsAPlainRequest(t *testing.T) {
	got := make(chan http.Header, 1)
	up := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		io.WriteString(w, "plain")
	})
	e := startEdge(t, newProxy(t, Options{}), up)
	for _, upgrade := range []string{"h2c", "websocket, H2C"} {
		resp, body := rawDo(t, e.addr, "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: "+upgrade+
			"\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
		if resp.StatusCode != 200 || body != "plain" {
			t.Errorf("Upgrade: %s: got %d %q, want the upstream's plain 200", upgrade, resp.StatusCode, body)
		}
		h := <-got
		for _, k := range []string{"Upgrade", "Http2-Settings", "Connection"} {
			if v, ok := h[k]; ok {
				t.Errorf("Upgrade: %s: the upstream received %s: %q", upgrade, k, v)
			}
		}
		e.next(t)
	}
}

func TestForwardedProtoIsHTTPSOverTLS(t *testing.T) {
	rec := recorder(t)
	for _, path := range paths {
		t.Run(path.name, func(t *testing.T) {
			p := newPathProxy(t, Options{}, path.h1Off)
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				p.Forward(w, r, []node.Upstream{rec})
			}))
			t.Cleanup(srv.Close)
			c := srv.Client()
			t.Cleanup(c.CloseIdleConnections)
			_, body := get(t, c, srv.URL+"/")
			if got := decodeSeen(t, body).Header.Get("X-Forwarded-Proto"); got != "https" {
				t.Errorf("X-Forwarded-Proto = %q, want https", got)
			}
		})
	}
}
