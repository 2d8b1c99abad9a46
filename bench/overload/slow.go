package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Mode slow trickles each connection's request headers, as slowloris
// does: the request line and Host at once, then one byte of a header every
// -interval, never the blank line that ends them. When the proxy ends a
// connection (an answer such as 408, a close, a reset) that is counted and
// another is opened at once, from the same source address, until the
// release; those still open at the release are counted "open".
//
// It is cheap, so that on a small box the load does not take the CPU the
// proxy is measured with: thousands of connections each woken once a
// second by a ticker of its own (a goroutine, a timer, a write deadline
// each) took about 0.7 of a core for 19,000 connections. Here, per
// process:
//
//   - a timing wheel: one goroutine turns it every -interval/50 and writes
//     one byte to each connection of the bucket that comes up, without
//     waiting (a full send buffer skips that byte); a connection joins the
//     bucket just written, so its next byte comes one -interval later;
//   - an epoll set of every open connection, one-shot: one goroutine
//     waits on it (in Go's netpoller) and hears at once when the proxy answers or closes one,
//     as a read would, with no goroutine parked per connection;
//   - a goroutine per connection only while it is being opened or its end
//     read, which is what the proxy makes it do.
type slowLoad struct {
	p         *loadProc
	ctx       context.Context
	sem       chan struct{}
	attempted func()
	done      func()
	start     []byte   // the request line and the headers sent at once
	epfd      int      // the epoll set, for epoll_ctl
	ep        *os.File // the same, for poll's wait; closed by stop
	buckets   int
	stopped   chan struct{} // closed by stop: the wheel and the poller end

	mu       sync.Mutex
	slots    []slowSlot
	wheel    [][]wheelEntry
	pos      int // the bucket written last
	stopping bool
	once     sync.Once
}

// slowSlot is connection i: its source address and its place in the
// counts stay as its connections come and go.
type slowSlot struct {
	c     net.Conn // nil while it is opened, its end read, or after the stop
	rc    syscall.RawConn
	gen   uint32    // which of the slot's connections c is
	since time.Time // when c's headers began
	ready bool      // counted as attempted
	ended bool      // done with, counted as done
}

type wheelEntry struct {
	i   int
	gen uint32
}

// one is the byte a connection gets every -interval.
var one = []byte("a")

// slow starts the load of mode slow: cfg.N connections, each calling done
// once it ends for good (the release, ctx's end), after attempted.
func (p *loadProc) slow(ctx context.Context, sem chan struct{}, attempted, done func()) error {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("slow: epoll: %w", err)
	}
	// Non-blocking, so that os.NewFile puts it in the netpoller (poll).
	if err := syscall.SetNonblock(epfd, true); err != nil {
		syscall.Close(epfd)
		return fmt.Errorf("slow: epoll: %w", err)
	}
	// At most 50 buckets and at least a millisecond a turn: -interval 20ms
	// in a test turns 20 buckets a millisecond apart.
	buckets := int(min(max(p.cfg.Interval/time.Millisecond, 1), 50))
	s := &slowLoad{p: p, ctx: ctx, sem: sem, attempted: attempted, done: done, epfd: epfd, ep: os.NewFile(uintptr(epfd), "epoll"), buckets: buckets,
		start:   fmt.Appendf(nil, "GET / HTTP/1.1\r\nHost: %s\r\nUser-Agent: bench-overload\r\nX-Slow: ", p.cfg.Host),
		stopped: make(chan struct{}), slots: make([]slowSlot, p.cfg.N), wheel: make([][]wheelEntry, buckets)}
	go s.poll()
	go s.turn()
	go func() {
		select {
		case <-ctx.Done():
		case <-p.releaseCh:
		}
		s.stop()
	}()
	for i := range s.slots {
		go s.open(i)
	}
	return nil
}

// open opens connection i again and again until it is in the wheel or the
// load stops; a connect that failed is tried again an -interval later.
func (s *slowLoad) open(i int) {
	p := s.p
	for {
		s.mu.Lock()
		stopping := s.stopping
		s.mu.Unlock()
		if stopping {
			s.end(i)
			return
		}
		c := p.dial(s.ctx, i, s.sem, func() {})
		if c == nil {
			s.markReady(i)
			select {
			case <-time.After(p.cfg.Interval):
			case <-s.stopped:
			}
			continue
		}
		<-s.sem
		if _, err := c.Write(s.start); err != nil {
			c.Close()
			p.record(Classify(err))
			s.markReady(i)
			continue
		}
		p.open.Add(1)
		s.markReady(i)
		added, err := s.add(i, c)
		if added {
			return // the wheel writes to it, the poller hears its end
		}
		c.Close()
		p.open.Add(-1)
		if err != nil {
			fmt.Fprintf(os.Stderr, "overload conns: %v\n", err)
			p.record(OutError)
			continue
		}
		p.record(OutOpen) // opened as the load stopped: open at the release
		s.end(i)
		return
	}
}

// add puts c in slot i, in the bucket just written and in the epoll set;
// false if the load stopped meanwhile (or epoll refused it: err).
func (s *slowLoad) add(i int, c net.Conn) (bool, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false, fmt.Errorf("slow: %T has no descriptor", c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, fmt.Errorf("slow: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return false, nil
	}
	sl := &s.slots[i]
	sl.gen++
	// One-shot: one event per connection, its end; the event names the
	// slot and which of its connections, never a descriptor that may have
	// been reused.
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT,
		Fd: int32(i), Pad: int32(sl.gen)}
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cerr = syscall.EpollCtl(s.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev)
	}); err != nil {
		return false, fmt.Errorf("slow: %w", err)
	}
	if cerr != nil {
		return false, fmt.Errorf("slow: epoll_ctl: %w", cerr)
	}
	sl.c, sl.rc, sl.since = c, rc, time.Now()
	s.wheel[s.pos] = append(s.wheel[s.pos], wheelEntry{i: i, gen: sl.gen})
	return true, nil
}

// turn writes a byte to each connection of the next bucket every
// -interval/buckets, and ends a connection that has lived -timeout.
func (s *slowLoad) turn() {
	cfg := s.p.cfg
	tick := time.NewTicker(cfg.Interval / time.Duration(s.buckets))
	defer tick.Stop()
	type expired struct {
		i int
		c net.Conn
	}
	var old []expired
	for {
		select {
		case <-tick.C:
		case <-s.stopped:
			return
		}
		now := time.Now()
		s.mu.Lock()
		s.pos = (s.pos + 1) % s.buckets
		live := s.wheel[s.pos][:0]
		for _, e := range s.wheel[s.pos] {
			sl := &s.slots[e.i]
			if sl.c == nil || sl.gen != e.gen {
				continue // ended: its next connection is in another bucket
			}
			if now.Sub(sl.since) >= cfg.Timeout {
				old = append(old, expired{e.i, sl.c})
				sl.c, sl.rc = nil, nil
				continue
			}
			// Not waiting: a byte the send buffer cannot take is skipped
			// (never, at a byte a second); an error is the poller's to
			// hear.
			sl.rc.Write(func(fd uintptr) bool {
				syscall.Write(int(fd), one)
				return true
			})
			live = append(live, e)
		}
		clear(s.wheel[s.pos][len(live):])
		s.wheel[s.pos] = live
		s.mu.Unlock()
		for _, e := range old {
			go s.finish(e.i, e.c, OutTimeout)
		}
		old = old[:0]
	}
}

// poll waits on the epoll set and hands each connection the proxy ended
// to ended. The set's own descriptor waits in Go's netpoller, as a socket
// would: no thread blocks in epoll_wait, so the runtime's monitor has no
// system call to take a P back from.
func (s *slowLoad) poll() {
	rc, err := s.ep.SyscallConn()
	if err != nil {
		fmt.Fprintf(os.Stderr, "overload conns: slow: %v; connections' ends go unheard\n", err)
		return
	}
	evs := make([]syscall.EpollEvent, 256)
	for {
		var n int
		var werr error
		err := rc.Read(func(fd uintptr) bool {
			for {
				n, werr = syscall.EpollWait(int(fd), evs, 0)
				if werr != syscall.EINTR {
					break
				}
			}
			return n != 0 || werr != nil // none ready: wait for the set to be readable
		})
		if err != nil {
			return // closed by stop
		}
		if werr != nil {
			fmt.Fprintf(os.Stderr, "overload conns: slow: epoll_wait: %v; connections' ends go unheard\n", werr)
			return
		}
		for _, ev := range evs[:n] {
			go s.ended(int(ev.Fd), uint32(ev.Pad))
		}
	}
}

// ended reads what the proxy sent on slot i's connection gen (an answer,
// or its end), counts it and opens the next.
func (s *slowLoad) ended(i int, gen uint32) {
	s.mu.Lock()
	sl := &s.slots[i]
	if sl.c == nil || sl.gen != gen {
		s.mu.Unlock() // stopped, or ended for its -timeout meanwhile
		return
	}
	c, since := sl.c, sl.since
	sl.c, sl.rc = nil, nil
	s.mu.Unlock()
	// What the proxy does: an answer, or the end of the connection. It has
	// begun, as epoll said; within the connection's life.
	c.SetReadDeadline(since.Add(s.p.cfg.Timeout))
	outcome := ""
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 1024), nil)
	if err != nil {
		outcome = Classify(err)
	} else {
		resp.Body.Close()
		outcome = strconv.Itoa(resp.StatusCode)
	}
	s.finish(i, c, outcome)
}

// finish closes slot i's connection c, counts what ended it, and opens the
// next.
func (s *slowLoad) finish(i int, c net.Conn, outcome string) {
	c.Close()
	s.p.open.Add(-1)
	s.p.record(outcome)
	s.open(i)
}

// stop ends the load: every connection open now is closed and counted
// "open"; those being opened or read end as they come to it.
func (s *slowLoad) stop() {
	s.once.Do(func() {
		s.mu.Lock()
		s.stopping = true
		type open struct {
			i int
			c net.Conn
		}
		var cs []open
		for i := range s.slots {
			if c := s.slots[i].c; c != nil {
				cs = append(cs, open{i, c})
				s.slots[i].c, s.slots[i].rc = nil, nil
			}
		}
		s.mu.Unlock()
		close(s.stopped)
		s.ep.Close() // no add comes after stopping: the set can go
		for _, o := range cs {
			o.c.Close()
			s.p.open.Add(-1)
			s.p.record(OutOpen)
			s.end(o.i)
		}
	})
}

// markReady counts slot i as attempted, once.
func (s *slowLoad) markReady(i int) {
	s.mu.Lock()
	first := !s.slots[i].ready
	s.slots[i].ready = true
	s.mu.Unlock()
	if first {
		s.attempted()
	}
}

// end is slot i done with for good, once.
func (s *slowLoad) end(i int) {
	s.markReady(i)
	s.mu.Lock()
	first := !s.slots[i].ended
	s.slots[i].ended = true
	s.mu.Unlock()
	if first {
		s.done()
	}
}
