package backhaul

// Writing a request for the pooled client (h1.go): the head straight from
// the client's request, then its body, whole or chunked.

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"

	"github.com/scafo/scafo-edge/backhaul/internal/h1"
)

// writeRequest writes r's head to bw, then body (nil for none), and
// flushes them: the original request-URI bytes (docs/design.md rule 4), the
// Host, and the header fields by the forwarding policy f, as
// outboundHeader writes them for the transport. Nothing is allocated for
// the head: values are written where they are. f is taken by value so
// that the goroutine writing a body (roundTripH1Body) holds a copy.
func (p *Proxy) writeRequest(bw *bufio.Writer, r *http.Request, f forwarding, addr string, body *requestBody) error {
	target := r.RequestURI
	if target == "" || (target[0] != '/' && target != "*") {
		// Absolute form, or a request built in process: its path and
		// query in escaped form, as an upstream expects origin form.
		target = r.URL.RequestURI()
	}
	host := r.Host
	if host == "" {
		host = addr
	}
	if !h1.ValidMethod(r.Method) || !h1.ValidTarget(target) || !h1.ValidValue(host) {
		return errInvalidRequest
	}
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	bw.WriteString(target)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")

	for k, vs := range r.Header {
		if !f.passes(k) {
			continue
		}
		if !h1.ValidToken(k) {
			return errInvalidRequest
		}
		for _, v := range vs {
			if !h1.ValidValue(v) {
				return errInvalidRequest
			}
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if f.te {
		bw.WriteString("Te: trailers\r\n")
	}
	if f.client.IsValid() {
		bw.WriteString("X-Forwarded-For: ")
		for _, v := range f.priorXFF {
			if !h1.ValidValue(v) {
				return errInvalidRequest
			}
			bw.WriteString(v)
			bw.WriteString(", ")
		}
		bw.Write(f.client.AppendTo(bw.AvailableBuffer()))
		bw.WriteString("\r\n")
	}
	if f.proto != "" {
		bw.WriteString("X-Forwarded-Proto: ")
		bw.WriteString(f.proto)
		bw.WriteString("\r\n")
	}
	if f.host != "" {
		bw.WriteString("X-Forwarded-Host: ")
		bw.WriteString(f.host)
		bw.WriteString("\r\n")
	}
	if f.ownID != 0 {
		bw.WriteString("X-Request-Id: ")
		bw.Write(RequestID{own: f.ownID}.AppendTo(bw.AvailableBuffer()))
		bw.WriteString("\r\n")
	}
	switch {
	case body != nil && body.length >= 0:
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), body.length, 10))
		bw.WriteString("\r\n")
	case body != nil:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		// Many servers expect a length on a bodiless POST or DELETE; GET
		// and HEAD go without (as http.Transport writes them).
		bw.WriteString("Content-Length: 0\r\n")
	}
	bw.WriteString("\r\n")
	if body != nil {
		if err := writeBody(bw, body); err != nil {
			return err
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write request: %w", err)
	}
	return nil
}

// writeBody writes body to bw after the request's head (h1.WriteBody),
// through a pooled copy buffer. A body that ends short of its declared
// length is the client's failure: body.clientFailed is set.
func writeBody(bw *bufio.Writer, body *requestBody) error {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	err := h1.WriteBody(bw, body.buffered, body.length, body, *bp)
	if err == h1.ErrShortBody {
		body.clientFailed.Store(true)
	}
	return err
}
