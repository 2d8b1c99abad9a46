package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/rs/zerolog"
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
// --shutdown-timeout, and only then does the routing source stop.
func serve(ctx context.Context, c *config, s settings, log zerolog.Logger) error {
	p, err := buildParts(c, s, log)
	if err != nil {
		return err
	}
	defer p.close()
	sv, err := openServers(ctx, c, s, p, log)
	if err != nil {
		return err
	}
	defer sv.tls.stop()

	sv.logStarted(c, s, p, log)
	errc := sv.start()
	stopSource := p.runSource(log)

	var runErr error
	select {
	case <-ctx.Done():
		log.Info().Dur("timeout", c.shutdownTimeout).Msg("shutting down: listeners closed, waiting for in-flight requests")
	case runErr = <-errc:
		log.Error().Err(runErr).Msg("listener failed; shutting down")
	}
	sv.shutdown(c.shutdownTimeout, log)
	stopSource()
	log.Info().Msg("scafo-edge stopped")
	return runErr
}

// upstreamSendTimeout maps --send-timeout to backhaul's option, where zero
// means its default rather than no bound.
func upstreamSendTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
