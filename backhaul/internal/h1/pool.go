package h1

import (
	"context"
	"net"
	"sync"
	"time"
)

// Pool keeps idle keep-alive connections per upstream address, most
// recently used first, so that under light load the same few connections
// stay warm and the rest age out: the warmIdle most recently used for the
// idle timeout, those beyond for surplusIdleTimeout. A burst (a thousand
// long polls answered at once) leaves a thousand idle connections, each a
// descriptor the edge's budget counts; they are gone seconds after it.
type Pool struct {
	dialer      net.Dialer
	maxIdle     int
	idleTimeout time.Duration
	sendTimeout time.Duration // each Conn's ProgressConn bound; <= 0: none
	count       func(dial func() (net.Conn, error)) (net.Conn, error)

	mu    sync.Mutex
	hosts map[string]*idleConns
}

// idleConns is one address's idle connections, oldest first. Its timer
// closes the ones idle longer than the pool's idleTimeout; it is armed only
// while the list is not empty.
type idleConns struct {
	conns []*Conn
	timer *time.Timer
}

const (
	warmIdle           = 16
	surplusIdleTimeout = 2 * time.Second
)

// NewPool returns a pool that dials with dialTimeout, closes a connection
// idle for idleTimeout, keeps at most maxIdle idle connections per address,
// and bounds each write by sendTimeout (<= 0: no bound). count, if non-nil,
// makes every connection with the dial it is given, or refuses to (the
// edge counts them against its budget).
func NewPool(dialTimeout, idleTimeout, sendTimeout time.Duration, maxIdle int, count func(dial func() (net.Conn, error)) (net.Conn, error)) *Pool {
	return &Pool{
		count:       count,
		dialer:      net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second},
		maxIdle:     maxIdle,
		idleTimeout: idleTimeout,
		sendTimeout: sendTimeout,
		hosts:       map[string]*idleConns{},
	}
}

// Get returns an idle connection to addr, reporting reused, or dials one.
// A dial failure is returned as the dialer gave it.
//
// Every idle connection is peeked before reuse, however briefly it was
// idle: nothing reads an idle connection (that is what saves a goroutine
// per connection), so this is where a close from the upstream, or bytes
// it sent unasked, are seen. Bytes that arrive after a response has ended
// belong to no request: parsed as the next response they would hand one
// client another's answer, so the connection is closed instead.
// The peek is one non-blocking system call.
func (cp *Pool) Get(ctx context.Context, addr string, now time.Time) (pc *Conn, reused bool, err error) {
	for {
		pc = cp.pop(addr)
		if pc == nil {
			break
		}
		if !pc.rd.deadline.After(now) {
			// A passed deadline fails the peek before it looks.
			pc.rd.arm(now.Add(firstTick))
		}
		if pc.peek.alive() {
			return pc, true, nil
		}
		pc.NC.Close()
	}
	pc, err = cp.Dial(ctx, addr)
	return pc, false, err
}

// Dial opens a new connection to addr, for a request that must not take
// an idle one (a resend after a pooled connection failed).
func (cp *Pool) Dial(ctx context.Context, addr string) (*Conn, error) {
	dial := func() (net.Conn, error) { return cp.dialer.DialContext(ctx, "tcp", addr) }
	var nc net.Conn
	var err error
	if cp.count != nil {
		nc, err = cp.count(dial)
	} else {
		nc, err = dial()
	}
	if err != nil {
		return nil, err
	}
	return NewConn(nc, addr, cp.sendTimeout), nil
}

// pop takes addr's most recently used idle connection, nil for none.
func (cp *Pool) pop(addr string) *Conn {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	l := cp.hosts[addr]
	if l == nil || len(l.conns) == 0 {
		return nil
	}
	last := len(l.conns) - 1
	pc := l.conns[last]
	l.conns[last] = nil
	l.conns = l.conns[:last]
	return pc
}

// Put returns pc to the pool, or closes it when the pool is full.
func (cp *Pool) Put(pc *Conn, now time.Time) {
	pc.idleAt = now
	cp.mu.Lock()
	l := cp.hosts[pc.Addr]
	if l == nil {
		l = &idleConns{}
		cp.hosts[pc.Addr] = l
	}
	if len(l.conns) >= cp.maxIdle {
		cp.mu.Unlock()
		pc.NC.Close()
		return
	}
	l.conns = append(l.conns, pc)
	if l.timer == nil {
		addr := pc.Addr
		l.timer = time.AfterFunc(cp.idleTimeout, func() { cp.sweep(addr) })
	}
	if len(l.conns) == warmIdle+1 && cp.idleTimeout > surplusIdleTimeout {
		// Sooner, never later: a pool going 16, 17, 16 must not postpone
		// the sweep of its oldest connection each time.
		l.timer.Reset(max(surplusIdleTimeout-now.Sub(l.conns[0].idleAt), time.Millisecond))
	}
	cp.mu.Unlock()
}

// sweep closes addr's connections idle longer than idleTimeout, and those
// beyond the warmIdle newest idle longer than surplusIdleTimeout, and re-arms
// the timer for the oldest that remains; an address left with none is
// forgotten, so addresses that come and go with deploys do not accumulate.
func (cp *Pool) sweep(addr string) {
	now := time.Now()
	var expired []*Conn
	cp.mu.Lock()
	l := cp.hosts[addr]
	if l == nil {
		cp.mu.Unlock()
		return
	}
	n := 0
	for n < len(l.conns) {
		idle := now.Sub(l.conns[n].idleAt)
		if idle < cp.idleTimeout && (len(l.conns)-n <= warmIdle || idle < surplusIdleTimeout) {
			break
		}
		n++
	}
	expired = append(expired, l.conns[:n]...)
	l.conns = append(l.conns[:0], l.conns[n:]...)
	clear(l.conns[len(l.conns):cap(l.conns)])
	if len(l.conns) == 0 {
		l.timer = nil
		delete(cp.hosts, addr)
	} else {
		next := cp.idleTimeout - now.Sub(l.conns[0].idleAt)
		if len(l.conns) > warmIdle {
			next = min(next, surplusIdleTimeout-now.Sub(l.conns[0].idleAt))
		}
		l.timer.Reset(max(next, time.Millisecond))
	}
	cp.mu.Unlock()
	for _, pc := range expired {
		pc.NC.Close()
	}
}

// CloseIdle closes the connections idle for at least idleFor (0: every
// one). The pool stays usable.
func (cp *Pool) CloseIdle(idleFor time.Duration) {
	cutoff := time.Now().Add(-idleFor)
	var closing []*Conn
	cp.mu.Lock()
	for addr, l := range cp.hosts {
		// Oldest first: those idle long enough are a prefix.
		n := 0
		for n < len(l.conns) && (idleFor <= 0 || !l.conns[n].idleAt.After(cutoff)) {
			n++
		}
		closing = append(closing, l.conns[:n]...)
		l.conns = append(l.conns[:0], l.conns[n:]...)
		clear(l.conns[len(l.conns):cap(l.conns)])
		if len(l.conns) == 0 {
			if l.timer != nil {
				l.timer.Stop()
			}
			delete(cp.hosts, addr)
		}
	}
	cp.mu.Unlock()
	for _, pc := range closing {
		pc.NC.Close()
	}
}

// IdleCount returns the number of idle connections to addr.
func (cp *Pool) IdleCount(addr string) int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if l := cp.hosts[addr]; l != nil {
		return len(l.conns)
	}
	return 0
}
