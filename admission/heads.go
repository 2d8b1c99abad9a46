package admission

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// On a listener whose connections speak plain HTTP/1 from their first
// byte (PlainListener), a connection whose first request head has not
// ended when it is accepted waits for it here, outside the HTTP server:
// in one epoll set for the whole listener (heads_linux.go), with no
// goroutine, no buffer and no stack of its own, and is handed to the
// server once the head has ended, its client has gone, or headPeek bytes
// wait. A visitor's head comes in a segment or a few, so it waits one
// round trip at most; a slowloris's never ends, and each of its 19,000
// connections held by net/http cost a goroutine (about 3 KiB of stack
// that every garbage collection scans), 8 KiB of buffers, and a wake-up of
// its goroutine for every byte (bench/README: "first heads awaited outside
// the server"). Waiting, a connection costs an entry here and a peek at
// its queued bytes each time some arrive. The server still reads every
// byte the client sent, and judges it: this only chooses when.
//
// It is counted against the budget as any connection (it was accepted),
// listed for shedding as a new connection with bytes arriving (a slow
// first request), and closed once its head has waited the server's header
// timeout, stretched as the server's own deadlines are (1 to 1.5 times,
// drawn per connection), as the server would have closed it. Keep-alive
// heads, and every head over TLS, are read by the server (and paced:
// pace.go).
const headPeek = 4096

// headEnded reports whether b, the first bytes a connection sent, hold
// the end of a request head: an empty line, its line end LF or CRLF, as
// net/http reads lines. Bytes net/http would read a request from always
// hold one (FuzzHeadEnded), so a head the server would serve is never kept
// from it.
func headEnded(b []byte) bool {
	return bytes.Contains(b, lflf) || bytes.Contains(b, lfcrlf)
}

var (
	lflf   = []byte("\n\n")
	lfcrlf = []byte("\n\r\n")
)

// PlainListener is Listener for a listener whose connections speak plain
// HTTP/1 from their first byte (no TLS; a PROXY protocol header before it
// is fine): each connection's first request head is awaited outside the
// server (heads.go). headTimeout is the server's ReadHeaderTimeout. Where
// the platform cannot, it is Listener.
func (c *Controller) PlainListener(l net.Listener, headTimeout time.Duration) net.Listener {
	if c == nil {
		return l
	}
	ln := c.Listener(l).(*listener)
	if headTimeout <= 0 {
		return ln
	}
	p, err := newHeadPoller()
	if err != nil {
		c.log.Warn().Err(err).Msg("first request heads are read by the server: no epoll set for them")
		return ln
	}
	h := &headWait{c: c, poller: p, timeout: headTimeout, waiting: map[uint64]*waitingHead{}, notify: make(chan struct{}, 1)}
	ln.heads = h
	c.addHeadWait(h)
	go h.poll()
	return ln
}

// headWait holds a listener's connections whose first head is awaited.
// Its own goroutine accepts (from the first Accept on, so that a server
// not serving yet leaves connections in the kernel's backlog), and Accept
// returns what it and the poller hand over, in order: so that a head that
// comes in while the accepting goroutine waits for room at the budget
// still goes to its server at once.
type headWait struct {
	c       *Controller
	poller  *headPoller
	timeout time.Duration
	start   sync.Once

	acceptBuf [headPeek]byte // for the peeks of the accepting goroutine

	notify  chan struct{} // a result is ready: one waiting signal at most
	mu      sync.Mutex
	waiting map[uint64]*waitingHead // by id, which epoll events carry
	nextID  uint64
	ready   []acceptResult // for Accept to return, in order
	closed  error          // the listener's end, after ready's results
	broken  bool           // the epoll set is closed or failed: nothing waits any more
}

type acceptResult struct {
	conn net.Conn
	err  error
}

type waitingHead struct {
	t        *trackedConn
	deadline int64 // Unix ns of c.clock: closed then
}

// accept returns the next result for the server: a connection whose head
// was awaited and is in, one just accepted whose head ended already (or
// that cannot wait: its client gone, its head too large to wait for), or
// an error of the listener's.
func (h *headWait) accept(l *listener) (net.Conn, error) {
	h.start.Do(func() { go h.acceptLoop(l) })
	for {
		h.mu.Lock()
		if len(h.ready) > 0 {
			r := h.ready[0]
			h.ready[0] = acceptResult{}
			h.ready = h.ready[1:]
			h.mu.Unlock()
			return r.conn, r.err
		}
		closed := h.closed
		h.mu.Unlock()
		if closed != nil {
			return nil, closed
		}
		<-h.notify
	}
}

// acceptLoop accepts until the listener ends, puts each connection whose
// head has not ended in the epoll set and hands the others over.
func (h *headWait) acceptLoop(l *listener) {
	var backoff time.Duration
	for {
		t, err := l.acceptTracked()
		if err != nil {
			var ne net.Error
			if (errors.As(err, &ne) && ne.Timeout() || isTemporary(err)) && !l.isClosed() {
				// As net/http's Serve does: it retries too, after the
				// result, so that it logs the error.
				h.push(acceptResult{err: err})
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(backoff):
				case <-l.done:
				}
				continue
			}
			// Its server drains what was accepted: every waiting
			// connection goes to it, then the end.
			h.handOverWaiting()
			h.mu.Lock()
			h.closed = err
			h.mu.Unlock()
			h.signal()
			h.poller.close()
			return
		}
		backoff = 0
		if !h.await(t) {
			h.push(acceptResult{conn: t})
		}
	}
}

func isTemporary(err error) bool {
	te, ok := err.(interface{ Temporary() bool })
	return ok && te.Temporary()
}

func (h *headWait) push(r acceptResult) {
	h.mu.Lock()
	h.ready = append(h.ready, r)
	h.mu.Unlock()
	h.signal()
}

func (h *headWait) signal() {
	select {
	case h.notify <- struct{}{}:
	default:
	}
}

// await looks at t's first bytes and puts it in the epoll set to wait for
// the rest, unless they end its head (or it cannot wait): false then.
func (h *headWait) await(t *trackedConn) bool {
	st, n := peekHead(t, h.acceptBuf[:])
	if st != headWaiting {
		return false
	}
	if n > 0 {
		t.arriving.Store(true)
	}
	now := h.c.clock.Now()
	t.since.Store(now.UnixNano())
	h.mu.Lock()
	if h.broken {
		h.mu.Unlock()
		return false
	}
	h.nextID++
	id := h.nextID
	stretch := time.Duration(float64(h.timeout) * (1 + rand.Float64()/2))
	h.waiting[id] = &waitingHead{t: t, deadline: now.Add(stretch).UnixNano()}
	t.headID, t.headWaiting = id, true
	h.mu.Unlock()
	h.c.conns.add(t, t)
	if err := h.poller.add(t, id); err != nil {
		// Not awaited after all: the server reads it.
		h.handOver(id)
	}
	return true
}

// handOver moves the connection waiting as id to ready, for Accept.
func (h *headWait) handOver(id uint64) {
	h.mu.Lock()
	w, ok := h.waiting[id]
	if ok {
		delete(h.waiting, id)
		w.t.headWaiting = false
		h.ready = append(h.ready, acceptResult{conn: w.t})
	}
	h.mu.Unlock()
	if ok {
		h.poller.remove(w.t)
		h.signal()
	}
}

// handOverWaiting moves every waiting connection to ready, for good: none
// is awaited after it.
func (h *headWait) handOverWaiting() {
	h.mu.Lock()
	h.broken = true
	ws := make([]*trackedConn, 0, len(h.waiting))
	for id, w := range h.waiting {
		delete(h.waiting, id)
		w.t.headWaiting = false
		ws = append(ws, w.t)
		h.ready = append(h.ready, acceptResult{conn: w.t})
	}
	h.mu.Unlock()
	for _, t := range ws {
		h.poller.remove(t)
	}
	h.signal()
}

// drop forgets t, closed while it waited.
func (h *headWait) drop(t *trackedConn) {
	h.mu.Lock()
	if t.headWaiting {
		delete(h.waiting, t.headID)
		t.headWaiting = false
	}
	h.mu.Unlock()
}

// expire closes the connections whose head has waited past its deadline,
// as the server would have at its header timeout.
func (h *headWait) expire(now time.Time) {
	var late []*trackedConn
	h.mu.Lock()
	for _, w := range h.waiting {
		if w.deadline <= now.UnixNano() {
			late = append(late, w.t)
		}
	}
	h.mu.Unlock()
	for _, t := range late {
		t.Close() // drops it
	}
}

// count reports how many connections wait.
func (h *headWait) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.waiting)
}

// arrived is the poller's word that bytes came for the connection waiting
// as id, or that its client went (ended): it hands the connection over if
// its head is in, or it cannot wait, and otherwise waits for more.
func (h *headWait) arrived(id uint64, ended bool, buf []byte) {
	h.mu.Lock()
	w, ok := h.waiting[id]
	h.mu.Unlock()
	if !ok {
		return // closed meanwhile
	}
	st, n := peekHead(w.t, buf)
	if n > 0 && !w.t.arriving.Load() {
		w.t.arriving.Store(true)
	}
	if ended || st != headWaiting {
		h.handOver(id)
	}
}

// headState is what a peek at a connection's first bytes found.
type headState uint8

const (
	headWaiting headState = iota // its head has not ended: wait
	headIn                       // ended, or as much as headPeek waits
	headGone                     // the client closed or reset, or the socket failed
)

// addHeadWait notes h, for the monitor to expire its connections and the
// metrics to count them.
func (c *Controller) addHeadWait(h *headWait) {
	c.headsMu.Lock()
	c.heads = append(c.heads, h)
	c.headsMu.Unlock()
}

// expireHeads closes every listener's connections whose head waited past
// its deadline.
func (c *Controller) expireHeads(now time.Time) {
	c.headsMu.Lock()
	hs := c.heads
	c.headsMu.Unlock()
	for _, h := range hs {
		h.expire(now)
	}
}

// waitingHeads counts the connections whose first head is awaited.
func (c *Controller) waitingHeads() int {
	c.headsMu.Lock()
	hs := c.heads
	c.headsMu.Unlock()
	n := 0
	for _, h := range hs {
		n += h.count()
	}
	return n
}
