package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// jsonPath is where a value sits in a JSON document: object member names
// (string) and array indexes (int), outermost first.
type jsonPath []any

// field spells p as a person reads it: routes[1].upstreams[0].address.
func (p jsonPath) field() string {
	var b strings.Builder
	for _, e := range p {
		switch e := e.(type) {
		case int:
			b.WriteString("[" + strconv.Itoa(e) + "]")
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(e)
		}
	}
	return b.String()
}

// shape is field with every index spelled "[]": the kind of place p is.
func (p jsonPath) shape() string {
	var b strings.Builder
	for _, e := range p {
		switch e := e.(type) {
		case int:
			b.WriteString("[]")
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(e)
		}
	}
	return b.String()
}

func (p jsonPath) equal(q jsonPath) bool {
	if len(p) != len(q) {
		return false
	}
	for i := range p {
		if p[i] != q[i] {
			return false
		}
	}
	return true
}

// jsonPos is one object member or array element and the byte offset where
// it starts (a member's name, an element's value).
type jsonPos struct {
	path jsonPath
	off  int64
}

func (p jsonPos) field() string { return p.path.field() }

type jsonPositions []jsonPos

// find returns the position of path, or of the deepest ancestor of it the
// document has (a missing field is reported where its object starts).
func (ps jsonPositions) find(path jsonPath) (jsonPos, bool) {
	for n := len(path); n > 0; n-- {
		for _, p := range ps {
			if p.path.equal(path[:n]) {
				return p, true
			}
		}
	}
	return jsonPos{}, false
}

// closestBefore returns the last position starting before off.
func (ps jsonPositions) closestBefore(off int64) (jsonPos, bool) {
	var best jsonPos
	found := false
	for _, p := range ps {
		if p.off < off {
			best, found = p, true
		}
	}
	return best, found
}

// positions lists every object member and array element of the one JSON
// value in body, in document order. Only for error reports and the unknown
// field check of a small hand-written file.
func positions(body []byte) (jsonPositions, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var out jsonPositions
	start := func(off int64) int64 {
		// InputOffset is the end of the previous token: skip the
		// separators and spaces before this one.
		for off < int64(len(body)) && strings.IndexByte(" \t\r\n,:", body[off]) >= 0 {
			off++
		}
		return off
	}
	var value func(path jsonPath) error
	value = func(path jsonPath) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			for dec.More() {
				off := start(dec.InputOffset())
				k, err := dec.Token()
				if err != nil {
					return err
				}
				name, ok := k.(string)
				if !ok {
					return fmt.Errorf("object key %v is not a string", k)
				}
				p := append(path[:len(path):len(path)], name)
				out = append(out, jsonPos{path: p, off: off})
				if err := value(p); err != nil {
					return err
				}
			}
			_, err := dec.Token() // '}'
			return err
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				p := append(path[:len(path):len(path)], i)
				out = append(out, jsonPos{path: p, off: start(dec.InputOffset())})
				if err := value(p); err != nil {
					return err
				}
			}
			_, err := dec.Token() // ']'
			return err
		}
		return nil
	}
	if err := value(nil); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return out, nil
}

// lineColumn turns a byte offset of body into a 1-based line and column
// (in bytes), as editors and compilers report them.
func lineColumn(body []byte, off int64) (line, col int) {
	off = min(off, int64(len(body)))
	before := body[:off]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(off) - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return line, col
}
