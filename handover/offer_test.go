package handover

import (
	"net"
	"os"
	"syscall"
	"testing"
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
