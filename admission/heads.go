package admission

import (
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// On a listener whose connections speak plain HTTP/1 from their first
// byte (PlainListener), a connection whose first request head has not
// ended when it is accepted waits for it here, outside the HTTP server:
// in one epoll set for the whole listener (heads_linux.go), with no
// goroutine, no buffer and no stack of its own, and is handed to the
// server once the head has ended, or net/http would already refuse what
// came, or its client has gone, or headPeek bytes wait. A visitor's head
// comes in a segment or a few, so it waits one round trip at most; a
// slowloris's never ends, and each of its connections held by net/http
// costs a goroutine (a stack that every garbage collection scans), two
// buffers, and a wake-up of its goroutine for every byte. Waiting here, a
// connection costs an entry and a peek at its queued bytes each time some
// arrive (bench/README has what that saved, measured). The server still reads every byte
// the client sent, and judges it: this only chooses when (judgeHead).
//
// It is counted against the budget as any connection (it was accepted),
// listed for shedding as a new connection with bytes arriving (a slow
// first request), and closed once its head has waited the server's header
// timeout, stretched as the server's own deadlines are (1 to 1.5 times,
// drawn per connection), as the server would have closed it; if it is
// handed over with its head not ended (headPeek bytes), its server's
// header deadline is held to that one. Keep-alive heads, and every head
// over TLS, are read by the server, as net/http reads them.
const headPeek = 1024

// PlainListener is Listener for a listener whose connections speak plain
// HTTP/1 from their first byte (no TLS): each connection's first request
// head is awaited outside the server (heads.go). headTimeout is the
// server's ReadHeaderTimeout; proxied says that a PROXY protocol header may
// come first. Where the platform cannot, it is Listener.
func (c *Controller) PlainListener(l net.Listener, headTimeout time.Duration, proxied bool) net.Listener {
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
	ln.heads = &headWait{c: c, poller: p, timeout: headTimeout, proxied: proxied,
		waiting: map[uint64]*waitingHead{}, byConn: map[*trackedConn]*waitingHead{}, notify: make(chan struct{}, 1), ended: make(chan struct{})}
	return ln
}

// headWait holds a listener's connections whose first head is awaited.
// Its own goroutine accepts, from the first Accept on (so that a server
// not serving yet leaves connections in the kernel's backlog), and Accept
// returns what it and the poller hand over, in order: so that a head that
// comes in while the accepting goroutine waits for room at the budget
// still goes to its server at once.
type headWait struct {
	c       *Controller
	poller  *headPoller
	timeout time.Duration
	proxied bool
	start   sync.Once
	started bool // by start, before the listener's close: guarded by mu

	acceptBuf [headPeek]byte // for the peeks of the accepting goroutine

	// judgeMu is held while a waiting head is looked at and judged, by
	// the poller or at its turn: it guards the waitingHeads' judgement
	// and pacing, and the buffer their peeks use.
	judgeMu  sync.Mutex
	judgeBuf [headPeek]byte

	notify  chan struct{} // a result is ready: one signal waits at most
	ended   chan struct{} // closed with end set
	mu      sync.Mutex
	waiting map[uint64]*waitingHead       // by id, which epoll events carry
	byConn  map[*trackedConn]*waitingHead // the same, by connection
	nextID  uint64
	ready   []net.Conn // for Accept to return, in order
	end     error      // the listener's, once ready is empty
	shut    bool       // nothing waits any more: the listener ended, or the epoll set failed
}

type waitingHead struct {
	t        *trackedConn
	id       uint64
	since    int64 // Unix ns of c.clock: when it began to wait
	deadline int64 // the same: closed then
	paced    atomic.Bool
	counted  bool // in scafo_edge_paced_heads_total; under judgeMu

	// Guarded by headWait's judgeMu.
	judged   int   // judgeHead's
	events   int   // times bytes came, up to headPaceAfter
	turns    uint8 // turns taken since paced, up to paceDoublings
	nextTurn int64 // once paced: when it is looked at next (Unix ns)
}

// A head that keeps trickling is looked at on the edge's schedule, not
// its client's: a look at each byte of many trickling connections takes
// the CPU their clients choose. Only while the box is contended (its
// connections, or its memory, past their high-water marks, or Accept
// waiting for room): until then a head on a slow link is looked at as its
// bytes come, and handed over the moment it ends, and a slow visitor
// waits for nothing of the edge's. Under contention, once bytes have come
// headPaceAfter times and it has waited slowAge, the kernel is asked not
// to report its bytes until headPeek wait (SO_RCVLOWAT; its end still
// wakes the poller), and it is looked at paceEvery after, then twice as
// far each turn up to paceEvery<<paceDoublings, plus up to half that
// drawn each time; a head that ends is handed over at its next turn. A
// visitor's head comes in a segment or a few, and waits no turn. The mark
// is lowered before its server gets it.
const (
	headPaceAfter = 4
	paceEvery     = time.Second
	paceDoublings = 2
	// paceDeadlineLead is how long before its deadline a head handed over
	// at its last turn still has for its server to read it.
	paceDeadlineLead = 50 * time.Millisecond
)

// accept returns the next connection for the server: one whose head was
// awaited and is in, or one just accepted that need not wait.
func (h *headWait) accept(l *listener) (net.Conn, error) {
	h.start.Do(func() {
		h.mu.Lock()
		closed := l.isClosed()
		h.started = !closed
		h.mu.Unlock()
		if closed {
			h.finish(net.ErrClosed)
			return
		}
		h.c.addHeadWait(h)
		go h.poll()
		go h.acceptLoop(l)
	})
	for {
		h.mu.Lock()
		if len(h.ready) > 0 {
			t := h.ready[0]
			h.ready[0] = nil
			h.ready = h.ready[1:]
			h.mu.Unlock()
			return t, nil
		}
		end := h.end
		h.mu.Unlock()
		if end != nil {
			return nil, end
		}
		select {
		case <-h.notify:
		case <-h.ended:
		}
	}
}

// acceptLoop accepts until the listener ends, puts each connection whose
// head has not ended in the epoll set and hands the others over.
func (h *headWait) acceptLoop(l *listener) {
	var backoff time.Duration
	for {
		t, err := l.acceptTracked()
		if err != nil && !l.isClosed() && isTemporary(err) {
			// As net/http's Serve does, which is not told: it would
			// retry at once, and log each time.
			h.c.log.Warn().Err(err).Dur("retry_in", backoff).Msg("accept failed; trying again")
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(backoff):
			case <-l.done:
			}
			continue
		}
		if err != nil {
			if l.isClosed() {
				err = net.ErrClosed
			}
			h.finish(err)
			return
		}
		backoff = 0
		if !h.await(t) {
			h.push(t)
		}
	}
}

func isTemporary(err error) bool {
	var te interface{ Temporary() bool }
	return errors.As(err, &te) && te.Temporary()
}

// closeYoungerThan is how old a connection still on its first request
// may be when the listener ends and be handed to its server rather than
// closed: net/http's Shutdown closes a new one older than 5 s as idle.
const closeYoungerThan = 5 * time.Second

// finish ends the listener's waits: a connection that has waited
// closeYoungerThan is closed, as its server's Shutdown would close it; the
// others go to the server, with till closeYoungerThan after their accept
// to end their heads (an upgrade hands the socket on, and the old edge
// serves what it accepted until its own Shutdown). Then Accept returns end.
//
// One that has sent nothing yet goes to the server too: its client may be
// writing its request this moment (a client writes after its connect
// returns, and the accept can come first), and a server holds a new
// connection, as its Shutdown does, until the request or the timeout.
// Closing it lost that request at an upgrade.
func (h *headWait) finish(end error) {
	h.judgeMu.Lock() // no look or turn is half-way: the marks stay as read
	defer h.judgeMu.Unlock()
	h.mu.Lock()
	h.shut = true
	ws := make([]*waitingHead, 0, len(h.waiting))
	for _, w := range h.waiting {
		h.forget(w)
		ws = append(ws, w)
	}
	h.mu.Unlock()
	now := h.c.clock.Now().UnixNano()
	var ready []net.Conn
	var closing []*trackedConn
	for _, w := range ws {
		if now-w.since < int64(closeYoungerThan) {
			// By closeYoungerThan after its accept, as if its server
			// had had it since: its Shutdown waits for it no longer.
			w.release(min(w.deadline, w.since+int64(closeYoungerThan)), h.c.clock.Now())
			ready = append(ready, w.t)
		} else {
			closing = append(closing, w.t)
		}
	}
	h.mu.Lock()
	h.ready = append(h.ready, ready...)
	h.end = end
	started := h.started
	h.mu.Unlock()
	close(h.ended)
	for _, t := range closing {
		t.closeUnread()
	}
	h.poller.close()
	if started {
		h.c.removeHeadWait(h)
	}
}

// release readies w, out of the waits, for its server: with the kernel's
// mark lowered, and its head due by deadline, but not before the server
// has had paceDeadlineLead to read what came: a head that ended in time
// and is handed over at its deadline (at a paced head's expiry, say) is
// read.
func (w *waitingHead) release(deadline int64, now time.Time) {
	if w.paced.Load() {
		w.t.socket.setRcvLowat(1)
	}
	w.t.headDeadline.Store(max(deadline, now.Add(paceDeadlineLead).UnixNano()))
}

func (h *headWait) push(t *trackedConn) {
	h.mu.Lock()
	h.ready = append(h.ready, t)
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
// the rest, unless they need not wait: false then.
func (h *headWait) await(t *trackedConn) bool {
	// Found once, before the connection is shared: the poller's and
	// pacing's calls use it.
	if t.socket = newHeadSocket(t.Conn); t.socket == nil {
		return false
	}
	n, gone := peekHead(t, h.acceptBuf[:])
	if gone {
		return false
	}
	st, judged := headWaiting, -1
	if n == len(h.acceptBuf) {
		st = headIn
	} else {
		st, judged = judgeHead(h.acceptBuf[:n], h.proxied, judged)
	}
	if st != headWaiting {
		return false
	}
	if n > 0 {
		t.arriving.Store(true)
	}
	now := h.c.clock.Now()
	t.since.Store(now.UnixNano())
	stretch := time.Duration(float64(h.timeout) * (1 + rand.Float64()/2))
	h.mu.Lock()
	if h.shut {
		h.mu.Unlock()
		return false
	}
	h.nextID++
	id := h.nextID
	w := &waitingHead{t: t, id: id, since: now.UnixNano(), deadline: now.Add(stretch).UnixNano(), judged: judged}
	h.waiting[id], h.byConn[t] = w, w
	h.mu.Unlock()
	h.c.conns.add(t, t)
	if err := h.poller.add(t, id); err != nil {
		h.handOver(id) // not awaited after all: the server reads it
	}
	return true
}

// arrived is the poller's word that bytes came for the connection waiting
// as id, or that its client went (ended): it hands the connection over
// unless its head must still wait, and paces a head that keeps trickling.
func (h *headWait) arrived(id uint64, ended bool) {
	h.judgeMu.Lock()
	defer h.judgeMu.Unlock()
	h.mu.Lock()
	w, ok := h.waiting[id]
	h.mu.Unlock()
	if !ok || !h.judge(w, ended) || w.paced.Load() {
		return
	}
	if w.events++; w.events < headPaceAfter || !h.c.contended.Load() {
		return // paced only under contention
	}
	now := h.c.clock.Now()
	if now.UnixNano()-w.since < int64(slowAge) {
		return
	}
	w.paced.Store(true)
	if !w.counted { // once a head, however many contentions pace it
		w.counted = true
		h.c.m.paced.Inc()
	}
	w.t.socket.setRcvLowat(headPeek)
	w.nextTurn = nextHeadTurn(now, 0)
}

func nextHeadTurn(now time.Time, turns uint8) int64 {
	every := paceEvery << turns
	return now.Add(every + rand.N(every/2)).UnixNano()
}

// judge looks at w's bytes and hands it over unless its head must still
// wait (or its client went: ended); it reports whether it still waits.
func (h *headWait) judge(w *waitingHead, ended bool) bool {
	buf := h.judgeBuf[:]
	n, gone := peekHead(w.t, buf)
	if n > 0 && !w.t.arriving.Load() {
		w.t.arriving.Store(true)
	}
	st := headIn
	if !ended && !gone && n < len(buf) {
		st, w.judged = judgeHead(buf[:n], h.proxied, w.judged)
	}
	if st == headWaiting {
		return true
	}
	h.handOver(w.id)
	return false
}

// takeTurns looks at the paced heads whose turn has come, and at every
// paced head once the contention is over: from then on its bytes are
// looked at as they come again.
func (h *headWait) takeTurns(now time.Time) {
	h.judgeMu.Lock()
	defer h.judgeMu.Unlock()
	contended := h.c.contended.Load()
	due := h.waitingWhere(func(w *waitingHead) bool {
		return w.paced.Load() && (w.nextTurn <= now.UnixNano() || !contended)
	})
	for _, w := range due {
		if !h.judge(w, false) {
			continue
		}
		if !contended {
			w.paced.Store(false)
			w.t.socket.setRcvLowat(1)
			w.events, w.turns = 0, 0
			continue
		}
		w.turns = min(w.turns+1, paceDoublings)
		w.nextTurn = nextHeadTurn(now, w.turns)
	}
}

// waitingWhere returns the waiting heads that match.
func (h *headWait) waitingWhere(match func(*waitingHead) bool) []*waitingHead {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ws []*waitingHead
	for _, w := range h.waiting {
		if match(w) {
			ws = append(ws, w)
		}
	}
	return ws
}

// forget takes w out of the waits; h.mu is held.
func (h *headWait) forget(w *waitingHead) {
	delete(h.waiting, w.id)
	delete(h.byConn, w.t)
}

// handOver moves the connection waiting as id to ready, for Accept.
func (h *headWait) handOver(id uint64) {
	h.mu.Lock()
	w, ok := h.waiting[id]
	if ok {
		h.forget(w)
	}
	h.mu.Unlock()
	if ok {
		h.poller.remove(w.t)
		w.release(w.deadline, h.c.clock.Now())
		h.push(w.t)
	}
}

// shutDown hands every waiting connection over, for good: the epoll set
// failed, and nothing waits any more.
func (h *headWait) shutDown() {
	h.mu.Lock()
	h.shut = true
	ids := make([]uint64, 0, len(h.waiting))
	for id := range h.waiting {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	for _, id := range ids {
		h.handOver(id)
	}
}

// drop forgets t, closed while it waited.
func (h *headWait) drop(t *trackedConn) {
	h.mu.Lock()
	if w, ok := h.byConn[t]; ok {
		h.forget(w)
	}
	h.mu.Unlock()
}

// expire closes the connections whose head has waited past its deadline,
// as the server would have at its header timeout.
func (h *headWait) expire(now time.Time) {
	h.judgeMu.Lock()
	defer h.judgeMu.Unlock()
	late := h.waitingWhere(func(w *waitingHead) bool { return w.deadline <= now.UnixNano() })
	for _, w := range late {
		// A paced head may have ended since its last turn: it is the
		// server's, as a read made in time would have been.
		if !h.judge(w, false) {
			continue
		}
		h.mu.Lock()
		_, still := h.waiting[w.id]
		if still {
			h.forget(w)
		}
		h.mu.Unlock()
		if still {
			w.t.closeUnread()
		}
	}
}

// count reports how many connections wait.
func (h *headWait) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.waiting)
}

// headState is what a connection's first bytes say.
type headState uint8

const (
	headWaiting headState = iota // its head has not ended: wait
	headIn                       // for the server now
)
