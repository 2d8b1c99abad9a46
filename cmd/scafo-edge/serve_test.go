package main

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/handover"
)

// offerOn offers sockets bound on 127.0.0.1 from dir, as serve does; the
// sockets and the offer are closed when the test ends.
func offerOn(t *testing.T, dir string) (<-chan *handover.Handoff, func() *handover.Handoff) {
	t.Helper()
	var sv servers
	for _, dst := range []*net.Listener{&sv.raw.HTTP, &sv.raw.Admin} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		*dst = l
	}
	handoffs, stop := offer(&config{handover: true, stateDir: dir}, &sv, zerolog.Nop())
	if handoffs == nil {
		t.Fatal("offer made no offer")
	}
	t.Cleanup(func() {
		if h := stop(); h != nil {
			h.Close()
		}
	})
	return handoffs, stop
}

func takeFrom(ctx context.Context, dir string) error {
	tk, err := handover.Take(ctx, dir, handover.Serves{HTTP: "127.0.0.1:0", HTTPS: "127.0.0.1:0", HTTP3: "127.0.0.1:0", Admin: "127.0.0.1:0"})
	if err == nil {
		tk.Sockets.Close()
		tk.Close()
	}
	return err
}

func TestAwaitEnd(t *testing.T) {
	failed := errors.New("accept: too many open files")
	for _, e := range []struct {
		name    string
		end     func(cancel context.CancelFunc, errc chan error)
		wantErr error
	}{
		{"SIGTERM", func(cancel context.CancelFunc, _ chan error) { cancel() }, nil},
		{"a listener failing", func(_ context.CancelFunc, errc chan error) { errc <- failed }, failed},
	} {
		t.Run(e.name+" stops the offer before the servers shut down", func(t *testing.T) {
			dir := t.TempDir()
			handoffs, stop := offerOn(t, dir)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			e.end(cancel, errc)
			h, err := awaitEnd(ctx, handoffs, errc, stop)
			if h != nil || err != e.wantErr {
				t.Fatalf("awaitEnd = %v, %v; want no handoff, %v", h, err, e.wantErr)
			}
			// serve now shuts its servers down, closing the sockets: a
			// successor must find nobody offering them.
			tctx, tcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer tcancel()
			if err := takeFrom(tctx, dir); !errors.Is(err, handover.ErrNoPeer) {
				t.Errorf("Take after awaitEnd: %v, want ErrNoPeer", err)
			}
		})

		// A successor that took the sockets just as serving ended is
		// handed off to: left waiting, it would get edge.db only at this
		// edge's exit.
		t.Run(e.name+" hands off to a successor that took the sockets as it came", func(t *testing.T) {
			dir := t.TempDir()
			_, stop := offerOn(t, dir)
			tctx, tcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer tcancel()
			tk, err := handover.Take(tctx, dir, handover.Serves{HTTP: "127.0.0.1:0", HTTPS: "127.0.0.1:0", HTTP3: "127.0.0.1:0", Admin: "127.0.0.1:0"})
			if err != nil {
				t.Fatalf("Take: %v", err)
			}
			defer tk.Close()
			defer tk.Sockets.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			e.end(cancel, errc)
			// serve's select chose the end over the handoff (both ready):
			// no handoffs channel here, so only stop can yield it.
			h, err := awaitEnd(ctx, nil, errc, stop)
			if h == nil || err != e.wantErr {
				t.Fatalf("awaitEnd = %v, %v; want the successor's handoff, %v", h, err, e.wantErr)
			}
			h.Close()
			if again := stop(); again != nil {
				t.Errorf("a second stop returned the handoff again: it would be closed twice")
			}
		})
	}
}
