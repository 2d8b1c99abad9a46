package encode

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// writer decides, once the response's head is known, whether to compress
// it. A head without a Content-Length is held until MinSize bytes have come,
// the handler flushes, or it ends: a short body goes out as it is, with its
// length.
type writer struct {
	http.ResponseWriter
	h      *handler
	coding coding
	gzipOK bool // the client takes gzip: a stream is compressed with it

	state  writerState
	status int    // held while pending
	buf    []byte // body held while pending, up to MinSize
	enc    encoder
	// hijacked is set once the connection was taken over (backhaul closes
	// a client's connection under a response cut short): nothing more is
	// written.
	hijacked bool
}

type writerState uint8

const (
	undecided   writerState = iota // no head yet
	pending                        // head held, body buffered
	passing                        // as the handler wrote it
	compressing                    // through enc
)

func (w *writer) WriteHeader(status int) {
	if w.state != undecided {
		if w.state == passing {
			w.ResponseWriter.WriteHeader(status) // net/http says it is superfluous
		}
		return
	}
	if status < 200 {
		// 1xx informational (103 Early Hints); 101 never comes here, an
		// upgrade request is not wrapped.
		w.ResponseWriter.WriteHeader(status)
		return
	}
	hdr := w.Header()
	if !w.eligible(status, hdr) {
		w.state = passing
		w.ResponseWriter.WriteHeader(status)
		return
	}
	if cl := hdr.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err != nil || n < int64(w.h.o.MinSize) {
			w.state = passing
			w.ResponseWriter.WriteHeader(status)
			return
		}
		w.startCompressing(status)
		return
	}
	w.state, w.status = pending, status
}

// eligible reports whether a response with this head may be compressed,
// whatever its length.
func (w *writer) eligible(status int, hdr http.Header) bool {
	switch {
	case status == http.StatusNoContent, status == http.StatusNotModified, status == http.StatusPartialContent:
		return false
	case hdr.Get("Content-Range") != "":
		return false
	case hdr.Get("Content-Encoding") != "" && !strings.EqualFold(hdr.Get("Content-Encoding"), "identity"):
		return false
	case hasToken(hdr["Cache-Control"], "no-transform"):
		return false
	case !compressible(hdr.Get("Content-Type")):
		return false
	case w.h.o.Short != nil && w.h.o.Short():
		return false
	}
	return true
}

// startCompressing sends the head of a compressed response and readies the
// encoder.
func (w *writer) startCompressing(status int) {
	hdr := w.Header()
	hdr.Del("Content-Length")
	hdr.Set("Content-Encoding", w.coding.String())
	if !hasToken(hdr["Vary"], "Accept-Encoding") {
		hdr.Add("Vary", "Accept-Encoding")
	}
	if et := hdr.Get("Etag"); et != "" && !strings.HasPrefix(et, "W/") {
		hdr.Set("Etag", "W/"+et)
	}
	if hdr.Get("Accept-Ranges") != "" {
		hdr.Del("Accept-Ranges") // ranges of the coded bytes are not offered
	}
	w.ResponseWriter.WriteHeader(status)
	w.enc = getEncoder(w.coding, w.ResponseWriter)
	w.state = compressing
}

func (w *writer) Write(p []byte) (int, error) {
	if w.state == undecided {
		if _, ok := w.Header()["Content-Type"]; !ok && len(p) > 0 {
			// What net/http's first Write would set, so that the
			// decision sees it.
			w.Header().Set("Content-Type", http.DetectContentType(p))
		}
		w.WriteHeader(http.StatusOK)
	}
	switch w.state {
	case compressing:
		return w.enc.Write(p)
	case pending:
		if len(w.buf)+len(p) < w.h.o.MinSize {
			w.buf = append(w.buf, p...)
			return len(p), nil
		}
		w.startCompressing(w.status)
		if err := w.writeHeld(); err != nil {
			return 0, err
		}
		return w.enc.Write(p)
	}
	return w.ResponseWriter.Write(p)
}

// writeHeld writes the body held while pending through the encoder.
func (w *writer) writeHeld() error {
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.enc.Write(w.buf)
	w.buf = w.buf[:0]
	return err
}

// Flush sends what the handler wrote so far: a held head is decided (see
// startStream), the encoder flushed.
func (w *writer) Flush() { w.FlushError() }

// FlushError is Flush, reporting the client's error; http.ResponseController
// calls it.
func (w *writer) FlushError() error {
	switch w.state {
	case undecided:
		w.WriteHeader(http.StatusOK)
		if w.state == pending {
			return w.FlushError()
		}
	case pending:
		if err := w.startStream(); err != nil {
			return err
		}
		if w.state != compressing {
			break
		}
		fallthrough
	case compressing:
		if err := w.enc.Flush(); err != nil {
			return err
		}
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// startStream decides a held head at a flush, before MinSize bytes came:
// the response is a stream (a long poll, progress, a body the upstream
// sends in pieces), which may stay open long and flush often. A full
// encoder holds its window (a MiB or two) for as long as the stream, so a
// stream is compressed with gzip that keeps no state between writes, when
// the client takes gzip, and is sent as it is when it does not.
func (w *writer) startStream() error {
	if !w.gzipOK {
		w.state = passing
		w.ResponseWriter.WriteHeader(w.status)
		if len(w.buf) > 0 {
			_, err := w.ResponseWriter.Write(w.buf)
			w.buf = w.buf[:0]
			return err
		}
		return nil
	}
	w.coding = codingGzipStream
	w.startCompressing(w.status)
	return w.writeHeld()
}

// Unwrap gives http.ResponseController the writer underneath, for the
// deadlines it offers.
func (w *writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack takes the connection over, and notes that nothing more is to be
// written on it.
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.hijacked = true
	}
	return c, rw, err
}

// abandon lets the encoder go without writing its end: the response was
// given up on.
func (w *writer) abandon() {
	if w.enc != nil {
		putEncoder(w.coding, w.enc)
		w.enc = nil
	}
	w.state = passing
}

// finish ends the response once the handler has returned: a held short
// body goes out as it is, a compressed one gets its encoder's end.
func (w *writer) finish() {
	if w.hijacked {
		w.abandon()
		return
	}
	switch w.state {
	case pending:
		if !hasTrailers(w.Header()) { // a length would leave no room for them
			w.Header().Set("Content-Length", strconv.Itoa(len(w.buf)))
		}
		w.ResponseWriter.WriteHeader(w.status)
		w.ResponseWriter.Write(w.buf)
	case compressing:
		w.enc.Close()
		putEncoder(w.coding, w.enc)
	}
}

// hasTrailers reports whether the handler announced or set trailers.
func hasTrailers(h http.Header) bool {
	if len(h["Trailer"]) > 0 {
		return true
	}
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

// hasToken reports whether the comma-separated values hold tok, compared
// case-insensitively.
func hasToken(values []string, tok string) bool {
	for _, v := range values {
		for v != "" {
			var item string
			item, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(strings.TrimSpace(item), tok) {
				return true
			}
		}
	}
	return false
}
