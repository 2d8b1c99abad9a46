package h1

// Writing a request body: its declared length exactly, or chunked.

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
)

// ErrShortBody is returned, wrapped, by WriteBody when a streamed body ends
// short of its declared length: the client's failure, not the upstream's.
var ErrShortBody = fmt.Errorf("read request body: %w", io.ErrUnexpectedEOF)

// WriteBody writes a request body to bw after its head: buffered whole
// when it is not nil, else what r yields, length bytes exactly, or chunked
// until EOF when length is negative. A streamed body is flushed as it is
// read, the head first, so that an upload flows and an upstream can answer
// from the head alone. buf is scratch space for the copy.
func WriteBody(bw *bufio.Writer, buffered []byte, length int64, r io.Reader, buf []byte) error {
	if buffered != nil {
		if _, err := bw.Write(buffered); err != nil {
			return fmt.Errorf("write request body: %w", err)
		}
		return nil
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write request: %w", err)
	}
	left := length
	for left != 0 {
		chunk := buf
		if left > 0 && int64(len(chunk)) > left {
			chunk = chunk[:left]
		}
		n, rerr := r.Read(chunk)
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
			return ErrShortBody
		case rerr == io.EOF:
			left = 0
		case rerr != nil:
			return fmt.Errorf("read request body: %w", rerr)
		}
	}
	if length < 0 {
		// The last chunk; a request with trailers never takes this client.
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
