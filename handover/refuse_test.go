package handover

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// TestRefusalReadsOnlyAHello: a stranger is let say its hello before it is
// refused, and a hello is small; a stranger announcing the largest frame the
// exchange knows must not make the edge set aside that much for it, or a
// few of them at once would exhaust its memory.
func TestRefusalReadsOnlyAHello(t *testing.T) {
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
	o.refuse(c, "not this edge's user", errors.New("a stranger"))
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Errorf("refusing a stranger that announced %d bytes allocated %d bytes", maxFrame, got)
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
	o.uidOf = func(*net.UnixConn) (uint32, error) { return 65534, nil }
	if mayTake(65534, uint32(os.Geteuid())) {
		t.Skip("the test runs as the stranger's uid")
	}
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
