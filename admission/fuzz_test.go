package admission

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"

	"github.com/scafo/scafo-edge/internal/forwarded"
)

// FuzzClientOfRequest holds the client key a request is counted by to what
// its peer and X-Forwarded-For allow: a request straight from a client is
// counted by its own address; one from a trusted proxy by an address the
// header names that is not a trusted proxy's, or not at all. Whatever the
// header says, the key is never a trusted proxy's and never a forged
// address left of one the proxy vouches for... nor does parsing panic.
func FuzzClientOfRequest(f *testing.F) {
	for _, seed := range []struct{ remote, xff string }{
		{"203.0.113.7:4000", ""},
		{"10.0.0.1:80", "198.51.100.1"},
		{"10.0.0.1:80", "203.0.113.9, 198.51.100.1, 10.0.0.2"},
		{"10.0.0.1:80", " 203.0.113.9 ,198.51.100.1 ,  10.0.0.2 "},
		{"10.0.0.1:80", "::ffff:198.51.100.1"},
		{"[fd00:1::1]:80", "2001:db8:5:6::1, fd00:1::2"},
		{"10.0.0.1:80", "198.51.100.1:443"},
		{"10.0.0.1:80", ",,,"},
		{"10.0.0.1:80", "unknown, 10.0.0.9"},
		{"@pipe", "198.51.100.1"},
	} {
		f.Add(seed.remote, seed.xff)
	}
	c := &Controller{proxies: testProxies, trusted: testProxies}
	f.Fuzz(func(t *testing.T, remote, xff string) {
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		key, ok := c.clientOfRequest(r)
		peer, err := netip.ParseAddrPort(remote)
		if err != nil {
			if ok {
				t.Fatalf("peer %q is no address, yet counted as %v", remote, key)
			}
			return
		}
		if !ok {
			return
		}
		if forwarded.Contains(testProxies, key) {
			t.Fatalf("counted as a trusted proxy's address %v (peer %q, header %q)", key, remote, xff)
		}
		// A zone (a link-local peer's) names no other client: it is dropped.
		ip := peer.Addr().Unmap().WithZone("")
		if !forwarded.Contains(testProxies, ip) {
			if key != clientKey(ip) {
				t.Fatalf("a direct client %v counted as %v", ip, key)
			}
			return
		}
		// From a trusted proxy: the key is the rightmost address of the
		// header that is not a trusted proxy's.
		parts := strings.Split(xff, ",")
		for i := len(parts) - 1; i >= 0; i-- {
			a, err := netip.ParseAddr(strings.TrimSpace(parts[i]))
			if err != nil {
				t.Fatalf("counted as %v though %q, right of any client, is no address", key, parts[i])
			}
			if a = a.Unmap().WithZone(""); !forwarded.Contains(testProxies, a) {
				if key != clientKey(a) {
					t.Fatalf("counted as %v, want the rightmost untrusted %v (header %q)", key, a, xff)
				}
				return
			}
		}
		t.Fatalf("counted as %v though the header %q names only trusted proxies", key, xff)
	})
}

// FuzzJudgeHead holds the wait for a first head (heads.go) to net/http:
// whatever bytes net/http reads a request from, or refuses, are for the
// server now by judgeHead's account, so that a head is kept from the
// server only while net/http would still be reading it. Judged as the
// bytes come, a line at a time, the verdict is the same as judged whole;
// and behind a PROXY header, the same as without it.
func FuzzJudgeHead(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1\nHost: a\n\n",
		"GET / HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: a",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX: b\r\n continued\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\r\n\r\n",
		"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GARBAGE\r\n",
		"GET / HTTP/1.1\r\nHost fast.test\r\nX",
		"\x16\x03\x01\x02\x00\x01",
		"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n",
		"GET / HTTP/1.1\r\n b\r\n",
	} {
		f.Add([]byte(s))
	}
	// net/http reads lines whole: a line not ended yet it waits for. (Fed
	// a reader that ends, it would take a last line without its LF.)
	waiting := func(b []byte) bool {
		lines := b[:bytes.LastIndexByte(b, '\n')+1]
		if len(lines) == 0 {
			return true
		}
		_, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(lines)))
		return err == io.EOF || err == io.ErrUnexpectedEOF
	}
	v1 := []byte("PROXY TCP4 192.0.2.1 192.0.2.2 1000 80\r\n")
	v2 := append([]byte("\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c"), make([]byte, 12)...)
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= headPeek-len(v1) {
			return
		}
		whole, _ := judgeHead(b, false, -1)
		if whole == headWaiting && !waiting(b) {
			t.Fatalf("net/http is done reading %q, but it waits", b)
		}
		// And the other way: handed over for a line, net/http is done
		// with it too (a head not begun with a method's byte, or ended,
		// is handed over whatever net/http would make of it).
		if whole == headIn && len(b) > 0 && httpguts.IsTokenRune(rune(b[0])) && !headEnded(b) && waiting(b) {
			t.Fatalf("%q handed over, but net/http would still be reading it", b)
		}
		st, judged := headWaiting, -1
		for i := range min(len(b), 256) + 1 {
			st, judged = judgeHead(b[:i], false, judged)
			if fresh, _ := judgeHead(b[:i], false, -1); st != fresh {
				t.Fatalf("%q judged a byte at a time: %v, and whole: %v", b[:i], st, fresh)
			}
			if st != headWaiting {
				break
			}
		}
		for _, p := range [][]byte{v1, v2} {
			if got, _ := judgeHead(append(p[:len(p):len(p)], b...), true, -1); got != whole {
				t.Fatalf("%q behind a PROXY header %q: %v, want %v", b, p, got, whole)
			}
		}
	})
}
