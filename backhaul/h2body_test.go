package backhaul

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/scafo/scafo-edge/node"
)

// TestHTTP2ZeroLengthBodyWaitsForTheStreamToEnd: a request that declares
// content-length 0 on a stream it leaves open is forwarded only once the
// stream ends, so data sent beyond the declared zero is refused before any
// upstream sees the request, however late the client sends it. Forwarding
// at once left the refusal to a race between the server reading the data
// and the upstream's answer.
func TestHTTP2ZeroLengthBodyWaitsForTheStreamToEnd(t *testing.T) {
	for _, tc := range []struct {
		name      string
		data      string
		forwarded bool
	}{
		{"an empty frame ends the stream: forwarded", "", true},
		{"data beyond the declared zero: refused, never forwarded", "smuggled", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := make(chan struct{}, 1)
			up := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
				seen <- struct{}{}
				io.WriteString(w, "ok")
			})
			p := newProxy(t, Options{})
			edge := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if _, err := p.Forward(w, r, []node.Upstream{up}); err != nil {
					w.WriteHeader(http.StatusBadGateway)
				}
			}))
			edge.EnableHTTP2 = true
			edge.StartTLS()
			t.Cleanup(edge.Close)

			c, err := tls.Dial("tcp", edge.Listener.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			io.WriteString(c, http2.ClientPreface)
			fr := http2.NewFramer(c, c)
			fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
			fr.WriteSettings()
			var block bytes.Buffer
			enc := hpack.NewEncoder(&block)
			for _, f := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", "a.example"}, {":path", "/"}, {"content-length", "0"}} {
				enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
			}
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true})

			// The stream is open: nothing may reach the upstream yet. The
			// bound is how long a forward-at-once edge needs to be seen.
			select {
			case <-seen:
				t.Fatal("the upstream saw the request before its stream ended")
			case <-time.After(500 * time.Millisecond):
			}
			fr.WriteData(1, true, []byte(tc.data))

			got := ""
			for got == "" {
				f, err := fr.ReadFrame()
				if err != nil {
					t.Fatalf("read: %v", err)
				}
				switch f := f.(type) {
				case *http2.SettingsFrame:
					if !f.IsAck() {
						fr.WriteSettingsAck()
					}
				case *http2.MetaHeadersFrame:
					got = "status " + f.PseudoValue("status")
				case *http2.RSTStreamFrame:
					got = "reset " + f.ErrCode.String()
				case *http2.GoAwayFrame:
					got = "goaway " + f.ErrCode.String()
				}
			}
			if tc.forwarded != (got == "status 200") {
				t.Errorf("answered %s, forwarded = %v", got, tc.forwarded)
			}
			if !tc.forwarded && len(seen) != 0 {
				t.Error("the upstream saw a request whose data ran past its content-length")
			}
		})
	}
}
