package handover

import (
	"context"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// Descriptors a peer attaches to its hello or its ack are not the old
// edge's to keep: each one left open is a leak in a process that runs for
// months.
func TestOfferClosesDescriptorsAPeerSends(t *testing.T) {
	dir := t.TempDir()
	old := bindProcess(t, "old")
	t.Cleanup(func() { old.socks.Close() })
	offer := listen(t, dir)
	handoffs := wait(t, offer, old.socks)

	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before := openFDs(t)
	for range 3 {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: offer.Path(), Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		// A hello of another protocol, with descriptors attached: refused.
		b := []byte{0, 0, 0, 2, '{', '}'}
		if _, _, err := c.WriteMsgUnix(b, syscall.UnixRights(int(f.Fd()), int(f.Fd())), nil); err != nil {
			t.Fatal(err)
		}
		c.CloseWrite()
		readFrame(c) // the refusal, or EOF: the exchange is over either way
		c.Close()
	}
	// The offer answers successors one at a time: once a real one is
	// through, the three before it are done with.
	tk := take(t, dir)
	tk.Sockets.Close()
	if h := <-handoffs; h != nil {
		h.Close()
	}
	tk.Close()
	if after := openFDs(t); after > before {
		t.Errorf("%d descriptors open after three peers sent two each, %d before", after, before)
	}
}

// A peer that connects to the offer and says nothing must not cost the real
// successor behind it its handover: the successor's whole exchange is
// bounded by its own 5s (cmd's takeTimeout), and the old edge answers one
// successor at a time.
func TestSilentPeerDoesNotBlockTheSuccessor(t *testing.T) {
	dir := t.TempDir()
	old := bindProcess(t, "old")
	t.Cleanup(func() { old.socks.Close() })
	offer := listen(t, dir)
	handoffs := wait(t, offer, old.socks)

	silent, err := net.Dial("unix", offer.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	tk, err := Take(ctx, dir)
	if err != nil {
		t.Fatalf("Take behind a silent peer: %v", err)
	}
	defer tk.Close()
	defer tk.Sockets.Close()
	if h := <-handoffs; h != nil {
		h.Close()
	}
}
