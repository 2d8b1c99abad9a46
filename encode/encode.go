// Package encode compresses the responses the edge sends for the clients
// that ask: zstd or gzip, chosen from Accept-Encoding with its q-values, for
// compressible types above a small size, when the application did not
// compress them itself. It is Caddy's encode and Traefik's compress in front
// of every application of the fleet. It owns the content coding of a
// response and nothing else: it knows nothing of routing, upstreams or TLS,
// and wraps whatever handler it is given.
//
// A response stays as the application sent it when it is already encoded,
// marked Cache-Control: no-transform, a range (or a request for one), the
// answer to HEAD, a 1xx, 204 or 304, a tunnel (an upgrade), a server-sent
// event stream, of a type that does not compress, or smaller than MinSize.
// A compressed one gets Vary: Accept-Encoding, loses its Content-Length, and
// a strong ETag is made weak (the bytes differ; the representation does
// not). Each Flush of the handler flushes the encoder and reaches the
// client, so streamed responses stay streamed.
package encode

import (
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/scafo/scafo-edge/internal/qvalue"
)

// DefaultMinSize is the smallest body compressed when Options.MinSize is
// zero: below it a coding's framing costs about what it saves.
const DefaultMinSize = 512

// Options configure Handler. The zero value compresses with the defaults.
type Options struct {
	// MinSize is the smallest body compressed, in bytes. Zero:
	// DefaultMinSize.
	MinSize int
	// Short, if non-nil, reports whether the edge is short of memory: while
	// it is, no new response is compressed (each holds an encoder's
	// window). Nil: never short.
	Short func() bool
	// Skip, if non-nil, reports whether r's response must not be compressed
	// (a route that turns compression off, say). Nil: none is skipped.
	Skip func(r *http.Request) bool
}

// Handler returns next with its responses compressed for the clients that
// accept zstd or gzip.
func Handler(next http.Handler, o Options) http.Handler {
	if o.MinSize <= 0 {
		o.MinSize = DefaultMinSize
	}
	return &handler{next: next, o: o}
}

type handler struct {
	next http.Handler
	o    Options
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c, gzipOK := h.coding(r)
	if c == identity {
		h.next.ServeHTTP(w, r)
		return
	}
	cw := writers.Get().(*writer)
	*cw = writer{ResponseWriter: w, h: h, coding: c, gzipOK: gzipOK, buf: cw.buf[:0]}
	defer func() {
		if p := recover(); p != nil {
			// The handler gave up on the response (http.ErrAbortHandler):
			// its end must not be written after all.
			cw.abandon()
			panic(p)
		}
		cw.finish()
		*cw = writer{buf: cw.buf[:0]} // holds no request while pooled
		writers.Put(cw)
	}()
	h.next.ServeHTTP(cw, r)
}

var writers = sync.Pool{New: func() any { return &writer{buf: make([]byte, 0, DefaultMinSize)} }}

// coding is the content coding chosen for r's response, identity when it
// is not to be compressed whatever it turns out to be, and whether the
// client takes gzip (for a stream: see writer.startStream).
func (h *handler) coding(r *http.Request) (coding, bool) {
	// HTTP/1.0 has no chunks: a compressed body without its length ends
	// with the connection, and one the upstream cut short would look whole.
	if r.Method == http.MethodHead || !r.ProtoAtLeast(1, 1) || r.Header.Get("Range") != "" || r.Header.Get("Upgrade") != "" {
		return identity, false
	}
	if h.o.Skip != nil && h.o.Skip(r) {
		return identity, false
	}
	return negotiate(r.Header["Accept-Encoding"])
}

// coding is a content coding the edge produces.
type coding uint8

const (
	identity coding = iota
	codingZstd
	codingGzip
	// codingGzipStream is gzip that keeps no state between writes, for a
	// stream: see writer.startStream.
	codingGzipStream
)

func (c coding) String() string {
	switch c {
	case codingZstd:
		return "zstd"
	case codingGzip, codingGzipStream:
		return "gzip"
	}
	return "identity"
}

// negotiate picks the coding with the highest q-value among those the edge
// produces (RFC 9110 §12.5.3), zstd on a tie: it compresses better at less
// CPU. "*" stands for every coding not named; q=0 refuses one.
func negotiate(values []string) (best coding, gzipOK bool) {
	zq, gq, star := -1, -1, -1 // in thousandths; -1: not named
	for _, v := range values {
		for v != "" {
			var item string
			item, v, _ = strings.Cut(v, ",")
			name, params, _ := strings.Cut(item, ";")
			name = strings.TrimSpace(name)
			q := qvalue.FromParams(params)
			switch {
			case strings.EqualFold(name, "zstd"):
				zq = q
			case strings.EqualFold(name, "gzip"), strings.EqualFold(name, "x-gzip"):
				gq = max(gq, q)
			case name == "*":
				star = q
			}
		}
	}
	if zq < 0 {
		zq = star
	}
	if gq < 0 {
		gq = star
	}
	switch {
	case zq > 0 && zq >= gq:
		return codingZstd, gq > 0
	case gq > 0:
		return codingGzip, true
	}
	return identity, false
}

// compressible reports whether a body of this Content-Type gains from
// compression: text (but server-sent events, which are read event by
// event), JSON, JavaScript, XML, SVG and WebAssembly.
func compressible(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	switch {
	case mt == "text/event-stream":
		return false
	case strings.HasPrefix(mt, "text/"):
		return true
	case strings.HasSuffix(mt, "+json"), strings.HasSuffix(mt, "+xml"):
		return true
	}
	switch mt {
	case "application/json", "application/javascript", "application/x-javascript", "application/ecmascript",
		"application/xml", "image/svg+xml", "application/wasm", "application/manifest+json",
		"application/x-ndjson", "application/graphql-response+json", "application/xhtml+xml":
		return true
	}
	return false
}

// An encoder is a pooled zstd or gzip stream writer.
type encoder interface {
	io.WriteCloser
	Flush() error
	Reset(io.Writer)
}

var (
	gzipEncoders = sync.Pool{New: func() any {
		// Level 5, Caddy's default: most of level 9's ratio at a
		// fraction of its CPU.
		w, _ := gzip.NewWriterLevel(nil, 5)
		return w
	}}
	gzipStreamEncoders = sync.Pool{New: func() any {
		w, _ := gzip.NewWriterLevel(nil, gzip.StatelessCompression)
		return w
	}}
	zstdEncoders = sync.Pool{New: func() any {
		// One goroutine, and a window of 128 KiB with the lower-memory
		// tables: an encoder per compressing response, each bounded.
		w, _ := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(128<<10),
			zstd.WithLowerEncoderMem(true), zstd.WithZeroFrames(true))
		return w
	}}
)

func getEncoder(c coding, w io.Writer) encoder {
	e := encoders(c).Get().(encoder)
	e.Reset(w)
	return e
}

func putEncoder(c coding, e encoder) {
	e.Reset(nil)
	encoders(c).Put(e)
}

func encoders(c coding) *sync.Pool {
	switch c {
	case codingZstd:
		return &zstdEncoders
	case codingGzipStream:
		return &gzipStreamEncoders
	}
	return &gzipEncoders
}
