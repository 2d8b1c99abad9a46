package h1

// Reading a response body by its framing: a length, chunks, or the close.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
)

// BodyReader returns the reader of the body whose head pc.Head holds, nil
// when it has none.
func (pc *Conn) BodyReader() io.Reader {
	switch pc.Head.Body {
	case BodyFixed:
		pc.fixed.left = pc.Head.Length
		return &pc.fixed
	case BodyChunked:
		pc.chunks.reset()
		return &pc.chunks
	case BodyToClose:
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
		return fmt.Errorf("%w: chunk not followed by CRLF", ErrMalformedResponse)
	}
	c.br.Discard(2)
	return nil
}

func (c *chunkedBody) line() ([]byte, error) {
	line, err := c.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull || len(line) > maxChunkLine {
		return nil, fmt.Errorf("%w: chunk line too long", ErrMalformedResponse)
	}
	if err != nil {
		return nil, unexpected(err)
	}
	// A bare LF ends no line of chunked framing (RFC 9112 §7.1), and a
	// CR anywhere but before the LF is not part of one: Go refuses both,
	// and reading either as a line end is how framing is desynchronised
	// between two parsers.
	switch i := bytes.IndexByte(line, '\r'); {
	case i < 0:
		return nil, fmt.Errorf("%w: chunk line ends with a bare LF", ErrMalformedResponse)
	case i != len(line)-2:
		return nil, fmt.Errorf("%w: CR inside a chunk line", ErrMalformedResponse)
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
		return 0, fmt.Errorf("%w: chunk size %q", ErrMalformedResponse, truncate(line))
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
			return 0, fmt.Errorf("%w: chunk size %q", ErrMalformedResponse, truncate(line))
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
		if total += len(line); total > MaxHeaderBytes {
			return ErrHeaderTooLarge
		}
		i := bytes.IndexByte(line, ':')
		if i <= 0 || !validTokenBytes(line[:i]) {
			return fmt.Errorf("%w: trailer line %q", ErrMalformedResponse, truncate(line))
		}
		v := bytes.Trim(line[i+1:], " \t")
		if !validValueBytes(v) {
			return fmt.Errorf("%w: trailer line %q", ErrMalformedResponse, truncate(line))
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
