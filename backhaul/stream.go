package backhaul

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
)

// Body copies use pooled buffers: one per in-flight response, returned as
// soon as the body is done. Tunnels hold theirs for the life of the
// connection, so they take smaller ones: ten thousand idle WebSockets then
// hold 160 MiB rather than 640 MiB.
//
// A body of known length at least bigCopyBufSize long takes a bigger buffer:
// each piece costs a read, a write and usually a park and wake-up, and with
// 32 KiB pieces that overhead was a quarter of the CPU of a 1 MiB response.
// Streams and shorter bodies keep the small one, so that ten
// thousand server-sent event streams do not hold 2.5 GiB.
const (
	copyBufSize    = 32 << 10
	bigCopyBufSize = 256 << 10
	tunnelBufSize  = 8 << 10
)

var (
	copyBufs    = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}
	bigCopyBufs = sync.Pool{New: func() any { b := make([]byte, bigCopyBufSize); return &b }}
	tunnelBufs  = sync.Pool{New: func() any { b := make([]byte, tunnelBufSize); return &b }}
)

// copyBufPool returns the pool to copy a body of length n from, -1 when
// unknown.
func copyBufPool(n int64) *sync.Pool {
	if n >= bigCopyBufSize {
		return &bigCopyBufs
	}
	return &copyBufs
}

// respond writes the upstream's response to w: headers, then the body as it
// arrives, then trailers. An upgrade (101) becomes a tunnel.
func (p *Proxy) respond(w http.ResponseWriter, r *http.Request, resp *http.Response, upgrade string, res *Result) error {
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return p.tunnel(w, resp, upgrade, res)
	}
	defer resp.Body.Close()

	h := w.Header()
	copyResponseHeader(h, resp.Header)
	noSniff(h)
	// Trailers the upstream announced are announced to the client too, so
	// that the body is chunked and they can follow it.
	for k := range resp.Trailer {
		if !forbiddenTrailer(k) {
			h.Add("Trailer", k)
		}
	}
	w.WriteHeader(resp.StatusCode)
	res.Status = resp.StatusCode

	// A body of unknown length may be a stream (server-sent events, long
	// poll, chunked progress): each piece goes out as it arrives. A body of
	// known length is left to the server's buffering.
	var rc *http.ResponseController
	if resp.ContentLength == -1 || isEventStream(resp.Header) {
		rc = http.NewResponseController(w)
		if err := rc.Flush(); err != nil {
			return clientGone(err)
		}
	}
	pool := &copyBufs
	if rc == nil {
		pool = copyBufPool(resp.ContentLength)
	}
	n, rerr, werr := copyBody(w, resp.Body, rc, pool)
	res.BytesOut = n
	switch {
	case werr != nil || r.Context().Err() != nil:
		// The client went away; closing resp.Body drops the upstream
		// connection rather than draining it.
		return clientGone(errors.Join(werr, r.Context().Err()))
	case rerr != nil:
		// The upstream broke off mid-body. Ending the handler normally
		// would make the response look complete to the client (a chunked
		// body gets its terminator); closing the connection does not.
		abort(w)
		return fmt.Errorf("read response body from %s: %w", res.Address, rerr)
	}
	for k, v := range resp.Trailer {
		if !forbiddenTrailer(k) {
			h[http.TrailerPrefix+k] = v
		}
	}
	return nil
}

// copyBody copies src to w through a buffer from pool, flushing after every
// write when rc is set. It returns the bytes written and the read and write
// errors apart, since they blame different parties. io.Copy is not used:
// w's ReadFrom would bypass both the pool and the flushing.
func copyBody(w io.Writer, src io.Reader, rc *http.ResponseController, pool *sync.Pool) (n int64, rerr, werr error) {
	bp := pool.Get().(*[]byte)
	defer pool.Put(bp)
	buf := *bp
	for {
		nr, err := src.Read(buf)
		if nr > 0 {
			nw, err := w.Write(buf[:nr])
			n += int64(nw)
			if err != nil {
				return n, nil, err
			}
			if rc != nil {
				if err := rc.Flush(); err != nil {
					return n, nil, err
				}
			}
		}
		if err == io.EOF {
			return n, nil, nil
		}
		if err != nil {
			return n, err, nil
		}
	}
}

// isEventStream reports whether the response is server-sent events, which
// must be flushed per event even if a length were declared.
func isEventStream(h http.Header) bool {
	ct := h["Content-Type"]
	if len(ct) == 0 || !strings.HasPrefix(strings.ToLower(ct[0]), "text/event-stream") {
		return false
	}
	mt, _, _ := mime.ParseMediaType(ct[0])
	return mt == "text/event-stream"
}

// noSniff keeps the server from adding a Content-Type the upstream did
// not send: it would guess one from the body's first bytes, and a proxy
// passes the upstream's answer, not its own reading of it.
func noSniff(h http.Header) {
	if _, ok := h["Content-Type"]; !ok {
		h["Content-Type"] = nil
	}
}

// abort closes the client's connection under a response already started,
// so that the client sees it cut short.
func abort(w http.ResponseWriter) {
	if !CloseClient(w) {
		// HTTP/2 cannot be hijacked; this panic resets the stream and is
		// not logged by net/http.
		panic(http.ErrAbortHandler)
	}
}

// CloseClient closes the client's HTTP/1 connection under w, with no
// further byte: the TCP connection itself, as a TLS close_notify could
// wait on a client that does not read. It reports false over HTTP/2 and
// HTTP/3, whose connections cannot be hijacked.
func CloseClient(w http.ResponseWriter) bool {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return false
	}
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	conn.Close()
	return true
}

// tunnel completes a protocol switch: it checks the upstream switched to
// what the client asked for, writes the 101 to the client's hijacked
// connection and copies bytes both ways until either side closes.
func (p *Proxy) tunnel(w http.ResponseWriter, resp *http.Response, upgrade string, res *Result) error {
	back, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return fmt.Errorf("%w: %w: %s: 101 without a writable body", ErrNoUpstream, ErrUpstreamFailed, res.Address)
	}
	got := upgradeProtocol(resp.Header)
	if upgrade == "" || !strings.EqualFold(got, upgrade) {
		back.Close()
		return fmt.Errorf("%w: %w: %s: switched to %q, client asked for %q",
			ErrNoUpstream, ErrUpstreamFailed, res.Address, got, upgrade)
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		back.Close()
		return fmt.Errorf("%w: hijack client connection: %w", ErrNoUpstream, err)
	}
	defer conn.Close()
	defer back.Close()

	h := w.Header()
	copyResponseHeader(h, resp.Header)
	h["Connection"] = connUpgrade
	h["Upgrade"] = []string{got}
	res.Status = http.StatusSwitchingProtocols
	if _, err := brw.WriteString("HTTP/1.1 101 Switching Protocols\r\n"); err != nil {
		return clientGone(err)
	}
	if err := h.Write(brw); err != nil {
		return clientGone(err)
	}
	if _, err := brw.WriteString("\r\n"); err != nil {
		return clientGone(err)
	}
	if err := brw.Flush(); err != nil {
		return clientGone(err)
	}
	// Bytes the client sent after its request (a client need not wait for
	// the 101) sit in the server's read buffer.
	if n := brw.Reader.Buffered(); n > 0 {
		pending, _ := brw.Reader.Peek(n)
		if _, err := back.Write(pending); err != nil {
			return fmt.Errorf("tunnel to %s: %w", res.Address, err)
		}
		res.BytesIn += int64(n)
	}

	type result struct {
		toUpstream bool
		n          int64
	}
	done := make(chan result, 2)
	pump := func(dst io.Writer, src io.Reader, toUpstream bool) {
		bp := tunnelBufs.Get().(*[]byte)
		defer tunnelBufs.Put(bp)
		n, _ := io.CopyBuffer(writerOnly{dst}, readerOnly{src}, *bp)
		done <- result{toUpstream, n}
	}
	go pump(back, conn, true)
	go pump(conn, back, false)
	// When one direction ends the tunnel is over: closing both connections
	// ends the other copy, so both goroutines are gone when this returns.
	for i := 0; i < 2; i++ {
		r := <-done
		if i == 0 {
			conn.Close()
			back.Close()
		}
		if r.toUpstream {
			res.BytesIn += r.n
		} else {
			res.BytesOut += r.n
		}
	}
	return nil
}

// writerOnly and readerOnly hide ReadFrom and WriteTo so io.CopyBuffer uses
// the pooled buffer instead of allocating its own.
type writerOnly struct{ io.Writer }
type readerOnly struct{ io.Reader }
