package admission

import (
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// rcvLowat reads the SO_RCVLOWAT of the socket under conn, an accepted
// connection's edge side.
func rcvLowat(t *testing.T, conn net.Conn) int {
	t.Helper()
	rc, err := conn.(interface{ NetConn() net.Conn }).NetConn().(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		v, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT)
	}); err != nil || gerr != nil {
		t.Fatalf("SO_RCVLOWAT: %v, %v", err, gerr)
	}
	return v
}

// While a paced read waits its turn, the kernel keeps the connection's
// bytes from waking the edge until trickleBytes of them wait; each read is
// made with that undone, so that a read that finds nothing at its turn is
// woken by the next byte, as an unpaced one is, and a body after a paced
// head is read as it comes.
func TestAPacedHeadWakesTheEdgeOnlyAtItsTurns(t *testing.T) {
	t.Parallel()
	tc, clk, client, server := pacedSyncConn(t)
	if got := rcvLowat(t, server); got > 1 { // 0 and 1 mean a byte
		t.Fatalf("SO_RCVLOWAT = %d before the first turn, want a byte", got)
	}

	// Waiting its turn, the last turn having found quietFrom bytes.
	b := strings.Repeat("b", quietFrom)
	got := readInTurn(t, clk, client, server, b)
	if lowat := rcvLowat(t, server); lowat != trickleBytes {
		t.Errorf("SO_RCVLOWAT = %d while the read waits its turn, want %d", lowat, trickleBytes)
	}
	clk.Advance(2 * paceEvery)
	if n := <-got; n != len(b) {
		t.Fatalf("the turn's read: %d bytes, want %d", n, len(b))
	}
	if lowat := rcvLowat(t, server); lowat > 1 {
		t.Errorf("SO_RCVLOWAT = %d after the turn's read, want a byte", lowat)
	}

	// Its turn comes with nothing waiting: one byte wakes the read.
	read := make(chan int, 1)
	go func() {
		n, _ := server.Read(make([]byte, 16))
		read <- n
	}()
	testsupport.WaitFor(t, 10*time.Second, "the read to wait for its turn", func() bool { return clk.Waiting() == 1 })
	clk.Advance(4 * paceEvery)
	testsupport.WaitFor(t, 10*time.Second, "the turn's read to wait for a byte", func() bool { return readingInIOWait(server) })
	if _, err := io.WriteString(client, "c"); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-read:
		if n != 1 {
			t.Fatalf("the byte after the turn: read %d bytes, want 1", n)
		}
	case <-time.After(10 * time.Second):
		server.Close()
		<-read
		t.Fatal("a byte sent after the read's turn was not read in 10s")
	}

	// A turn that found a byte is followed by a wait that does not hold
	// the wake-ups: it would spare fewer than it costs.
	got = readInTurn(t, clk, client, server, "d")
	if lowat := rcvLowat(t, server); lowat > 1 {
		t.Errorf("SO_RCVLOWAT = %d while a read waits after a turn that found a byte, want a byte", lowat)
	}
	clk.Advance(8 * paceEvery)
	if n := <-got; n != 1 {
		t.Fatalf("the turn's read: %d bytes, want 1", n)
	}

	// The head is in; its body's few bytes are read as they come.
	tc.ConnState(server, http.StateActive)
	readParked(t, client, server, "body")
}

// A client that closes or resets its connection while a paced read waits
// its turn is let go at that turn: the turn's read returns what it sent
// before (or, for a reset, may fail), and the next the end, with no turn
// between.
func TestAPacedReadHearsItsClientGoAtTheTurn(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"close", "reset"} {
		_, clk, client, server := pacedSyncConn(t)
		got := readInTurn(t, clk, client, server, "b")
		if how == "reset" {
			client.(*net.TCPConn).SetLinger(0)
		}
		client.Close()
		clk.Advance(2 * paceEvery)
		if n := <-got; how == "close" && n != 1 {
			t.Fatalf("%s: the turn's read returned %d bytes, want the 1 sent before", how, n)
		}
		ended := make(chan error, 1)
		go func() {
			_, err := server.Read(make([]byte, 16))
			ended <- err
		}()
		select {
		case err := <-ended:
			if err == nil {
				t.Fatalf("%s: the read after the turn returned no error", how)
			}
		case <-time.After(10 * time.Second):
			server.Close()
			<-ended
			t.Fatalf("%s: the read after the turn waited for another, the clock standing still", how)
		}
	}
}
