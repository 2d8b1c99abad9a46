package handover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/scafo/scafo-edge/node"
)

// ErrNoPeer is wrapped by Take's error when no edge serves the state
// directory: no handover socket, or a stale one nothing listens on (its
// edge crashed). Starting the ordinary way is then the whole story.
var ErrNoPeer = errors.New("no edge to take over from")

// ErrPeerGone is returned by Taken's waits when the old edge closed the line
// (or died) before saying it released what was waited for. Its locks died
// with it, if it died: the caller goes on as if it had released.
var ErrPeerGone = errors.New("old edge gone before releasing")

// ErrNotTheSameEdge: the running edge refused the sockets because the
// successor would not serve them where it does (see Serves).
var ErrNotTheSameEdge = errors.New("not an upgrade of the running edge")

// Taken is the new edge's side once it holds the old edge's sockets. Its
// methods are safe for concurrent use.
type Taken struct {
	// Sockets are the inherited listeners, the caller's to serve on and to
	// close; a nil field is a role the old edge did not serve.
	Sockets Sockets
	// State is what the old edge's Offer.State returned; nil: nothing, or
	// an old edge without it.
	State []byte

	conn *net.UnixConn

	released chan struct{} // closed on released, or when the line ends first
	http3    chan struct{} // closed on http3-released, or when the line ends first
	done     chan struct{} // closed when the reader returns

	// Set before released is closed.
	doc    *node.Update
	relErr error
	// Set before http3 is closed.
	h3Err error

	closeOnce sync.Once
}

// Take asks the edge serving dir for its listening sockets (steps 1 to 3 of
// the package doc); ctx bounds the exchange. On success the old edge is
// stopping: wait for Released before opening edge.db, and for
// HTTP3Released before reading the HTTP/3 socket.
//
// The error wraps ErrNoPeer when nobody serves dir; any other error means a
// peer was there and the exchange failed. Either way nothing was taken and
// the caller binds its own listeners.
func Take(ctx context.Context, dir string, serves Serves) (*Taken, error) {
	path := filepath.Join(dir, SocketFile)
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("%w: no handover socket at %s", ErrNoPeer, path)
		case errors.Is(err, syscall.ECONNREFUSED):
			return nil, fmt.Errorf("%w: nothing listens on %s (left by an edge that stopped without removing it)", ErrNoPeer, path)
		}
		return nil, fmt.Errorf("connect to handover socket: %w", err)
	}
	c := nc.(*net.UnixConn)
	// The exchange's reads and writes end when ctx does: a deadline in the
	// past interrupts them and leaves c open.
	interrupted := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		c.SetDeadline(time.Unix(1, 0))
		close(interrupted)
	})
	socks, state, err := takeSockets(c, serves)
	if !stop() {
		<-interrupted
	}
	// Once the ack is written the old edge lets go of the sockets, whatever
	// ctx says now: closing them here would leave nobody holding them, and
	// the kernel would refuse connections. So a ctx that ends after the ack
	// does not undo the handover.
	if err != nil {
		c.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("handover with the edge on %s: %w (%w)", path, ctx.Err(), err)
		}
		return nil, fmt.Errorf("handover with the edge on %s: %w", path, err)
	}
	c.SetDeadline(time.Time{})
	t := &Taken{
		Sockets:  socks,
		State:    state,
		conn:     c,
		released: make(chan struct{}),
		http3:    make(chan struct{}),
		done:     make(chan struct{}),
	}
	go t.read()
	return t, nil
}

// takeSockets runs hello, sockets, ack on c.
func takeSockets(c *net.UnixConn, serves Serves) (Sockets, []byte, error) {
	if err := writeFrame(c, frame{Kind: kindHello, Protocol: protocol, Serves: &serves}, nil); err != nil {
		return Sockets{}, nil, err
	}
	f, fds, err := readFrame(c)
	if err != nil {
		return Sockets{}, nil, fmt.Errorf("sockets: %w", err)
	}
	if f.Kind != kindSockets {
		closeFDs(fds)
		return Sockets{}, nil, fmt.Errorf("sockets: got %s", f.Kind)
	}
	socks, err := socketsFrom(f.Roles, fds)
	if err != nil {
		return Sockets{}, nil, fmt.Errorf("sockets: %w", err)
	}
	if err := writeFrame(c, frame{Kind: kindAck}, nil); err != nil {
		socks.Close()
		return Sockets{}, nil, err
	}
	return socks, f.State, nil
}

// read follows the old edge's release frames until the line ends. It is
// bounded by the connection: Close ends it.
func (t *Taken) read() {
	defer close(t.done)
	step := 0 // 0: waiting for released, 1: for http3-released, 2: done
	for step < 2 {
		f, fds, err := readFrame(t.conn)
		closeFDs(fds) // none are expected after the sockets frame
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
				err = ErrPeerGone
			}
			if step == 0 {
				t.relErr = err
				close(t.released)
			}
			t.h3Err = err
			close(t.http3)
			return
		}
		switch {
		case step == 0 && f.Kind == kindReleased:
			t.doc, t.relErr = parseDocument(f.Document)
			close(t.released)
			step = 1
		case step == 1 && f.Kind == kindHTTP3:
			close(t.http3)
			step = 2
		}
		// Anything else is from a newer peer and skipped.
	}
}

// parseDocument turns the handed-over document into the Update the old
// edge's source produced: fresh when that source had confirmed it.
func parseDocument(d *document) (*node.Update, error) {
	if d == nil {
		return nil, nil
	}
	doc, err := node.Parse(d.Body)
	if err != nil {
		return nil, fmt.Errorf("handed-over routing document: %w", err)
	}
	return &node.Update{Doc: doc, Body: d.Body, Fingerprint: node.Fingerprint(d.Body), FetchedAt: d.FetchedAt, Stale: d.Stale}, nil
}

// Released waits until the old edge has closed edge.db and returns the last
// good routing document it handed over (nil: it had none). The error is
// ErrPeerGone when the old edge went away without saying so, ctx's error
// when ctx ends first, or a document that does not parse; in every case the
// caller goes on to open edge.db (waiting for its lock) with the document
// persisted there.
func (t *Taken) Released(ctx context.Context) (*node.Update, error) {
	select {
	case <-t.released:
		return t.doc, t.relErr
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// HTTP3Released waits until the old edge no longer reads the HTTP/3
// socket; the error is as for Released. After an error the caller serves
// HTTP/3 anyway: an old edge that is gone reads nothing.
func (t *Taken) HTTP3Released(ctx context.Context) error {
	select {
	case <-t.http3:
		return t.h3Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close ends the line to the old edge and waits for the reader to return.
// It does not close Sockets.
func (t *Taken) Close() error {
	var err error
	t.closeOnce.Do(func() {
		err = t.conn.Close()
		<-t.done
	})
	return err
}
