package backhaul

// Reading a response for the pooled client (h1.go): the head into a reused
// h1Head, at least as strictly as net/http reads it (FuzzResponseFraming),
// and the body by its framing.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// h1Head is the parsed head of the response being read on a connection.
type h1Head struct {
	status    int
	keepAlive bool
	body      bodyKind
	length    int64 // for bodyFixed
	// declaredUnsent: a response without a body (HEAD, 204, 304) that
	// declared a non-zero length or chunked framing anyway.
	declaredUnsent bool
	// state is the head's, for a request with a body (headAwaited…).
	state atomic.Int32

	// raw holds the canonical keys and the values of the header lines
	// back to back; fields index it. Once the head is read it is copied
	// into one string, so the whole header costs one allocation for its
	// text and one for its value slices.
	raw      []byte
	fields   []h1Field
	conn     []string // the Connection header's values
	trailers []string // the keys the Trailer header announces
}

type h1Field struct {
	kOff, kLen, vOff, vLen int
	key, value             string
}

type bodyKind uint8

const (
	bodyNone    bodyKind = iota
	bodyFixed            // Content-Length
	bodyChunked          // Transfer-Encoding: chunked
	bodyToClose          // neither: the body ends when the upstream closes
)

// readHead reads a response head on pc into pc.head, skipping 1xx
// responses (not passed on, as with the transport; their bytes count
// against the 1 MiB bound on the head, which is what bounds them). anyRead reports whether any byte of a response arrived, which
// tells a keep-alive race from an upstream failing mid-answer.
func (pc *h1Conn) readHead(headRequest bool) (anyRead bool, err error) {
	h := &pc.head
	total := 0
	for {
		h.reset()
		line, err := pc.readLine(&total)
		if err != nil {
			return total > 0, fmt.Errorf("read response status: %w", err)
		}
		var http10 bool
		if h.status, http10, err = parseStatusLine(line); err != nil {
			return true, err
		}
		if err := pc.readFields(&total); err != nil {
			return true, err
		}
		if h.status >= 200 {
			if err := h.finish(http10, headRequest); err != nil {
				return true, err
			}
			break
		}
		if h.status == http.StatusSwitchingProtocols {
			return true, errUnaskedSwitch
		}
	}
	pc.rd.headBy = time.Time{}
	return true, nil
}

func (h *h1Head) reset() {
	h.status, h.keepAlive, h.body, h.length, h.declaredUnsent = 0, false, bodyNone, 0, false
	if cap(h.raw) > 64<<10 {
		h.raw = nil // a huge head once should not stay with the connection
	}
	h.raw = h.raw[:0]
	clear(h.fields)
	h.fields = h.fields[:0]
	h.conn, h.trailers = h.conn[:0], h.trailers[:0]
}

// readLine reads one line of a head without its CRLF, counting its bytes
// in total against the 1 MiB bound on a response head. The line is valid
// until the next read.
func (pc *h1Conn) readLine(total *int) ([]byte, error) {
	line, err := pc.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		// Longer than the read buffer (a large cookie): gather it.
		long := append([]byte(nil), line...)
		for err == bufio.ErrBufferFull && *total+len(long) <= maxResponseHeaderBytes {
			line, err = pc.br.ReadSlice('\n')
			long = append(long, line...)
		}
		line = long
	}
	*total += len(line)
	if *total > maxResponseHeaderBytes {
		return nil, errHeaderTooLarge
	}
	if err != nil {
		if err == io.EOF && *total > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// parseStatusLine parses "HTTP/1.1 200 OK"; the reason phrase is not kept
// (the client gets the standard one).
func parseStatusLine(line []byte) (status int, http10 bool, err error) {
	var rest []byte
	switch {
	case bytes.HasPrefix(line, []byte("HTTP/1.1 ")):
		rest = line[9:]
	case bytes.HasPrefix(line, []byte("HTTP/1.0 ")):
		rest, http10 = line[9:], true
	default:
		return 0, false, fmt.Errorf("%w: status line %q", errMalformedResponse, truncate(line))
	}
	if len(rest) < 3 || (len(rest) > 3 && rest[3] != ' ') {
		return 0, false, fmt.Errorf("%w: status line %q", errMalformedResponse, truncate(line))
	}
	for _, c := range rest[:3] {
		if c < '0' || c > '9' {
			return 0, false, fmt.Errorf("%w: status line %q", errMalformedResponse, truncate(line))
		}
		status = status*10 + int(c-'0')
	}
	if status < 100 {
		return 0, false, fmt.Errorf("%w: status %d", errMalformedResponse, status)
	}
	return status, http10, nil
}

func truncate(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}

// readFields reads header lines up to the empty line into pc.head.raw and
// pc.head.fields, canonicalising keys as net/textproto does.
func (pc *h1Conn) readFields(total *int) error {
	h := &pc.head
	for {
		line, err := pc.readLine(total)
		if err != nil {
			return fmt.Errorf("read response header: %w", err)
		}
		if len(line) == 0 {
			break
		}
		// Obsolete line folding: RFC 7230 §3.2.4 lets a proxy refuse the
		// message with a 502, which is rarer than any client mishandling
		// a fold it passed on.
		if line[0] == ' ' || line[0] == '\t' {
			return fmt.Errorf("%w: folded header line", errMalformedResponse)
		}
		i := bytes.IndexByte(line, ':')
		if i <= 0 || !validTokenBytes(line[:i]) {
			return fmt.Errorf("%w: header line %q", errMalformedResponse, truncate(line))
		}
		v := bytes.Trim(line[i+1:], " \t")
		if !validValueBytes(v) {
			return fmt.Errorf("%w: header line %q", errMalformedResponse, truncate(line))
		}
		f := h1Field{kOff: len(h.raw), kLen: i}
		h.raw = appendCanonical(h.raw, line[:i])
		f.vOff, f.vLen = len(h.raw), len(v)
		h.raw = append(h.raw, v...)
		h.fields = append(h.fields, f)
	}
	return nil
}

// finish turns the fields into strings and decides the body's framing
// (RFC 9112 §6) and whether the connection stays open. It is at least as
// strict as http.ReadResponse, field by field (FuzzResponseFraming holds
// it to that):
//   - Content-Length is digits only; repeated identical values are one
//     (copyHeader passes one on), anything else is malformed;
//   - Transfer-Encoding is one field saying "chunked", and overrides a
//     Content-Length, which is dropped; the connection is closed after
//     such a message (RFC 9112 §6.3: it may be an attempt at smuggling);
//   - on an HTTP/1.0 response Transfer-Encoding does not frame the body,
//     and the connection is closed after it (RFC 9112 §6.1);
//   - a Trailer announcing a framing field is malformed, as Go has it.
func (h *h1Head) finish(http10, headRequest bool) error {
	block := string(h.raw)
	connClose, connKeepAlive := false, false
	var length, te string
	nLength, nTE := 0, 0
	for i := range h.fields {
		f := &h.fields[i]
		f.key, f.value = block[f.kOff:f.kOff+f.kLen], block[f.vOff:f.vOff+f.vLen]
		switch f.key {
		case "Connection":
			h.conn = append(h.conn, f.value)
			connClose = connClose || hasToken([]string{f.value}, "close")
			connKeepAlive = connKeepAlive || hasToken([]string{f.value}, "keep-alive")
		case "Content-Length":
			if nLength > 0 && f.value != length {
				return fmt.Errorf("%w: differing Content-Length values", errMalformedResponse)
			}
			length = f.value
			nLength++
		case "Transfer-Encoding":
			te = f.value
			nTE++
		case "Trailer":
			for v := f.value; v != ""; {
				var k string
				k, v, _ = strings.Cut(v, ",")
				if k = strings.TrimSpace(k); k != "" {
					h.trailers = append(h.trailers, http.CanonicalHeaderKey(k))
				}
			}
		}
	}
	h.keepAlive = !connClose && (!http10 || connKeepAlive)
	chunked := false
	if nTE > 0 && !http10 {
		// Only chunked is understood, as by http.Transport; any other
		// coding would have to be delimited by the close.
		if nTE > 1 || !strings.EqualFold(te, "chunked") {
			return fmt.Errorf("%w: unsupported Transfer-Encoding %q", errMalformedResponse, te)
		}
		chunked = true
	}
	if nTE > 0 && (http10 || nLength > 0) {
		h.keepAlive = false
	}
	var n int64
	if nLength > 0 {
		var ok bool
		if n, ok = parseLength(length); !ok {
			return fmt.Errorf("%w: Content-Length %q", errMalformedResponse, truncate([]byte(length)))
		}
	}
	if chunked {
		for _, k := range h.trailers {
			if k == "Transfer-Encoding" || k == "Trailer" || k == "Content-Length" {
				return fmt.Errorf("%w: Trailer announces %s", errMalformedResponse, k)
			}
		}
	}
	switch {
	case headRequest || h.status == http.StatusNoContent || h.status == http.StatusNotModified:
		h.body = bodyNone
		h.declaredUnsent = chunked || n > 0
	case chunked:
		h.body = bodyChunked
	case nLength > 0:
		h.body, h.length = bodyFixed, n
		if n == 0 {
			h.body = bodyNone
		}
	default:
		h.body, h.keepAlive = bodyToClose, false
	}
	return nil
}

// parseLength parses a Content-Length value: decimal digits only, no sign,
// no list, at most 63 bits (as http.ReadResponse requires).
func parseLength(s string) (int64, bool) {
	if s == "" || len(s) > 19 {
		return 0, false
	}
	var n uint64 // 19 digits fit
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return int64(n), n <= math.MaxInt64
}

// copyHeader copies the end-to-end fields into dst (w.Header()), sharing
// one backing array for their value slices. A repeated Content-Length
// (finish checked the values agree) is passed on once: two, even equal,
// make strict clients refuse the response.
func (h *h1Head) copyHeader(dst http.Header) {
	vals := make([]string, len(h.fields))
	for i := range h.fields {
		f := &h.fields[i]
		if isHopByHop(f.key) || (len(h.conn) > 0 && namedByConnection(h.conn, f.key)) {
			continue
		}
		if f.key == "Content-Length" && (h.body == bodyChunked || h.seenBefore(i, f.key)) {
			continue
		}
		vals[i] = f.value
		if prev, ok := dst[f.key]; ok && h.seenBefore(i, f.key) {
			dst[f.key] = append(prev, f.value)
			continue
		}
		dst[f.key] = vals[i : i+1 : i+1]
	}
}

// seenBefore reports whether a field before i has key: a repeated field
// (Set-Cookie) is appended to, a header dst had before is replaced.
func (h *h1Head) seenBefore(i int, key string) bool {
	for j := 0; j < i; j++ {
		if h.fields[j].key == key {
			return true
		}
	}
	return false
}

// respondH1 writes the response whose head pc.head holds to w, then its
// body and trailers. clean reports whether the body was read to its end,
// leaving the connection ready for another request.
func (p *Proxy) respondH1(w http.ResponseWriter, r *http.Request, pc *h1Conn, res *Result) (clean bool, err error) {
	head := &pc.head
	hdr := w.Header()
	head.copyHeader(hdr)
	noSniff(hdr)
	body := pc.bodyReader()
	if head.body == bodyChunked {
		// Trailers the upstream announced are announced to the client
		// too, so that the body is chunked and they can follow it.
		for _, k := range head.trailers {
			if !forbiddenTrailer(k) {
				hdr.Add("Trailer", k)
			}
		}
	}
	w.WriteHeader(head.status)
	res.Status = head.status
	if body == nil {
		return true, nil
	}
	// A body of unknown length may be a stream (server-sent events, long
	// poll, chunked progress): each piece goes out as it arrives. A body of
	// known length is left to the server's buffering.
	var rc *http.ResponseController
	if head.body != bodyFixed || isEventStream(hdr) {
		rc = http.NewResponseController(w)
		if err := rc.Flush(); err != nil {
			return false, clientGone(err)
		}
	}
	pool := &copyBufs
	if rc == nil && head.body == bodyFixed {
		pool = copyBufPool(head.length)
	}
	n, rerr, werr := copyBody(w, body, rc, pool)
	res.BytesOut = n
	switch {
	case werr != nil || r.Context().Err() != nil:
		return false, clientGone(errors.Join(werr, r.Context().Err()))
	case rerr != nil:
		// The upstream broke off mid-body; tryH1 closes the client's
		// connection to show the truncation, once this one is released.
		return false, &cutShortError{fmt.Errorf("read response body from %s: %w", res.Address, rerr)}
	}
	if head.body == bodyChunked {
		for _, t := range pc.chunks.trailer {
			if !forbiddenTrailer(t[0]) {
				hdr[http.TrailerPrefix+t[0]] = append(hdr[http.TrailerPrefix+t[0]], t[1])
			}
		}
	}
	return true, nil
}

// bodyReader returns the reader of the body whose head pc.head holds, nil
// when it has none.
func (pc *h1Conn) bodyReader() io.Reader {
	switch pc.head.body {
	case bodyFixed:
		pc.fixed.left = pc.head.length
		return &pc.fixed
	case bodyChunked:
		pc.chunks.reset()
		return &pc.chunks
	case bodyToClose:
		return &pc.close
	}
	return nil
}

// fixedBody reads a body delimited by Content-Length.
type fixedBody struct {
	br   *bufio.Reader
	left int64
}

func (b *fixedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.br.Read(p)
	b.left -= int64(n)
	if b.left == 0 {
		return n, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// closeBody reads a body delimited by the upstream closing the connection.
type closeBody struct{ br *bufio.Reader }

func (b *closeBody) Read(p []byte) (int, error) { return b.br.Read(p) }

// chunkedBody decodes a chunked body (RFC 7230 §4.1) and keeps its
// trailers. Each Read returns data of one chunk, so a stream's chunks are
// passed on as they arrive.
type chunkedBody struct {
	br      *bufio.Reader
	left    uint64 // bytes of the current chunk not yet read
	inChunk bool   // a chunk's data was begun: its CRLF is due after it
	err     error  // sticky: io.EOF once the last chunk and trailers are read
	trailer [][2]string
}

// Bounds on the framing of a chunked body, so an upstream cannot make the
// edge buffer without end.
const maxChunkLine = 4 << 10

func (c *chunkedBody) reset() {
	c.left, c.inChunk, c.err = 0, false, nil
	c.trailer = c.trailer[:0]
}

func (c *chunkedBody) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.left == 0 {
		if c.inChunk {
			if c.err = c.readCRLF(); c.err != nil {
				return 0, c.err
			}
			c.inChunk = false
		}
		size, err := c.readSize()
		if err != nil {
			c.err = err
			return 0, err
		}
		if size == 0 {
			if c.err = c.readTrailer(); c.err == nil {
				c.err = io.EOF
			}
			return 0, c.err
		}
		c.left, c.inChunk = size, true
	}
	if uint64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.br.Read(p)
	c.left -= uint64(n)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		c.err = err
	}
	return n, err
}

func (c *chunkedBody) readCRLF() error {
	b, err := c.br.Peek(2)
	if err != nil {
		return unexpected(err)
	}
	if b[0] != '\r' || b[1] != '\n' {
		return fmt.Errorf("%w: chunk not followed by CRLF", errMalformedResponse)
	}
	c.br.Discard(2)
	return nil
}

func (c *chunkedBody) line() ([]byte, error) {
	line, err := c.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull || len(line) > maxChunkLine {
		return nil, fmt.Errorf("%w: chunk line too long", errMalformedResponse)
	}
	if err != nil {
		return nil, unexpected(err)
	}
	// A bare LF ends no line of chunked framing (RFC 9112 §7.1; Go
	// refuses it too): reading one as a line end is how framing is
	// desynchronised between two parsers.
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("%w: chunk line ends with a bare LF", errMalformedResponse)
	}
	return line[:len(line)-2], nil
}

func (c *chunkedBody) readSize() (uint64, error) {
	line, err := c.line()
	if err != nil {
		return 0, err
	}
	// As Go reads it: trailing whitespace goes, then the extension (not
	// passed on); what is left is the size, hex digits only.
	line = bytes.TrimRight(line, " \t")
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	if len(line) == 0 || len(line) > 16 {
		return 0, fmt.Errorf("%w: chunk size %q", errMalformedResponse, truncate(line))
	}
	var n uint64
	for _, b := range line {
		switch {
		case '0' <= b && b <= '9':
			b -= '0'
		case 'a' <= b && b <= 'f':
			b -= 'a' - 10
		case 'A' <= b && b <= 'F':
			b -= 'A' - 10
		default:
			return 0, fmt.Errorf("%w: chunk size %q", errMalformedResponse, truncate(line))
		}
		n = n<<4 | uint64(b)
	}
	return n, nil
}

// readTrailer reads the trailer section after the last chunk.
func (c *chunkedBody) readTrailer() error {
	total := 0
	for {
		line, err := c.line()
		if err != nil {
			return err
		}
		if len(line) == 0 {
			return nil
		}
		if total += len(line); total > maxResponseHeaderBytes {
			return errHeaderTooLarge
		}
		i := bytes.IndexByte(line, ':')
		if i <= 0 || !validTokenBytes(line[:i]) {
			return fmt.Errorf("%w: trailer line %q", errMalformedResponse, truncate(line))
		}
		v := bytes.Trim(line[i+1:], " \t")
		if !validValueBytes(v) {
			return fmt.Errorf("%w: trailer line %q", errMalformedResponse, truncate(line))
		}
		k := string(appendCanonical(nil, line[:i]))
		c.trailer = append(c.trailer, [2]string{k, string(v)})
	}
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// appendCanonical appends key in canonical form ("content-type" →
// "Content-Type"), as net/textproto does for a valid token.
func appendCanonical(dst, key []byte) []byte {
	upper := true
	for _, c := range key {
		switch {
		case upper && 'a' <= c && c <= 'z':
			c -= 'a' - 'A'
		case !upper && 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		dst = append(dst, c)
		upper = c == '-'
	}
	return dst
}

// tokenChars marks the bytes of an RFC 7230 token.
var tokenChars = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

func validTokenBytes(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !tokenChars[c] {
			return false
		}
	}
	return true
}

func validValueBytes(b []byte) bool {
	for _, c := range b {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
