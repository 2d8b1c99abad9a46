package handover

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// TestOldEdgeReadsOnlySmallFrames: the old edge reads hellos and acks,
// never more than a few dozen bytes, from a stranger or a successor alike;
// a peer announcing the largest frame the exchange knows must not make it
// set aside that much, or a few of them at once would exhaust its memory.
func TestOldEdgeReadsOnlySmallFrames(t *testing.T) {
	old := bindProcess(t, "old")
	t.Cleanup(func() { old.socks.Close() })
	for _, tc := range []struct {
		name string
		read func(o *Offer, c *net.UnixConn)
	}{
		{"refusing a stranger", func(o *Offer, c *net.UnixConn) {
			o.refuse(c, "not this edge's user", errors.New("a stranger"))
		}},
		{"a successor's hello", func(o *Offer, c *net.UnixConn) {
			if err := o.exchange(c, old.socks); err == nil {
				t.Error("the exchange took a hello announcing the largest frame")
			}
			c.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := listen(t, t.TempDir())
			peer, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: o.Path(), Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Close()
			c, err := o.ln.AcceptUnix()
			if err != nil {
				t.Fatal(err)
			}
			var hdr [4]byte
			binary.BigEndian.PutUint32(hdr[:], maxFrame)
			if _, err := peer.Write(hdr[:]); err != nil {
				t.Fatal(err)
			}
			peer.CloseWrite()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			tc.read(o, c)
			runtime.ReadMemStats(&after)
			if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
				t.Errorf("a peer that announced %d bytes made the old edge allocate %d bytes", maxFrame, got)
			}
		})
	}
}

// TestStrangersHoldLittleAndNothingPastClose: strangers who connect and
// say nothing are waited on beside the loop, at most maxRefusing at once
// (the others are hung up on at once, so one who keeps connecting cannot
// run the edge out of descriptors), and Close hangs up on those still
// waited on rather than leaving them for their hello's second.
func TestStrangersHoldLittleAndNothingPastClose(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	old := bindProcess(t, "old")
	t.Cleanup(func() { old.socks.Close() })
	o := listen(t, t.TempDir())
	stranger := uint32(os.Geteuid()) + 1 // neither this user nor root
	o.uidOf = func(*net.UnixConn) (uint32, error) { return stranger, nil }
	handoffs := wait(t, o, old.socks)

	const n = 4 * maxRefusing
	var conns []net.Conn
	for range n {
		c, err := net.Dial("unix", o.Path())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
	}
	// Those beyond maxRefusing read the end at once; the others wait.
	var ended int
	testsupport.WaitFor(t, helloTimeout/2, "all but maxRefusing strangers hung up on", func() bool {
		for i := 0; i < len(conns); i++ {
			conns[i].SetReadDeadline(time.Now().Add(time.Millisecond))
			if _, err := conns[i].Read(make([]byte, 1)); errors.Is(err, io.EOF) {
				ended++
				conns = append(conns[:i], conns[i+1:]...)
				i--
			}
		}
		return ended >= n-maxRefusing
	})
	if ended != n-maxRefusing || len(conns) != maxRefusing {
		t.Fatalf("%d strangers hung up on, %d waited on; want %d and %d", ended, len(conns), n-maxRefusing, maxRefusing)
	}

	start := time.Now()
	o.Close()
	if h := <-handoffs; h != nil {
		t.Fatal("a stranger took the sockets")
	}
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(c); err != nil {
			t.Errorf("a stranger waited on: %v", err)
		}
	}
	if took := time.Since(start); took >= helloTimeout {
		t.Errorf("the strangers waited on were hung up on %v after Close, not by it", took)
	}
	goleak.VerifyNone(t, ignore)
}

// sendWithRights writes b a byte at a time, each byte carrying fd eight
// times over, as a peer that wants to fill the reader's descriptor table.
func sendWithRights(t *testing.T, c *net.UnixConn, b []byte, fd int) {
	t.Helper()
	rights := syscall.UnixRights(fd, fd, fd, fd, fd, fd, fd, fd)
	for i := range b {
		if _, _, err := c.WriteMsgUnix(b[i:i+1], rights, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOldEdgeTakesNoDescriptors: the old edge expects none from any peer,
// so the kernel drops those a peer attaches before they reach the edge's
// table; a stranger attaching some to every byte of its hello used to hold
// thousands open per connection, until the edge could accept nothing.
func TestOldEdgeTakesNoDescriptors(t *testing.T) {
	a, b := unixPair(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	hello := encodeFrame(t, frame{Kind: kindHello, Protocol: protocol})
	before := openFDs(t)
	sendWithRights(t, a, hello, int(r.Fd()))
	f, err := readSmallFrame(b, maxHello)
	if err != nil || f.Kind != kindHello {
		t.Fatalf("readSmallFrame = %+v, %v", f, err)
	}
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open after reading the hello, %d before", after, before)
	}
}

// TestSuccessorTakesAtMostASocketFramesDescriptors: the successor reads
// descriptors, but no more than one sockets frame carries.
func TestSuccessorTakesAtMostASocketFramesDescriptors(t *testing.T) {
	a, b := unixPair(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	sendWithRights(t, a, encodeFrame(t, frame{Kind: kindSockets}), int(r.Fd()))
	if _, _, err := readFrame(b); err == nil || !strings.Contains(err.Error(), "descriptors") {
		t.Errorf("readFrame of a frame with 8 descriptors per byte: %v, want an error", err)
	}
}

// TestOfferOutlivesAcceptErrors: a process out of descriptors fails to
// accept for a while; the offer waits it out instead of ending silently.
func TestOfferOutlivesAcceptErrors(t *testing.T) {
	old := bindProcess(t, "old")
	t.Cleanup(func() { old.socks.Close() })
	dir := t.TempDir()
	o := listen(t, dir)
	failures := 3
	o.accept = func() (*net.UnixConn, error) {
		if failures > 0 {
			failures--
			return nil, &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
		}
		return o.ln.AcceptUnix()
	}
	handoffs := wait(t, o, old.socks)
	tk := take(t, dir)
	t.Cleanup(func() { tk.Sockets.Close() })
	if h := <-handoffs; h == nil {
		t.Fatal("the offer ended at the accept errors")
	} else {
		h.Close()
	}
}

func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "s"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a, err := net.DialUnix("unix", nil, l.Addr().(*net.UnixAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err := l.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return a, b
}

func encodeFrame(t *testing.T, f frame) []byte {
	t.Helper()
	payload, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(payload))), payload...)
}
