package h1

// Reading a response head into a reused Head, at least as strictly as
// net/http reads it (FuzzResponseFraming holds it to that).

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"
)

// Head is the parsed head of the response being read on a connection.
type Head struct {
	Status    int
	KeepAlive bool // the connection may carry another exchange
	Body      BodyKind
	Length    int64 // for BodyFixed
	// DeclaredUnsent: a response without a body (HEAD, 204, 304) that
	// declared a non-zero length or chunked framing anyway.
	DeclaredUnsent bool
	// Trailers are the keys the Trailer header announces, canonical.
	Trailers []string

	// raw holds the canonical keys and the values of the header lines
	// back to back; fields index it. Once the head is read it is copied
	// into one string, so the whole header costs one allocation for its
	// text and one for its value slices.
	raw    []byte
	fields []field
	conn   []string // the Connection header's values
}

type field struct {
	kOff, kLen, vOff, vLen int
	key, value             string
}

// BodyKind is how a response body is delimited (RFC 9112 §6).
type BodyKind uint8

const (
	BodyNone    BodyKind = iota
	BodyFixed            // Content-Length
	BodyChunked          // Transfer-Encoding: chunked
	BodyToClose          // neither: the body ends when the upstream closes
)

// ReadHead reads a response head on pc into pc.Head, skipping 1xx
// responses (not passed on, as http.Transport does not; their bytes count
// against MaxHeaderBytes, which is what bounds them). anyRead reports
// whether any byte of a response arrived, which tells a keep-alive race
// from an upstream failing mid-answer. headRequest says the request was a
// HEAD: its response has no body, whatever it declares.
func (pc *Conn) ReadHead(headRequest bool) (anyRead bool, err error) {
	h := &pc.Head
	total := 0
	for {
		h.reset()
		line, err := pc.readLine(&total)
		if err != nil {
			return total > 0, fmt.Errorf("read response status: %w", err)
		}
		var http10 bool
		if h.Status, http10, err = parseStatusLine(line); err != nil {
			return true, err
		}
		if err := pc.readFields(&total); err != nil {
			return true, err
		}
		// A 1xx head has no body, but its framing fields are held to the
		// final head's rules all the same: http.ReadResponse rejects a
		// malformed Content-Length on a 100 Continue too.
		if err := h.finish(http10, headRequest); err != nil {
			return true, err
		}
		if h.Status >= 200 {
			break
		}
		if h.Status == http.StatusSwitchingProtocols {
			return true, ErrUnaskedSwitch
		}
	}
	pc.rd.headBy = time.Time{}
	return true, nil
}

func (h *Head) reset() {
	h.Status, h.KeepAlive, h.Body, h.Length, h.DeclaredUnsent = 0, false, BodyNone, 0, false
	if cap(h.raw) > 64<<10 {
		h.raw = nil // a huge head once should not stay with the connection
	}
	h.raw = h.raw[:0]
	clear(h.fields)
	h.fields = h.fields[:0]
	h.conn, h.Trailers = h.conn[:0], h.Trailers[:0]
}

// readLine reads one line of a head without its CRLF, counting its bytes
// in total against the 1 MiB bound on a response head. The line is valid
// until the next read.
func (pc *Conn) readLine(total *int) ([]byte, error) {
	line, err := pc.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		// Longer than the read buffer (a large cookie): gather it.
		long := append([]byte(nil), line...)
		for err == bufio.ErrBufferFull && *total+len(long) <= MaxHeaderBytes {
			line, err = pc.br.ReadSlice('\n')
			long = append(long, line...)
		}
		line = long
	}
	*total += len(line)
	if *total > MaxHeaderBytes {
		return nil, ErrHeaderTooLarge
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
		return 0, false, fmt.Errorf("%w: status line %q", ErrMalformedResponse, truncate(line))
	}
	if len(rest) < 3 || (len(rest) > 3 && rest[3] != ' ') {
		return 0, false, fmt.Errorf("%w: status line %q", ErrMalformedResponse, truncate(line))
	}
	for _, c := range rest[:3] {
		if c < '0' || c > '9' {
			return 0, false, fmt.Errorf("%w: status line %q", ErrMalformedResponse, truncate(line))
		}
		status = status*10 + int(c-'0')
	}
	if status < 100 {
		return 0, false, fmt.Errorf("%w: status %d", ErrMalformedResponse, status)
	}
	return status, http10, nil
}

func truncate(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}

// readFields reads header lines up to the empty line into pc.Head.raw and
// pc.Head.fields, canonicalising keys as net/textproto does.
func (pc *Conn) readFields(total *int) error {
	h := &pc.Head
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
			return fmt.Errorf("%w: folded header line", ErrMalformedResponse)
		}
		i := bytes.IndexByte(line, ':')
		if i <= 0 || !validTokenBytes(line[:i]) {
			return fmt.Errorf("%w: header line %q", ErrMalformedResponse, truncate(line))
		}
		v := bytes.Trim(line[i+1:], " \t")
		if !validValueBytes(v) {
			return fmt.Errorf("%w: header line %q", ErrMalformedResponse, truncate(line))
		}
		f := field{kOff: len(h.raw), kLen: i}
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
//     (CopyHeader passes one on), anything else is malformed;
//   - Transfer-Encoding is one field saying "chunked", and overrides a
//     Content-Length, which is dropped; the connection is closed after
//     such a message (RFC 9112 §6.3: it may be an attempt at smuggling);
//   - on an HTTP/1.0 response Transfer-Encoding does not frame the body,
//     and the connection is closed after it (RFC 9112 §6.1);
//   - a Trailer announcing a framing field is malformed, as Go has it.
func (h *Head) finish(http10, headRequest bool) error {
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
			connClose = connClose || HasToken([]string{f.value}, "close")
			connKeepAlive = connKeepAlive || HasToken([]string{f.value}, "keep-alive")
		case "Content-Length":
			if nLength > 0 && f.value != length {
				return fmt.Errorf("%w: differing Content-Length values", ErrMalformedResponse)
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
					h.Trailers = append(h.Trailers, http.CanonicalHeaderKey(k))
				}
			}
		}
	}
	h.KeepAlive = !connClose && (!http10 || connKeepAlive)
	chunked := false
	if nTE > 0 && !http10 {
		// Only chunked is understood, as by http.Transport; any other
		// coding would have to be delimited by the close.
		if nTE > 1 || !strings.EqualFold(te, "chunked") {
			return fmt.Errorf("%w: unsupported Transfer-Encoding %q", ErrMalformedResponse, te)
		}
		chunked = true
	}
	if nTE > 0 && (http10 || nLength > 0) {
		h.KeepAlive = false
	}
	var n int64
	if nLength > 0 {
		var ok bool
		if n, ok = parseLength(length); !ok {
			return fmt.Errorf("%w: Content-Length %q", ErrMalformedResponse, truncate([]byte(length)))
		}
	}
	if chunked {
		for _, k := range h.Trailers {
			if k == "Transfer-Encoding" || k == "Trailer" || k == "Content-Length" {
				return fmt.Errorf("%w: Trailer announces %s", ErrMalformedResponse, k)
			}
		}
	}
	switch {
	case headRequest || h.Status == http.StatusNoContent || h.Status == http.StatusNotModified:
		h.Body = BodyNone
		h.DeclaredUnsent = chunked || n > 0
	case chunked:
		h.Body = BodyChunked
	case nLength > 0:
		h.Body, h.Length = BodyFixed, n
		if n == 0 {
			h.Body = BodyNone
		}
	default:
		h.Body, h.KeepAlive = BodyToClose, false
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

// CopyHeader copies the end-to-end fields into dst (w.Header()): all but
// those hopByHop reports and those the Connection header names, sharing
// one backing array for their value slices. A repeated Content-Length
// (finish checked the values agree) is passed on once: two, even equal,
// make strict clients refuse the response.
func (h *Head) CopyHeader(dst http.Header, hopByHop func(key string) bool) {
	vals := make([]string, len(h.fields))
	for i := range h.fields {
		f := &h.fields[i]
		if hopByHop(f.key) || (len(h.conn) > 0 && HasToken(h.conn, f.key)) {
			continue
		}
		if f.key == "Content-Length" && (h.Body == BodyChunked || h.seenBefore(i, f.key)) {
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
func (h *Head) seenBefore(i int, key string) bool {
	for j := 0; j < i; j++ {
		if h.fields[j].key == key {
			return true
		}
	}
	return false
}

// MaxHeaderBytes bounds a response head, 1xx responses before it included,
// and a chunked body's trailer section.
const MaxHeaderBytes = 1 << 20

// Failures of reading a response that are not I/O errors.
var (
	ErrMalformedResponse = errors.New("malformed HTTP response")
	ErrHeaderTooLarge    = errors.New("response header too large")
	ErrUnaskedSwitch     = errors.New("101 switching protocols without an upgrade asked for")
)
