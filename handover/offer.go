package handover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/scafo/scafo-edge/internal/backoff"
	"github.com/scafo/scafo-edge/node"
)

// SocketFile is the handover socket's name inside the state directory.
const SocketFile = "handover.sock"

// exchangeTimeout bounds the old edge's side of one exchange, hello to ack:
// a successor that connects and stalls must not hold the offer forever.
const exchangeTimeout = 5 * time.Second

// helloTimeout bounds the wait for a successor's hello, which it sends as
// soon as it connects. The offer answers one successor at a time, and the
// one queued behind a peer that connects and says nothing has a budget of
// its own (cmd's 5s): the silent one may cost it this much, not all of it.
const helloTimeout = time.Second

// maxHello bounds every frame the old edge reads, a hello or an ack from a
// successor, a hello from a stranger before it is refused: the payload is
// set aside as announced, and those frames are a few dozen bytes. Only the
// successor reads big frames (the routing document).
const maxHello = 4 << 10

// maxRefusing bounds the strangers waited on for their hello at once: each
// holds a descriptor and a goroutine for up to helloTimeout, and one who
// keeps connecting must not run this process out of descriptors. Those
// beyond it are hung up on without a word.
const maxRefusing = 4

// maxSocketPath is the longest path a UNIX socket address holds on Linux
// (sun_path is 108 bytes, NUL included).
const maxSocketPath = 107

// Offer is the old edge's side: it listens on the handover socket and hands
// this edge's sockets to the first successor that asks. Its methods are safe
// for concurrent use.
type Offer struct {
	// State, if set, is called as a successor takes the sockets; what it
	// returns travels with them, opaque to this package, and is the
	// successor's Taken.State. The edge hands over its TLS session ticket
	// keys so: a secret, which goes only where the sockets go, to this
	// edge's user or root over a socket only they may open.
	State func() []byte

	ln      *net.UnixListener
	path    string
	file    os.FileInfo // the socket file bound, so Close removes only its own
	log     zerolog.Logger
	timeout time.Duration // per exchange; tests shorten it

	closeOnce sync.Once
	closeErr  error
	refusals  rate.Sometimes // logs refused strangers: the first, then one a minute
	// uidOf tells who is at the other end of a connection, accept takes
	// the next one; tests replace them to play a stranger without a second
	// user, or a process out of descriptors.
	uidOf  func(*net.UnixConn) (uint32, error)
	accept func() (*net.UnixConn, error)

	// mu guards strangers, the connections being refused, and closed,
	// after which none is added; refusing counts them for Close to wait.
	mu        sync.Mutex
	strangers map[*net.UnixConn]struct{}
	closed    bool
	refusing  sync.WaitGroup
}

// Listen starts offering on <dir>/handover.sock, replacing a stale file
// left there by an edge that crashed. The socket is mode 0600: whoever may
// connect receives the edge's listening sockets. The zero log logs nothing.
//
// Call it only once this edge serves: a successor that connects gets the
// sockets the caller passes to Wait.
func Listen(dir string, log zerolog.Logger) (*Offer, error) {
	path := filepath.Join(dir, SocketFile)
	// Bind under a temporary name, restrict it, then rename it over the
	// final path: no moment exists where the final path is a socket others
	// may connect to, and a stale file is replaced atomically.
	tmp := filepath.Join(dir, "."+SocketFile+"."+strconv.Itoa(os.Getpid()))
	if len(tmp) > maxSocketPath {
		return nil, fmt.Errorf("handover socket %s: path longer than the %d bytes a UNIX socket address holds", tmp, maxSocketPath)
	}
	os.Remove(tmp) // left by an earlier process with our pid
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on handover socket: %w", err)
	}
	// The name changes under the listener: removal is ours, by identity.
	ln.SetUnlinkOnClose(false)
	fail := func(step string, err error) (*Offer, error) {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("handover socket %s: %s: %w", path, step, err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fail("restrict to 0600", err)
	}
	fi, err := os.Lstat(tmp)
	if err != nil {
		return fail("stat", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail("rename into place", err)
	}
	return &Offer{ln: ln, path: path, file: fi, log: log, timeout: exchangeTimeout,
		refusals: rate.Sometimes{First: 1, Interval: time.Minute}, uidOf: peerUID, accept: ln.AcceptUnix,
		strangers: map[*net.UnixConn]struct{}{}}, nil
}

// Path returns the handover socket's path.
func (o *Offer) Path() string { return o.path }

// Close stops offering and removes the socket file if it is still this
// offer's (a successor may already have put its own in its place). The
// strangers still being refused are hung up on: none outlives Close.
func (o *Offer) Close() error {
	o.closeOnce.Do(func() {
		o.closeErr = o.ln.Close()
		if fi, err := os.Lstat(o.path); err == nil && os.SameFile(fi, o.file) {
			os.Remove(o.path)
		}
		o.mu.Lock()
		o.closed = true
		for c := range o.strangers {
			c.SetDeadline(time.Now())
		}
		o.mu.Unlock()
		o.refusing.Wait()
	})
	return o.closeErr
}

// Wait answers successors one at a time until one has taken socks, then
// stops offering and returns the Handoff through which the old edge tells
// it what it released. A successor that fails before acknowledging the
// sockets costs a log line, and the offer stands. Wait returns an error when
// ctx ends or the offer is closed.
//
// From the moment Wait returns, the successor holds the sockets too: the
// caller stops accepting on them and releases, in the order of the package
// doc.
func (o *Offer) Wait(ctx context.Context, socks Sockets) (*Handoff, error) {
	stop := context.AfterFunc(ctx, func() { o.Close() })
	defer stop()
	// Waits between failed accepts as http.Server's accept loop has them.
	retry := backoff.Backoff{Base: 5 * time.Millisecond, Max: time.Second}
	for {
		c, err := o.accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if errors.Is(err, net.ErrClosed) {
				return nil, fmt.Errorf("accept on handover socket: %w", err)
			}
			// Out of descriptors or the like: it passes, and the offer
			// must outlive it, as http.Server's accept loop does.
			wait := retry.Failed()
			if retry.Failures() == 1 {
				o.log.Warn().Err(err).Msg("handover: accepting on the handover socket failed; retrying")
			}
			select {
			case <-time.After(wait):
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if retry.Succeeded() > 0 {
			o.log.Info().Msg("handover: accepting on the handover socket again")
		}
		// A stranger is answered beside the loop, so that one who connects
		// and says nothing costs a successor queued behind it no time.
		if reason, err := o.admit(c); err != nil {
			o.startRefusal(c, reason, err)
			continue
		}
		if err := o.exchange(c, socks); err != nil {
			o.log.Warn().Err(err).Msg("handover: a successor connected but did not take the sockets; still serving")
			c.Close()
			continue
		}
		o.Close()
		c.SetDeadline(time.Time{})
		return &Handoff{conn: c}, nil
	}
}

// exchange runs steps 1 to 3 of the package doc on c.
func (o *Offer) exchange(c *net.UnixConn, socks Sockets) error {
	start := time.Now()
	c.SetDeadline(start.Add(min(helloTimeout, o.timeout)))
	// Descriptors are only ever sent to the successor: readSmallFrame lets
	// the kernel drop any a peer attaches.
	hello, err := readSmallFrame(c, maxHello)
	if err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	c.SetDeadline(start.Add(o.timeout))
	if hello.Kind != kindHello || hello.Protocol != protocol {
		writeFrame(c, frame{Kind: kindRefused, Error: "want " + protocol}, nil)
		return fmt.Errorf("hello: got %s %q, want %s", hello.Kind, hello.Protocol, protocol)
	}
	if hello.Serves == nil {
		writeFrame(c, frame{Kind: kindRefused, Error: "say what you will serve"}, nil)
		return errors.New("hello: the successor did not say what it will serve")
	}
	if why := socks.mismatch(*hello.Serves); why != "" {
		writeFrame(c, frame{Kind: kindRefused, Error: why}, nil)
		return fmt.Errorf("%w: %s", ErrNotTheSameEdge, why)
	}
	roles, files, err := socks.files()
	if err != nil {
		writeFrame(c, frame{Kind: kindRefused, Error: err.Error()}, nil)
		return err
	}
	// The descriptors in flight hold the sockets open on their own: the
	// duplicates are closed when the exchange ends, whatever its outcome.
	defer closeFiles(files)
	fds, err := fdsOf(files)
	if err != nil {
		writeFrame(c, frame{Kind: kindRefused, Error: err.Error()}, nil)
		return err
	}
	f := frame{Kind: kindSockets, Roles: roles}
	if o.State != nil {
		f.State = o.State()
	}
	if err := writeFrame(c, f, fds); err != nil {
		return err
	}
	ack, err := readSmallFrame(c, maxHello)
	if err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	if ack.Kind != kindAck {
		return fmt.Errorf("ack: got %s", ack.Kind)
	}
	return nil
}

// admit checks who is at the other end of c before anything is said. The
// socket's mode keeps other users out only as long as nobody loosens it (a
// volume's permissions, a umask, a chmod), and whoever connects would get
// the listening sockets: the kernel's word on who that is decides. A
// refusal comes with the reason to tell the peer.
func (o *Offer) admit(c *net.UnixConn) (reason string, err error) {
	uid, err := o.uidOf(c)
	if err != nil {
		return "cannot tell who you are", err
	}
	if !mayTake(uid, uint32(os.Geteuid())) {
		return "not this edge's user", fmt.Errorf("a process running as uid %d asked for the sockets: only this edge's user (uid %d) or root may take them", uid, os.Geteuid())
	}
	return "", nil
}

// startRefusal refuses c in a goroutine of its own, which Close ends and
// waits for; beyond maxRefusing at once, or once the offer is closed, c is
// hung up on at once.
func (o *Offer) startRefusal(c *net.UnixConn, reason string, err error) {
	c.SetDeadline(time.Now().Add(helloTimeout))
	o.mu.Lock()
	if o.closed || len(o.strangers) >= maxRefusing {
		o.mu.Unlock()
		c.Close()
		o.logRefusal(err)
		return
	}
	o.strangers[c] = struct{}{}
	o.refusing.Add(1)
	o.mu.Unlock()
	go func() {
		defer o.refusing.Done()
		o.refuse(c, reason, err)
		o.mu.Lock()
		delete(o.strangers, c)
		o.mu.Unlock()
	}()
}

// refuse lets the peer say its hello (so that it reads the refusal rather
// than a broken pipe), tells it reason and hangs up, by c's deadline.
func (o *Offer) refuse(c *net.UnixConn, reason string, err error) {
	defer c.Close()
	readSmallFrame(c, maxHello)
	writeFrame(c, frame{Kind: kindRefused, Error: reason}, nil)
	o.logRefusal(err)
}

// logRefusal logs the first refusal, then one a minute: a stranger may
// knock often.
func (o *Offer) logRefusal(err error) {
	o.refusals.Do(func() {
		o.log.Warn().Err(err).Msg("handover: refused a process that may not take this edge's sockets; still serving")
	})
}

// mayTake reports whether a successor running as peer may take the sockets
// of an edge running as own: the same user, or root, who could take them
// from this process anyway.
func mayTake(peer, own uint32) bool {
	return peer == own || peer == 0
}

// Handoff is the old edge's line to the successor that took its sockets:
// Run lets go of the rest.
type Handoff struct {
	conn *net.UnixConn
}

// release tells the successor that edge.db is closed and hands it the last
// good routing document (nil: none yet), with its Stale mark.
func (h *Handoff) release(doc *node.Update) error {
	f := frame{Kind: kindReleased}
	if doc != nil {
		f.Document = &document{Body: doc.Body, FetchedAt: doc.FetchedAt, Stale: doc.Stale}
	}
	return h.send(f)
}

// releaseHTTP3 tells the successor that this process no longer reads the
// HTTP/3 socket.
func (h *Handoff) releaseHTTP3() error {
	return h.send(frame{Kind: kindHTTP3})
}

func (h *Handoff) send(f frame) error {
	h.conn.SetWriteDeadline(time.Now().Add(exchangeTimeout))
	if err := writeFrame(h.conn, f, nil); err != nil {
		return fmt.Errorf("handover: %w", err)
	}
	return nil
}

// Close ends the line; the successor reads it as the old edge being gone.
func (h *Handoff) Close() error {
	return h.conn.Close()
}
