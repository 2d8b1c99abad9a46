package handover

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/scafo/scafo-edge/node"
)

// protocol names this exchange; a peer that sends another is refused, and
// the successor falls back to binding its own listeners.
const protocol = "scafo-edge-handover/1"

// Frame kinds, in the order of the exchange (see the package doc).
const (
	kindHello    = "hello"
	kindSockets  = "sockets"
	kindAck      = "ack"
	kindReleased = "released"
	kindHTTP3    = "http3-released"
	kindRefused  = "refused"
)

// maxFrame bounds a frame's payload: a routing document at its largest plus
// room for the envelope. A peer announcing more is not a peer.
const maxFrame = node.MaxDocumentSize + 1<<20

// maxSockets bounds the descriptors one frame may carry.
const maxSockets = 8

// frame is one message of the exchange: a 4-byte big-endian length, then
// this as JSON. A sockets frame carries its descriptors as SCM_RIGHTS on
// the same write, in the order of Roles.
type frame struct {
	Kind     string    `json:"kind"`
	Protocol string    `json:"protocol,omitempty"`
	Roles    []string  `json:"roles,omitempty"`
	Document *document `json:"document,omitempty"`
	Error    string    `json:"error,omitempty"`
	// Serves, in a hello, is what the successor will serve (see Serves).
	Serves *Serves `json:"serves,omitempty"`
	// State, in a sockets frame, is the caller's opaque state for its
	// successor (Offer.State); an older peer leaves it out or ignores it.
	State []byte `json:"state,omitempty"`
}

// document is the last good routing document as it travels: the exact
// bytes, when they were fetched, and whether the old edge's source had
// confirmed it (a document still stale on the old edge, loaded from edge.db
// while the node is unreachable, stays stale on the new one). The successor
// parses it again, as it would a document from the node.
type document struct {
	Body      []byte    `json:"body"`
	FetchedAt time.Time `json:"fetched_at"`
	Stale     bool      `json:"stale,omitempty"`
}

// writeFrame sends f with fds attached to its first byte.
func writeFrame(c *net.UnixConn, f frame, fds []int) error {
	payload, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode %s: %w", f.Kind, err)
	}
	buf := make([]byte, 4, 4+len(payload))
	binary.BigEndian.PutUint32(buf, uint32(len(payload)))
	buf = append(buf, payload...)
	if len(fds) == 0 {
		_, err = c.Write(buf)
	} else {
		// One sendmsg may write less than a large buffer; the descriptors
		// ride on what it wrote, and Write finishes the rest.
		var n int
		n, _, err = c.WriteMsgUnix(buf, syscall.UnixRights(fds...), nil)
		if err == nil && n < len(buf) {
			_, err = c.Write(buf[n:])
		}
	}
	if err != nil {
		return fmt.Errorf("send %s: %w", f.Kind, err)
	}
	return nil
}

// readFrame reads one frame and any descriptors that came with it: the
// successor's read, of the old edge's frames (the sockets, the routing
// document). On error the descriptors received are closed, so none leak
// into the process.
func readFrame(c *net.UnixConn) (f frame, fds []int, err error) {
	defer func() {
		if err != nil {
			closeFDs(fds)
			fds = nil
		}
	}()
	var hdr [4]byte
	if fds, err = readFull(c, hdr[:], fds); err != nil {
		return f, fds, fmt.Errorf("read frame: %w", err)
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > maxFrame {
		return f, fds, fmt.Errorf("read frame: %d bytes announced, at most %d", size, maxFrame)
	}
	payload := make([]byte, size)
	if fds, err = readFull(c, payload, fds); err != nil {
		return f, fds, fmt.Errorf("read frame: %w", err)
	}
	f, err = decodeFrame(payload)
	return f, fds, err
}

// readSmallFrame reads one frame of at most limit bytes and no
// descriptors: the old edge's read, of hellos and acks, from a successor or
// a stranger. Plain reads give the kernel no room for descriptors, so it
// closes any the peer attaches before they reach this process's table: a
// peer sending a few with every byte cannot fill it. The payload is
// allocated as announced, hence the limit.
func readSmallFrame(c net.Conn, limit uint32) (frame, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return frame{}, fmt.Errorf("read frame: %w", err)
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > limit {
		return frame{}, fmt.Errorf("read frame: %d bytes announced, at most %d", size, limit)
	}
	payload := make([]byte, size)
	if _, err := io.ReadFull(c, payload); err != nil {
		return frame{}, fmt.Errorf("read frame: %w", err)
	}
	return decodeFrame(payload)
}

func decodeFrame(payload []byte) (f frame, err error) {
	if err := json.Unmarshal(payload, &f); err != nil {
		return f, fmt.Errorf("decode frame: %w", err)
	}
	if f.Kind == kindRefused {
		return f, fmt.Errorf("%w: %s", errRefused, f.Error)
	}
	return f, nil
}

// errRefused is the peer saying no.
var errRefused = errors.New("refused by the peer")

// readFull fills b from c, collecting the descriptors of every control
// message read on the way into fds.
func readFull(c *net.UnixConn, b []byte, fds []int) ([]int, error) {
	oob := make([]byte, syscall.CmsgSpace(maxSockets*4))
	for got := 0; got < len(b); {
		n, oobn, flags, _, err := c.ReadMsgUnix(b[got:], oob)
		got += n
		if oobn > 0 {
			more, perr := parseRights(oob[:oobn])
			fds = append(fds, more...)
			if perr != nil {
				return fds, perr
			}
			// One frame carries at most maxSockets, in one message; a
			// peer attaching more, a few per byte, is not an edge.
			if len(fds) > maxSockets {
				return fds, fmt.Errorf("more than %d descriptors sent", maxSockets)
			}
		}
		if flags&syscall.MSG_CTRUNC != 0 {
			return fds, fmt.Errorf("more than %d descriptors sent", maxSockets)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fds, err
		}
		if n == 0 {
			return fds, io.ErrUnexpectedEOF
		}
	}
	return fds, nil
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse control message: %w", err)
	}
	var fds []int
	for i := range msgs {
		got, err := syscall.ParseUnixRights(&msgs[i])
		if err != nil {
			return fds, fmt.Errorf("parse descriptors: %w", err)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		syscall.Close(fd)
	}
}
