package backhaul

// Writing a request for the pooled client (h1.go): the head straight from
// the client's request, then its body, whole or chunked.

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// writeRequest writes r's head to bw, then body (nil for none), and
// flushes them: the original request-URI bytes (DESIGN.md rule 4), the
// Host, the end-to-end headers and the X-Forwarded-* set, by the rules
// outboundHeader applies for the transport. Nothing is allocated for the
// head: values are written where they are.
func (p *Proxy) writeRequest(bw *bufio.Writer, r *http.Request, addr string, body *requestBody) error {
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
	if !validMethod(r.Method) || !validTarget(target) || !validValue(host) {
		return errInvalidRequest
	}
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	bw.WriteString(target)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")

	in := r.Header
	conn := in["Connection"]
	client, clientOK := clientAddr(r.RemoteAddr)
	trusted := clientOK && p.isTrusted(client)
	var priorXFF []string
	hasProto, hasXFHost := false, false
	for k, vs := range in {
		if isHopByHop(k) || k == "Host" || k == "Content-Length" ||
			(conn != nil && namedByConnection(conn, k)) || aliasesProtected(k) {
			continue
		}
		if isForwarding(k) {
			if !trusted {
				continue
			}
			switch k {
			case headerXFF:
				priorXFF = vs
				continue
			case headerXFProto:
				hasProto = true
			case headerXFHost:
				hasXFHost = true
			}
		}
		if !validToken(k) {
			return errInvalidRequest
		}
		for _, v := range vs {
			if !validValue(v) {
				return errInvalidRequest
			}
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	// "TE: trailers" is the one TE value a proxy that forwards trailers
	// may pass on (gRPC clients send it).
	if te := in["Te"]; te != nil && hasToken(te, "trailers") {
		bw.WriteString("Te: trailers\r\n")
	}
	if clientOK {
		bw.WriteString("X-Forwarded-For: ")
		for _, v := range priorXFF {
			if !validValue(v) {
				return errInvalidRequest
			}
			bw.WriteString(v)
			bw.WriteString(", ")
		}
		bw.Write(client.AppendTo(bw.AvailableBuffer()))
		bw.WriteString("\r\n")
	}
	if !hasProto {
		if r.TLS != nil {
			bw.WriteString("X-Forwarded-Proto: https\r\n")
		} else {
			bw.WriteString("X-Forwarded-Proto: http\r\n")
		}
	}
	if !hasXFHost && r.Host != "" {
		bw.WriteString("X-Forwarded-Host: ")
		bw.WriteString(r.Host)
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

// writeBody writes body to bw: its declared length exactly, or chunked
// when the length is unknown. A streamed body is flushed as it is read,
// the head first, so that an upload flows and an upstream can answer from
// the head alone. A body that ends short of its declared length is the
// client's failure (body.clientFailed is set).
func writeBody(bw *bufio.Writer, body *requestBody) error {
	if body.buffered != nil {
		if _, err := bw.Write(body.buffered); err != nil {
			return fmt.Errorf("write request body: %w", err)
		}
		return nil
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write request: %w", err)
	}
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	left := body.length
	for left != 0 {
		chunk := buf
		if left > 0 && int64(len(chunk)) > left {
			chunk = chunk[:left]
		}
		n, rerr := body.Read(chunk)
		if n > 0 {
			var err error
			if left > 0 {
				left -= int64(n)
				bw.Write(chunk[:n])
				err = bw.Flush()
			} else {
				err = writeChunk(bw, chunk[:n])
			}
			if err != nil {
				return fmt.Errorf("write request body: %w", err)
			}
		}
		switch {
		case rerr == io.EOF && left > 0:
			body.clientFailed.Store(true)
			return fmt.Errorf("read request body: %w", io.ErrUnexpectedEOF)
		case rerr == io.EOF:
			left = 0
		case rerr != nil:
			return fmt.Errorf("read request body: %w", rerr)
		}
	}
	if body.length < 0 {
		// The last chunk; the request's trailers are the transport's.
		bw.WriteString("0\r\n\r\n")
	}
	return nil
}

// writeChunk writes p as one chunk and flushes it.
func writeChunk(bw *bufio.Writer, p []byte) error {
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(p)), 16))
	bw.WriteString("\r\n")
	bw.Write(p)
	bw.WriteString("\r\n")
	return bw.Flush()
}

func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenChars[s[i]] {
			return false
		}
	}
	return true
}

func validMethod(m string) bool { return validToken(m) }

// validValue reports whether a header value has no control byte other than
// tab: a CR or LF would end the line and smuggle a header in.
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// validTarget reports whether a request target can go on the request line:
// no space or control byte.
func validTarget(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}
