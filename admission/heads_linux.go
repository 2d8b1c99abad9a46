package admission

import (
	"fmt"
	"net"
	"os"
	"syscall"
)

// headPoller is a listener's epoll set of the connections whose first head
// is awaited. Edge-triggered: level-triggered, a connection would be ready
// as long as its bytes wait, and a peek leaves them there. The set waits in
// Go's netpoller, so no thread blocks in epoll_wait. Events carry the
// connection's id in headWait, never its descriptor, which a closed
// connection gives back for reuse (the kernel drops it from the set).
type headPoller struct {
	ep    *os.File
	epRaw syscall.RawConn
}

func newHeadPoller() (*headPoller, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	// Non-blocking, so that os.NewFile puts it in the netpoller.
	if err := syscall.SetNonblock(epfd, true); err != nil {
		syscall.Close(epfd)
		return nil, fmt.Errorf("epoll set: %w", err)
	}
	ep := os.NewFile(uintptr(epfd), "heads-epoll")
	rc, err := ep.SyscallConn()
	if err != nil {
		ep.Close()
		return nil, fmt.Errorf("epoll set: %w", err)
	}
	return &headPoller{ep: ep, epRaw: rc}, nil
}

// EPOLLET is 1<<31: syscall spells it negative on some architectures and
// positive on others.
const headEvents uint32 = syscall.EPOLLIN | syscall.EPOLLRDHUP | 1<<31

func (p *headPoller) add(t *trackedConn, id uint64) error {
	return p.ctl(t, syscall.EPOLL_CTL_ADD, id)
}

// remove takes t out of the set; an error means it is closed, and out
// already.
func (p *headPoller) remove(t *trackedConn) { p.ctl(t, syscall.EPOLL_CTL_DEL, 0) }

func (p *headPoller) ctl(t *trackedConn, op int, id uint64) error {
	ev := syscall.EpollEvent{Events: headEvents, Fd: int32(uint32(id)), Pad: int32(uint32(id >> 32))}
	var cerr error
	if err := t.socket.rc.Control(func(fd uintptr) {
		// Through the set's own file, so that a set closed meanwhile is
		// an error, not a descriptor number reused.
		if err := p.epRaw.Control(func(epfd uintptr) {
			cerr = syscall.EpollCtl(int(epfd), op, int(fd), &ev)
		}); err != nil {
			cerr = err
		}
	}); err != nil {
		return err
	}
	return cerr
}

func (p *headPoller) close() { p.ep.Close() }

// peekHead copies t's queued bytes into buf without taking them, and
// reports how many there are, or that its client (or its socket) is gone.
func peekHead(t *trackedConn, buf []byte) (n int, gone bool) {
	var perr error
	if err := t.socket.rc.Control(func(fd uintptr) {
		// MSG_DONTWAIT never sleeps, so no EINTR.
		n, _, perr = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}); err != nil {
		return 0, true
	}
	switch {
	case perr == syscall.EAGAIN:
		return 0, false
	case perr != nil || n == 0:
		return 0, true
	}
	return n, false
}

// drainUnread drops what was only peeked at, so that closing t sends a
// FIN, not a reset.
func drainUnread(t *trackedConn) {
	var buf [headPeek]byte
	t.socket.rc.Control(func(fd uintptr) {
		syscall.Recvfrom(int(fd), buf[:], syscall.MSG_DONTWAIT)
	})
}

// poll hands each event to h until the set is closed.
func (h *headWait) poll() {
	var evs [128]syscall.EpollEvent
	for {
		var n int
		var werr error
		err := h.poller.epRaw.Read(func(fd uintptr) bool {
			for {
				n, werr = syscall.EpollWait(int(fd), evs[:], 0)
				if werr != syscall.EINTR {
					break
				}
			}
			return n != 0 || werr != nil // none: wait for the set to be readable
		})
		if err != nil { // closed by close
			return
		}
		if werr != nil {
			h.c.log.Error().Err(werr).Msg("epoll_wait for first request heads failed; the connections awaiting theirs go to the server")
			h.shutDown()
			return
		}
		for _, ev := range evs[:n] {
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			h.arrived(id, ev.Events&(syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0)
		}
	}
}

// headSocket is a waiting connection's socket. Its callback is made once,
// so that a turn allocates nothing.
type headSocket struct {
	rc           syscall.RawConn
	lowat        int
	setLowatFunc func(fd uintptr)
}

// newHeadSocket returns conn's socket, nil if it has none (a test's pipe).
func newHeadSocket(conn net.Conn) *headSocket {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &headSocket{rc: rc}
	s.setLowatFunc = func(fd uintptr) {
		syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, s.lowat)
	}
	return s
}

// setRcvLowat sets how many bytes must wait before the kernel reports the
// socket readable (SO_RCVLOWAT; Linux 4.18 or later for TCP's wake-ups);
// its end, or the receive window or memory running short, report it anyway.
// An error leaves it reported as before.
func (s *headSocket) setRcvLowat(bytes int) {
	s.lowat = bytes
	s.rc.Control(s.setLowatFunc)
}
