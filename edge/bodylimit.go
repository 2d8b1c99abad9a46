package edge

// The bound on a request's body: --max-body-bytes, or an operator route's
// max_body_bytes in its place.

import (
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/scafo/scafo-edge/backhaul"
)

// errBodyTooLarge is what a cut body's Read returns past the limit. The
// handler does not match it (each upstream path wraps a body's error its
// own way): it asks the body whether it was crossed.
var errBodyTooLarge = errors.New("request body larger than the route accepts")

// bodyLimit returns the bound on route's request bodies, 0 for none.
func (h *Handler) bodyLimit(route *Route) int64 {
	if p := route.policy; p != nil && p.hasMaxBody {
		return p.maxBody
	}
	return h.MaxBodyBytes
}

// limitBody applies the route's bound to r's body: tooLarge when its
// declared length is over it, so that nothing is sent upstream; for a body
// of unknown length (chunked, or HTTP/2 and HTTP/3 without a
// content-length), r.Body is replaced by a cutBody, returned, that fails
// where the body crosses the bound. A body of known length within it needs
// nothing: the server reads no more than it declared.
func (h *Handler) limitBody(r *http.Request, route *Route) (_ *cutBody, tooLarge bool) {
	limit := h.bodyLimit(route)
	if limit <= 0 || r.Body == nil || r.Body == http.NoBody {
		return nil, false
	}
	if r.ContentLength > limit {
		return nil, true
	}
	if r.ContentLength >= 0 {
		return nil, false
	}
	b := &cutBody{rc: r.Body, left: limit}
	r.Body = b
	return b, false
}

// cutBody passes at most left bytes of a body on; the read that would go
// past them returns the bytes up to the bound and errBodyTooLarge, and
// crossed is set. The backhaul reads it on its own goroutine while the
// handler may look at crossed, hence the atomic.
type cutBody struct {
	rc      io.ReadCloser
	left    int64
	crossed atomic.Bool
}

func (b *cutBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, errBodyTooLarge
	}
	// One byte more than is left tells a body that ends at the bound from
	// one that goes on.
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.rc.Read(p)
	if int64(n) > b.left {
		n = int(b.left)
		b.left = -1
		b.crossed.Store(true)
		return n, errBodyTooLarge
	}
	b.left -= int64(n)
	return n, err
}

func (b *cutBody) Close() error { return b.rc.Close() }

// bodyCut ends a request whose body crossed its bound while it was being
// forwarded; the upstream attempt has failed with it, so the upstream never
// took the request as whole. With no response started the client is told
// 413; once one has started, its connection (HTTP/1) or stream is reset,
// so that it cannot take the response for the answer to a complete upload.
func (h *Handler) bodyCut(w http.ResponseWriter, r *http.Request, rec *Record) {
	if rec.Status == 0 {
		closeUnread(w, r)
		h.answer(w, r, rec, ReasonBodyTooLarge)
		return
	}
	rec.Reason = ReasonBodyTooLarge
	if !backhaul.CloseClient(w) {
		// HTTP/2 and HTTP/3 streams are reset by a panic, once the
		// request is observed (ServeHTTP).
		rec.reset = true
	}
}

var connClose = []string{"close"}

// closeUnread has r's HTTP/1 connection closed once the answer is out,
// the rest of its body unread: the connection cannot carry another
// request. Connection: close alone is not enough: after the handler
// returns, net/http reads up to 256 KiB of an unread body, with no
// deadline, so a client that waits for 100 Continue, or a body that
// never comes, would hold the connection for ever. A read deadline
// already passed ends that read at once; the answer, written before it,
// is not affected.
func closeUnread(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 1 {
		return
	}
	w.Header()["Connection"] = connClose
	http.NewResponseController(w).SetReadDeadline(time.Now())
}
