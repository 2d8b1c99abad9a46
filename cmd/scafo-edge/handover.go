package main

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/handover"
	"github.com/scafo/scafo-edge/node"
)

// Bounds of the handover between an old and a new edge (package handover
// has the sequence).
const (
	// takeTimeout bounds hello, sockets, ack: an old edge that does not
	// answer within it is treated as absent.
	takeTimeout = 5 * time.Second
	// settleTimeout bounds the old edge's wait for connections it accepted
	// to send their first request. Nobody accepts meanwhile: keep it short.
	settleTimeout = 2 * time.Second
	// http3DrainTimeout bounds the old edge's HTTP/3 drain. New QUIC
	// connections wait (their Initial packets retransmitted) meanwhile;
	// browsers fall back to TCP sooner.
	http3DrainTimeout = 2 * time.Second
	// releaseTimeout bounds the new edge's wait for the old one to stop its
	// work and close edge.db: settling plus stopping the source and ACME.
	releaseTimeout = 30 * time.Second
)

// inherited is what a new edge took over from the edge it replaces; the
// zero value is a start without one.
type inherited struct {
	sockets  handover.Sockets
	doc      *node.Update    // the old edge's last good document; nil: none
	taken    *handover.Taken // nil: nothing was handed over
	fellBack bool            // an edge was there but did not hand over
	tickets  []byte          // the old edge's session ticket keys; nil: none
}

// takeOver asks an edge already serving --state-dir for its listening
// sockets and waits until it has released edge.db. Whatever fails, the
// edge starts the ordinary way: one log line says why.
func takeOver(ctx context.Context, c *config, log zerolog.Logger) inherited {
	if !c.handover {
		return inherited{}
	}
	tctx, cancel := context.WithTimeout(ctx, takeTimeout)
	tk, err := handover.Take(tctx, c.stateDir, serves(c))
	cancel()
	switch {
	case errors.Is(err, handover.ErrNoPeer):
		// Said at info: an edge too old to offer its sockets leaves no
		// socket either, and this line is then the one that says why
		// start-up stops at edge.db's lock.
		log.Info().Err(err).Msg("handover: no running edge offers its sockets; binding the listeners")
		return inherited{}
	case err != nil:
		log.Warn().Err(err).Msg("handover: the running edge did not hand over its sockets; binding the listeners and waiting for edge.db as without one")
		return inherited{fellBack: true}
	}
	log.Info().Msg("handover: took the running edge's listening sockets; waiting for it to release edge.db")
	rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	doc, err := tk.Released(rctx)
	if err != nil {
		log.Warn().Err(err).Msg("handover: the old edge did not say it released edge.db; opening it anyway")
	}
	return inherited{sockets: tk.Sockets, doc: doc, taken: tk, tickets: tk.State}
}

// serves is what this edge will serve, as its flags say: the running edge
// hands its sockets over only if it serves them at the same addresses.
func serves(c *config) handover.Serves {
	sv := handover.Serves{HTTP: c.httpAddr, Admin: c.adminAddr}
	if c.tlsMode != "off" {
		sv.HTTPS = c.httpsAddr
		if c.http3 {
			sv.HTTP3 = c.httpsAddr
		}
	}
	return sv
}

// count records this start in scafo_edge_handovers_total, registered
// with reg, and returns the counter for a later handover to a successor.
func (in inherited) count(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c, err := handover.NewCounter(reg)
	if err != nil {
		return nil, err
	}
	switch {
	case in.taken != nil:
		c.WithLabelValues(handover.ResultReceived).Inc()
	case in.fellBack:
		c.WithLabelValues(handover.ResultFellBack).Inc()
	}
	return c, nil
}

// http3Released is closed once the old edge no longer reads the HTTP/3
// socket: at once without a handover, at the latest after releaseTimeout.
func (in inherited) http3Released(log zerolog.Logger) <-chan struct{} {
	ready := make(chan struct{})
	if in.taken == nil {
		close(ready)
		return ready
	}
	go func() {
		defer close(ready)
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		if err := in.taken.HTTP3Released(ctx); err != nil {
			log.Warn().Err(err).Msg("handover: the old edge did not say it stopped reading the HTTP/3 socket; serving HTTP/3 anyway")
		}
	}()
	return ready
}

// closeUnused closes the inherited sockets this edge does not serve on;
// used are the sockets served.
func (in inherited) closeUnused(used handover.Sockets, log zerolog.Logger) {
	for _, role := range in.sockets.CloseUnused(used) {
		log.Info().Str("role", role).Msg("handover: not serving on a handed-over socket (this edge's flags differ); closed it")
	}
}

// close ends the line to the old edge.
func (in inherited) close() {
	if in.taken != nil {
		in.taken.Close()
	}
}

// handOff lets go of everything in the order of package handover, for the
// successor that took the sockets, then drains what is left in flight
// (tunnels included) within --shutdown-timeout.
func handOff(h *handover.Handoff, c *config, p *parts, sv *servers, stopSource, stopTLS func(), log zerolog.Logger) {
	defer h.Close()
	log.Info().Dur("timeout", c.shutdownTimeout).Msg("handover: a new edge took the listening sockets; stopping, in-flight requests get the shutdown timeout")
	steps := handover.Steps{
		StopAccepting: sv.gate.Stop,
		Settle:        sv.gate.Wait,
		SettleTimeout: settleTimeout,
		StopWork: func() *node.Update {
			stopSource()
			stopTLS()
			doc, err := handover.HandedDocument(p.db, p.source.Status())
			if err != nil {
				log.Warn().Err(err).Msg("handover: persisted routing document unreadable; the successor waits for its source")
				return nil
			}
			return doc
		},
		CloseState: p.db.Close,
		Log:        log,
	}
	if sv.h3 != nil {
		steps.StopHTTP3 = func(ctx context.Context) { sv.h3.Shutdown(ctx, log) }
		steps.HTTP3Timeout = http3DrainTimeout
	}
	deadline := time.Now().Add(c.shutdownTimeout)
	if err := h.Run(steps); err != nil {
		log.Warn().Err(err).Msg("handover: the successor was not told everything; it finds out when this process exits")
	}
	sv.answerLateArrivals(deadline, log)
	sv.shutdown(time.Until(deadline), log)
}

// answerLateArrivals serves the first request of every connection this
// edge accepted before the handover and that has yet to send it (a TLS
// handshake that paused past the gate's quiet time on a loaded box):
// Shutdown would read that request and drop it. Keep-alives go first, so
// each such connection closes after its answer and idle ones close now.
// The successor is serving meanwhile, so the wait is short: a first
// request still not in after lateArrivalWait is a slowloris's or a
// pre-connected socket's (browsers and Go's transport open some ahead of
// need) far more often than a visitor's, and --read-header-timeout (60 s
// and more, for the attacks it must not send back all at once) would keep
// this process for the whole shutdown timeout.
func (sv *servers) answerLateArrivals(deadline time.Time, log zerolog.Logger) {
	for _, srv := range sv.all {
		srv.SetKeepAlivesEnabled(false)
	}
	started := time.Now()
	if late := started.Add(lateArrivalWait); late.Before(deadline) {
		deadline = late
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := sv.gate.Drain(ctx); err != nil {
		log.Warn().Dur("waited", time.Since(started)).Msg("handover: connections still sending their first request are closed; the successor serves their clients' next attempts")
	}
}

// lateArrivalWait is how long an edge handing over waits for the first
// request of the connections it accepted: the header timeout it had before
// 2026-12-03.
const lateArrivalWait = 10 * time.Second

// resetKey is the state directory's key for HTTP/3 stateless resets,
// shared with the edges before and after this one; nil, and a log line,
// when it cannot be read or made (HTTP/3 then runs without resets).
func resetKey(dir string, log zerolog.Logger) *[32]byte {
	key, err := handover.StatelessResetKey(dir)
	if err != nil {
		log.Warn().Err(err).Msg("HTTP/3 without stateless resets: a client of a QUIC connection the previous edge held waits out its idle timeout")
		return nil
	}
	return &key
}
