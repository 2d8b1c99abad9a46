package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/handover"
)

func serveCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c config
	fs := serveFlags(&c)
	fs.SetOutput(stderr)
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	s, err := validate(&c, getenv)
	if err != nil {
		return err
	}
	return serve(ctx, &c, s, newLogger(s.logLevel, c.logFormat, stdout))
}

// newLogger writes JSON lines, or console text for --log-format console
// (validate has checked the format).
func newLogger(level zerolog.Level, format string, w io.Writer) zerolog.Logger {
	if format == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

// serve runs the edge until ctx ends or a listener fails, then shuts down
// gracefully: the listeners close, in-flight requests get
// --shutdown-timeout, and only then does the routing source stop. With
// --handover it first takes over from an edge already serving the state
// directory, and hands over to the next one: then it stops as package
// handover orders and returns nil.
func serve(ctx context.Context, c *config, s settings, log zerolog.Logger) error {
	hlog := log.With().Str("component", "handover").Logger()
	in := takeOver(ctx, c, hlog)
	defer in.close()
	defer in.sockets.Close() // those not served on; the rest are closed already
	p, err := buildParts(c, s, in.doc, log)
	if err != nil {
		return err
	}
	defer p.close()
	// Shedding and memory checks run until the edge has drained, not just
	// until SIGTERM.
	admCtx, stopAdmission := context.WithCancel(context.Background())
	defer stopAdmission()
	go p.admission.Run(admCtx)
	handovers, err := in.count(p.reg)
	if err != nil {
		return err
	}
	sv, err := openServers(ctx, c, s, p, in.sockets, in.tickets, log)
	if err != nil {
		return err
	}
	in.closeUnused(sv.raw, hlog)
	stopTLS := sync.OnceFunc(sv.tls.stop)
	defer stopTLS()

	sv.logStarted(c, s, p, log)
	errc := sv.start(in.http3Released(hlog))
	stopSource := p.runSource(log, sv.tls.tableChanged)
	handoffs, stopOffer := offer(c, sv, hlog)
	defer func() {
		if h := stopOffer(); h != nil {
			h.Close()
		}
	}()

	h, runErr := awaitEnd(ctx, handoffs, errc, stopOffer)
	if runErr != nil {
		log.Error().Err(runErr).Msg("listener failed; shutting down")
	}
	if h != nil {
		// The successor holds the sockets and serves on them: this edge
		// exits 0 even after a listener failed, or a restart on failure
		// would start an edge that takes them back from it.
		handovers.WithLabelValues(handover.ResultGiven).Inc()
		handOff(h, c, p, sv, stopSource, stopTLS, hlog)
		log.Info().Msg("scafo-edge stopped")
		return nil
	}
	if runErr == nil {
		log.Info().Dur("timeout", c.shutdownTimeout).Msg("shutting down: listeners closed, waiting for in-flight requests")
	}
	sv.shutdown(c.shutdownTimeout, log)
	stopSource()
	log.Info().Msg("scafo-edge stopped")
	return runErr
}

// awaitEnd waits until serving ends: a successor took the sockets, ctx
// ended (SIGTERM) or a listener failed (its error). In the last two it
// stops the offer first: nobody may take the sockets once they start
// closing with the servers, and a successor that took them before or while
// serving ended is returned to be handed off to, since left waiting it
// would bind nothing and wait for edge.db for the whole drain. A nil
// handoff: shut down without one.
func awaitEnd(ctx context.Context, handoffs <-chan *handover.Handoff, errc <-chan error, stopOffer func() *handover.Handoff) (*handover.Handoff, error) {
	select {
	case h := <-handoffs:
		return h, nil
	case <-ctx.Done():
		return stopOffer(), nil
	case err := <-errc:
		return stopOffer(), err
	}
}

// upstreamSendTimeout maps --send-timeout to backhaul's option, where zero
// means its default rather than no bound.
func upstreamSendTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
