package admission

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net/http"

	"golang.org/x/net/http/httpguts"
)

// judgeHead reports what b, the first bytes a connection sent, say: wait
// for more (headWaiting), or hand the connection to its server (headIn):
// the head has ended, or net/http would refuse it already. With proxied, a
// PROXY protocol header before the head is skipped. judged is where the
// last judgement's complete lines ended (-1: none); it returns where this
// one's do, so that each line is judged once (FuzzJudgeHead holds the
// verdicts to net/http's on the whole).
func judgeHead(b []byte, proxied bool, judged int) (headState, int) {
	off := 0
	if proxied {
		var ok bool
		if off, ok = proxyHeaderLen(b); !ok {
			return headWaiting, judged
		}
	}
	head := b[off:]
	switch {
	case len(head) == 0:
		return headWaiting, judged
	case !httpguts.IsTokenRune(rune(head[0])):
		return headIn, judged // not a method: a TLS record, say
	case headEnded(head):
		return headIn, judged
	}
	// net/http reads lines whole, and refuses a malformed one at once. A
	// header line is judged after a request line of its own, which its
	// verdict does not depend on.
	for from := max(judged+1, off); ; {
		end := bytes.IndexByte(b[from:], '\n')
		if end < 0 {
			return headWaiting, judged
		}
		line := b[from : from+end+1]
		if from > off {
			// A line folded onto the ones before (a leading space or
			// tab) is judged with the header line they fold onto; onto
			// the request line, with it alone.
			start := from
			for start > off && (b[start] == ' ' || b[start] == '\t') {
				start = off + bytes.LastIndexByte(b[off:start-1], '\n') + 1
			}
			line = b[start : from+end+1]
			if start > off {
				line = append(append(make([]byte, 0, len(someRequestLine)+len(line)), someRequestLine...), line...)
			}
		}
		r := bufio.NewReaderSize(bytes.NewReader(line), len(line))
		if _, err := http.ReadRequest(r); err != io.EOF && err != io.ErrUnexpectedEOF {
			return headIn, from + end
		}
		judged = from + end
		from = judged + 1
	}
}

var someRequestLine = []byte("GET / HTTP/1.1\r\n")

// headEnded reports whether b holds an empty line, ending LF or CRLF.
func headEnded(b []byte) bool {
	return bytes.Contains(b, lflf) || bytes.Contains(b, lfcrlf)
}

// proxyHeaderLen returns the length of the PROXY protocol header b starts
// with (0 if none), false while b could still be the start of one.
func proxyHeaderLen(b []byte) (int, bool) {
	switch {
	case bytes.HasPrefix(b, proxyV1):
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			return i + 1, true
		}
		return 0, len(b) >= proxyMax // too long for one: the server refuses it
	case bytes.HasPrefix(b, proxyV2):
		if len(b) < 16 {
			return 0, false
		}
		n := 16 + int(binary.BigEndian.Uint16(b[14:16]))
		return min(n, len(b)), n <= len(b)
	case bytes.HasPrefix(proxyV1, b), bytes.HasPrefix(proxyV2, b):
		return 0, false
	}
	return 0, true
}

var (
	lflf     = []byte("\n\n")
	lfcrlf   = []byte("\n\r\n")
	proxyV1  = []byte("PROXY ")
	proxyV2  = []byte("\r\n\r\n\x00\r\nQUIT\n")
	proxyMax = 107 // a v1 line's longest
)
