package h1

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"testing"
)

// framingSeeds are response byte streams from backhaul's hostile-origin
// cases (TestHostileOrigins) and the framing rules around them: late bytes
// after HEAD and short bodies, repeated and signed lengths,
// Transfer-Encoding on HTTP/1.0 and beside a length, framing fields in
// trailers, 1xx floods and 1xx heads framed badly, folds.
var framingSeeds = []struct {
	raw  string
	head bool
}{
	{"HTTP/1.1 200 OK\r\nContent-Length: 44\r\n\r\n", true},
	{"HTTP/1.1 200 OK\r\nContent-Length: 44\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!", true},
	{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!", false},
	{"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!", false},
	{"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\nEVIL!", false},
	{"HTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", false},
	{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", false},
	{"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello", false},
	{"HTTP/1.1 200 OK\r\nContent-Length: -0\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello", false},
	{"HTTP/1.1 200 OK\r\nContent-Length: 05\r\n\r\nhello", false},
	{"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\nhello", false},
	{"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", false},
	{"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n5\r\nhello\r\n0\r\n\r\n", false},
	{"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\nhello", false},
	{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: x\r\n\r\n5\r\nhello\r\n0\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false},
	{"HTTP/1.1 204 No Content\r\nTransfer-Encoding: gzip\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: Grpc-Status\r\n\r\n5\r\nhello\r\n0\r\nGrpc-Status: 0\r\nContent-Length: 5\r\nHost: evil\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: Content-Length\r\n\r\n0\r\nContent-Length: 5\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n", false},
	{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;\r\r\nhello\r\n0\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\rX\r\nhello\r\n0\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5 ;ext\r\nhello\r\n0\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n", false},
	{"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false},
	{"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", false},
	{"HTTP/1.1 100 Continue\r\nContent-Length: x\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false},
	{"HTTP/1.1 103 Early Hints\r\nTransfer-Encoding: gzip\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false},
	{"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: 0\r\n\r\n", false},
	{"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", false},
	{"HTTP/1.1 200 OK\r\nX A: 1\r\nContent-Length: 0\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n", false},
	{"HTTP/1.1 099 Low\r\nContent-Length: 0\r\n\r\n", false},
	{"HTTP/1.1  200 OK\r\nContent-Length: 0\r\n\r\n", false},
	{"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n", false},
	{"HTTP/1.1 200 OK\r\n\r\nuntil the close", false},
	{"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", false},
	{"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", false},
	{"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", false},
}

// FuzzResponseFraming feeds the same bytes to the pooled client's response
// reader and to http.ReadResponse (looping over 1xx responses as
// http.Transport does), and fails where the pooled client accepts a head
// or a body Go rejects, or where both accept and they disagree on the
// status, the body bytes, the Content-Length passed on, or keep-alive
// (the pooled client may close where Go keeps alive, never the reverse).
// Being stricter than Go is allowed.
func FuzzResponseFraming(f *testing.F) {
	for _, s := range framingSeeds {
		f.Add([]byte(s.raw), s.head)
	}
	f.Fuzz(func(t *testing.T, raw []byte, headRequest bool) {
		ours := readOursFraming(raw, headRequest)
		theirs := readGoFraming(raw, headRequest)
		if ours.headErr != nil {
			return
		}
		if theirs.headErr != nil {
			t.Fatalf("pooled client accepted a head Go rejects (%v): %q", theirs.headErr, raw)
		}
		if ours.status != theirs.status {
			t.Fatalf("status %d, Go %d: %q", ours.status, theirs.status, raw)
		}
		if ours.contentLength != theirs.contentLength {
			t.Fatalf("Content-Length passed on %q, Go %q: %q", ours.contentLength, theirs.contentLength, raw)
		}
		if ours.bodyErr != nil {
			return
		}
		if theirs.bodyErr != nil {
			t.Fatalf("pooled client read a body Go rejects (%v): %q", theirs.bodyErr, raw)
		}
		if !bytes.Equal(ours.body, theirs.body) {
			t.Fatalf("body %q, Go %q: %q", ours.body, theirs.body, raw)
		}
		if ours.keepAlive && !theirs.keepAlive {
			t.Fatalf("pooled client keeps the connection Go closes: %q", raw)
		}
	})
}

type framingResult struct {
	headErr, bodyErr error
	status           int
	contentLength    string // the one value passed on, "" for none, "many" for several
	body             []byte
	keepAlive        bool
}

func readOursFraming(raw []byte, headRequest bool) (res framingResult) {
	pc := &Conn{}
	pc.setReader(bytes.NewReader(raw))
	if _, res.headErr = pc.ReadHead(headRequest); res.headErr != nil {
		return res
	}
	res.status = pc.Head.Status
	hdr := http.Header{}
	// No field is hop-by-hop here: Content-Length, the one compared, never is.
	pc.Head.CopyHeader(hdr, func(string) bool { return false })
	res.contentLength = oneValue(hdr["Content-Length"])
	if body := pc.BodyReader(); body != nil {
		res.body, res.bodyErr = io.ReadAll(body)
	}
	res.keepAlive = pc.Head.KeepAlive
	return res
}

func readGoFraming(raw []byte, headRequest bool) (res framingResult) {
	req := &http.Request{Method: http.MethodGet}
	if headRequest {
		req.Method = http.MethodHead
	}
	br := bufio.NewReader(bytes.NewReader(raw))
	var resp *http.Response
	for {
		resp, res.headErr = http.ReadResponse(br, req)
		if res.headErr != nil {
			return res
		}
		if resp.StatusCode < 100 || resp.StatusCode > 199 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
	}
	res.status = resp.StatusCode
	res.contentLength = oneValue(resp.Header["Content-Length"])
	res.body, res.bodyErr = io.ReadAll(resp.Body)
	res.keepAlive = !resp.Close
	return res
}

func oneValue(vs []string) string {
	switch len(vs) {
	case 0:
		return ""
	case 1:
		return vs[0]
	}
	return "many"
}
