package backhaul

// Relaying a response the pooled client read (h1.go) to the client: the
// head the h1 package parsed, then the body by its framing, then trailers.

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/scafo/scafo-edge/backhaul/internal/h1"
)

// relayH1 is relay for the pooled client: it writes the response to w
// (respondH1), waits for the request's writer, and returns the connection
// to the pool when the exchange left it clean, or closes it.
func (p *Proxy) relayH1(w http.ResponseWriter, out *outbound, ans answer, res *Result) error {
	pc := ans.pc
	clean, err := p.respondH1(w, out.r, pc, res)
	if out.body != nil {
		clean = endWrite(pc, out.w, out.body) && clean
		res.BytesIn = out.body.sent()
	}
	pc.End()
	if clean && pc.Reusable() {
		// Stamped now, not with the exchange's start: under pressure
		// the edge closes the connections idle for a second, and a long
		// poll's would look idle that long the moment it ended.
		p.pool.Put(pc, time.Now())
	} else {
		pc.NC.Close()
	}
	if _, cut := err.(*cutShortError); cut {
		// Closing the client's connection is what shows it the
		// truncation; over HTTP/2 this panics, so it comes last.
		abort(w)
	}
	return err
}

// respondH1 writes the response whose head pc.Head holds to w, then its
// body and trailers. clean reports whether the body was read to its end,
// leaving the connection ready for another request.
func (p *Proxy) respondH1(w http.ResponseWriter, r *http.Request, pc *h1.Conn, res *Result) (clean bool, err error) {
	head := &pc.Head
	hdr := w.Header()
	head.CopyHeader(hdr, isHopByHop)
	noSniff(hdr)
	body := pc.BodyReader()
	if head.Body == h1.BodyChunked {
		// Trailers the upstream announced are announced to the client
		// too, so that the body is chunked and they can follow it.
		for _, k := range head.Trailers {
			if !forbiddenTrailer(k) {
				hdr.Add("Trailer", k)
			}
		}
	}
	w.WriteHeader(head.Status)
	res.Status = head.Status
	if body == nil {
		return true, nil
	}
	// A body of unknown length may be a stream (server-sent events, long
	// poll, chunked progress): each piece goes out as it arrives. A body of
	// known length is left to the server's buffering.
	var rc *http.ResponseController
	if head.Body != h1.BodyFixed || isEventStream(hdr) {
		rc = http.NewResponseController(w)
		if err := rc.Flush(); err != nil {
			return false, clientGone(err)
		}
	}
	pool := &copyBufs
	if rc == nil && head.Body == h1.BodyFixed {
		pool = copyBufPool(head.Length)
	}
	n, rerr, werr := copyBody(w, body, rc, pool)
	res.BytesOut = n
	switch {
	case werr != nil || r.Context().Err() != nil:
		return false, clientGone(errors.Join(werr, r.Context().Err()))
	case rerr != nil:
		// The upstream broke off mid-body; relayH1 closes the client's
		// connection to show the truncation, once this one is released.
		return false, &cutShortError{fmt.Errorf("read response body from %s: %w", res.Address, rerr)}
	}
	if head.Body == h1.BodyChunked {
		for _, t := range pc.Trailer() {
			if !forbiddenTrailer(t[0]) {
				hdr[http.TrailerPrefix+t[0]] = append(hdr[http.TrailerPrefix+t[0]], t[1])
			}
		}
	}
	return true, nil
}
