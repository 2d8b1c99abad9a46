package admission

import (
	"errors"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Awaiting first heads and pacing them: docs/design.md, admission table.
// The server still reads and judges every byte: this only chooses when
// (judgeHead). A paced head's socket reports nothing until headPeek bytes
// wait (SO_RCVLOWAT; its end still wakes the poller); a visitor's head
// comes in a segment or a few, and is never paced.
const (
	headPeek      = 1024
	headPaceAfter = 4
	paceEvery     = time.Second
	paceDoublings = 2
	// paceDeadlineLead is how long a head handed over at its deadline
	// still has for its server to read it.
	paceDeadlineLead = 50 * time.Millisecond
)

// PlainListener is Listener for a listener whose connections speak plain
// HTTP/1 from their first byte, their first heads awaited outside the
// server. headTimeout is the server's ReadHeaderTimeout; proxied says that
// a PROXY protocol header may come first. Where the platform cannot, it is
// Listener.
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
	h := &headWait{c: c, poller: p, timeout: headTimeout, proxied: proxied, waiting: map[uint64]*waitingHead{}}
	h.more.L = &h.mu
	ln.heads = h
	return ln
}

// headWait holds a listener's connections whose first head is awaited.
// Its own goroutine accepts, from the first Accept on (a server not
// serving yet leaves connections in the backlog), and Accept returns what
// it and the poller hand over: so a head that ends while the accepting
// goroutine waits for room still goes to its server.
type headWait struct {
	c       *Controller
	poller  *headPoller
	timeout time.Duration
	proxied bool
	start   sync.Once

	acceptBuf [headPeek]byte // the accepting goroutine's

	// judgeMu guards the waitingHeads' judgement and pacing, and judgeBuf.
	judgeMu  sync.Mutex
	judgeBuf [headPeek]byte

	mu      sync.Mutex
	more    sync.Cond               // on mu: ready has grown, or end is set
	waiting map[uint64]*waitingHead // by id, which epoll events carry
	nextID  uint64
	ready   []net.Conn // for Accept, in order
	end     error      // Accept's once ready is empty
	shut    bool       // nothing waits any more
}

type waitingHead struct {
	t        *trackedConn
	id       uint64
	since    int64 // Unix ns of c.clock: when it began to wait
	deadline int64 // the same: closed then
	paced    atomic.Bool

	// Guarded by headWait's judgeMu.
	counted  bool  // in scafo_edge_paced_heads_total
	judged   int   // judgeHead's
	events   int   // times bytes came, up to headPaceAfter
	turns    uint8 // turns taken since paced, up to paceDoublings
	nextTurn int64 // once paced: when it is looked at next (Unix ns)
}

func (h *headWait) accept(l *listener) (net.Conn, error) {
	h.start.Do(func() {
		if l.isClosed() {
			h.finish(net.ErrClosed)
			return
		}
		h.c.headsMu.Lock()
		h.c.heads = append(h.c.heads, h)
		h.c.headsMu.Unlock()
		go h.poll()
		go h.acceptLoop(l)
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	for len(h.ready) == 0 && h.end == nil {
		h.more.Wait()
	}
	if len(h.ready) == 0 {
		return nil, h.end
	}
	t := h.ready[0]
	h.ready[0] = nil
	h.ready = h.ready[1:]
	return t, nil
}

func (h *headWait) acceptLoop(l *listener) {
	var backoff time.Duration
	for {
		t, err := l.acceptTracked()
		var te interface{ Temporary() bool }
		if err != nil && !l.isClosed() && errors.As(err, &te) && te.Temporary() {
			// As net/http's Serve does, which is not told.
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

// closeYoungerThan: net/http's Shutdown closes a new connection older than
// 5 s as idle.
const closeYoungerThan = 5 * time.Second

// finish ends the waits, and then Accept returns end. The connections
// younger than closeYoungerThan go to the server, their heads due by then
// (at an upgrade the old edge serves what it accepted until its own
// Shutdown), even one that has sent nothing yet: its client may be writing
// its request this moment. The others are closed.
func (h *headWait) finish(end error) {
	h.judgeMu.Lock() // no look or turn is half-way: the marks stay as read
	defer h.judgeMu.Unlock()
	now := h.c.clock.Now()
	var closing []*trackedConn
	h.mu.Lock()
	h.shut = true
	for id, w := range h.waiting {
		delete(h.waiting, id)
		if now.UnixNano()-w.since < int64(closeYoungerThan) {
			w.release(min(w.deadline, w.since+int64(closeYoungerThan)), now)
			h.ready = append(h.ready, w.t)
		} else {
			closing = append(closing, w.t)
		}
	}
	h.end = end
	h.mu.Unlock()
	h.more.Broadcast()
	for _, t := range closing {
		t.closeUnread()
	}
	h.poller.close()
	h.c.headsMu.Lock()
	h.c.heads = slices.DeleteFunc(slices.Clone(h.c.heads), func(x *headWait) bool { return x == h })
	h.c.headsMu.Unlock()
}

// release readies w, out of the waits, for its server: the kernel's mark
// lowered, its head due by deadline, but not before paceDeadlineLead.
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
	h.more.Signal()
}

// await puts t in the epoll set, unless its first bytes need not wait.
func (h *headWait) await(t *trackedConn) bool {
	if t.socket = newHeadSocket(t.Conn); t.socket == nil { // set before t is shared
		return false
	}
	n, gone := peekHead(t, h.acceptBuf[:])
	if gone || n == len(h.acceptBuf) {
		return false
	}
	st, judged := judgeHead(h.acceptBuf[:n], h.proxied, -1)
	if st != headWaiting {
		return false
	}
	if n > 0 {
		t.arriving.Store(true)
	}
	now := h.c.clock.Now()
	t.since.Store(now.UnixNano())
	// Stretched as the server's own deadlines are.
	stretch := time.Duration(float64(h.timeout) * (1 + rand.Float64()/2))
	h.mu.Lock()
	if h.shut {
		h.mu.Unlock()
		return false
	}
	h.nextID++
	id := h.nextID
	t.waitID = id
	h.waiting[id] = &waitingHead{t: t, id: id, since: now.UnixNano(), deadline: now.Add(stretch).UnixNano(), judged: judged}
	h.mu.Unlock()
	h.c.conns.add(t, t)
	if err := h.poller.add(t, id); err != nil {
		h.handOver(id) // not awaited after all
	}
	return true
}

// arrived is the poller's word that bytes came for the connection waiting
// as id, or that its client went (ended); it paces a trickling head.
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
		return
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

// judge hands w over unless its head must still wait, and reports whether
// it still waits.
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
// paced head once the contention is over, unpacing it.
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

// expire closes the connections whose head has waited past its deadline.
func (h *headWait) expire(now time.Time) {
	h.judgeMu.Lock()
	defer h.judgeMu.Unlock()
	for _, w := range h.waitingWhere(func(w *waitingHead) bool { return w.deadline <= now.UnixNano() }) {
		// A paced head that ended since its last turn is the server's, as
		// a read made in time would have been.
		if h.judge(w, false) && h.drop(w.t) {
			w.t.closeUnread()
		}
	}
}

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

func (h *headWait) handOver(id uint64) {
	h.mu.Lock()
	w, ok := h.waiting[id]
	delete(h.waiting, id)
	h.mu.Unlock()
	if ok {
		h.poller.remove(w.t)
		w.release(w.deadline, h.c.clock.Now())
		h.push(w.t)
	}
}

// shutDown hands every waiting connection over: the epoll set failed.
func (h *headWait) shutDown() {
	h.mu.Lock()
	h.shut = true
	h.mu.Unlock()
	for _, w := range h.waitingWhere(func(*waitingHead) bool { return true }) {
		h.handOver(w.id)
	}
}

// drop takes t out of the waits, reporting whether it waited.
func (h *headWait) drop(t *trackedConn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.waiting[t.waitID]
	delete(h.waiting, t.waitID)
	return ok
}

func (c *Controller) headWaits() []*headWait {
	c.headsMu.Lock()
	defer c.headsMu.Unlock()
	return c.heads
}

func (c *Controller) expireHeads(now time.Time) {
	for _, h := range c.headWaits() {
		h.expire(now)
	}
}

func (c *Controller) headTurns(now time.Time) {
	for _, h := range c.headWaits() {
		h.takeTurns(now)
	}
}

func (c *Controller) waitingHeads() (n int) {
	for _, h := range c.headWaits() {
		h.mu.Lock()
		n += len(h.waiting)
		h.mu.Unlock()
	}
	return n
}

// headState is what a connection's first bytes say.
type headState uint8

const (
	headWaiting headState = iota // its head has not ended: wait
	headIn                       // for the server now
)
