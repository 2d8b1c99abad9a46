package handover

import (
	"context"
	"net"
	"os"
	"strings"
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
	tk, err := Take(ctx, dir, loopbackServes)
	if err != nil {
		t.Fatalf("Take behind a silent peer: %v", err)
	}
	defer tk.Close()
	defer tk.Sockets.Close()
	if h := <-handoffs; h != nil {
		h.Close()
	}
}

// loopbackServes asks for every socket on 127.0.0.1, any port: what the
// tests' edges serve.
var loopbackServes = Serves{HTTP: "127.0.0.1:0", HTTPS: "127.0.0.1:0", HTTP3: "127.0.0.1:0", Admin: "127.0.0.1:0"}

// A handover is an upgrade of the same edge: a second edge started on the
// state directory to serve other addresses (a debug instance, a typo in a
// port) is refused, and the running edge keeps its sockets and its offer.
func TestOfferRefusesASuccessorThatWouldServeElsewhere(t *testing.T) {
	dir := t.TempDir()
	old := bindProcess(t, "old")
	t.Cleanup(func() { old.socks.Close() })
	offer := listen(t, dir)
	handoffs := wait(t, offer, old.socks)

	https := old.socks.HTTPS.Addr().String()
	h3 := old.socks.HTTP3.LocalAddr().String() // beside HTTPS in an edge; its own port here
	for _, tc := range []struct {
		name   string
		serves Serves
		want   string
	}{
		{"another HTTP port", Serves{HTTP: "127.0.0.1:1", HTTPS: https, HTTP3: h3, Admin: "127.0.0.1:0"}, "this edge serves http on"},
		{"no HTTPS (--tls off)", Serves{HTTP: "127.0.0.1:0", Admin: "127.0.0.1:0"}, "this edge serves https on"},
		{"no HTTP/3 (--http3=false)", Serves{HTTP: "127.0.0.1:0", HTTPS: https, Admin: "127.0.0.1:0"}, "this edge serves http3 on"},
		{"another admin address", Serves{HTTP: "127.0.0.1:0", HTTPS: https, HTTP3: h3, Admin: "127.0.0.2:9180"}, "this edge serves admin on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			tk, err := Take(ctx, dir, tc.serves)
			if err == nil {
				tk.Sockets.Close()
				tk.Close()
				t.Fatal("Take succeeded, want it refused")
			}
			if !strings.Contains(err.Error(), "refused by the peer: "+tc.want) {
				t.Errorf("Take = %v, want a refusal saying %q", err, tc.want)
			}
		})
	}
	// Still offered: the same edge's successor takes the sockets.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	tk, err := Take(ctx, dir, Serves{HTTP: old.socks.HTTP.Addr().String(), HTTPS: https, HTTP3: h3, Admin: old.socks.Admin.Addr().String()})
	if err != nil {
		t.Fatalf("Take by a successor serving the same addresses: %v", err)
	}
	defer tk.Close()
	defer tk.Sockets.Close()
	if h := <-handoffs; h != nil {
		h.Close()
	}
}
