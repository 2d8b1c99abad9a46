package admission

import (
	"math/rand/v2"
	"time"
)

// A first request (its TLS handshake included) that keeps arriving a few
// bytes at a time is read at the edge's pace, not its client's. Each read
// of a connection wakes a goroutine, and a client that trickles its headers
// chooses how often that happens: 19,000 connections sending a byte every
// 100 ms made the edge wake 190,000 times a second and left a 2-core box
// serving other applications 50 requests a second, p50 40 ms (bench/README:
// "A first request read at the edge's pace"); a byte a second from each, all
// sent in the same 300 ms, queued visitors' requests behind those wake-ups
// for a third of every second.
//
// So, once a first request has come in trickleReads short reads, each
// further read of it waits until paceEvery, and a random part of
// paceJitter, have passed since the one before: the edge then wakes for
// such a connection at most once a second whatever its client sends, and
// at moments of its own choosing, spread, rather than in the client's
// bursts. The bytes wait in the kernel meanwhile (a second's worth of a
// trickle, a few hundred bytes of socket memory).
//
// A visitor's first request is never paced: a client sends its request
// at once, in full segments and a short last one that ends it (no read
// follows); its TLS handshake adds two short reads at most (its
// ClientHello, then its Finished), a PROXY protocol header one, and a
// connection opened ahead of need (a browser's preconnect) none while it
// waits. A read of fewer bytes than its buffer had room for is not short
// when the buffer was nearly full: net/http's reader then had less than
// trickleBytes to offer.
const (
	trickleReads = 6
	trickleBytes = 512
	paceEvery    = time.Second
	paceJitter   = paceEvery / 2
)

// noteFirstRequestRead counts a read of n bytes into a buffer of size, while
// t is on its first request. Only t's reader calls it.
func (t *trackedConn) noteFirstRequestRead(n, size int) {
	t.readAt = t.c.clock.Now().UnixNano()
	if t.trickles >= trickleReads || n >= min(trickleBytes, size) {
		return
	}
	t.trickles++
	if t.trickles == trickleReads {
		t.c.m.paced.Inc()
	}
}

// paced reports whether t's next read waits its turn: its first request
// trickles in.
func (t *trackedConn) paced() bool {
	return t.trickles >= trickleReads && connState(t.state.Load()) == stateNew
}

// awaitTurn waits until t may be read again, or it is closed.
func (t *trackedConn) awaitTurn() {
	turn := time.Unix(0, t.readAt).Add(paceEvery + rand.N(paceJitter))
	wait := turn.Sub(t.c.clock.Now())
	if wait <= 0 {
		return
	}
	if t.paceTimer == nil {
		t.paceTimer = t.c.clock.NewTimer(wait)
	} else {
		t.paceTimer.Reset(wait)
	}
	select {
	case <-t.paceTimer.C():
	case <-t.gone:
		// The read that follows fails as a read of a closed connection
		// does.
		t.paceTimer.Stop()
	}
}
