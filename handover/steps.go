package handover

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/node"
)

// Steps are what the old edge lets go of once a successor holds its
// sockets (step 4 of the package doc), as functions of the caller's; Run
// calls them in order. Fields are required unless they say otherwise.
type Steps struct {
	// StopAccepting stops this process accepting on the handed-over TCP
	// sockets, without shutting its servers down (Gate.Stop).
	StopAccepting func()
	// Settle waits until the connections already accepted have had their
	// first request read (Gate.Wait), so that their TLS handshakes find
	// edge.db still open. It gets SettleTimeout; zero: 5s.
	Settle        func(ctx context.Context) error
	SettleTimeout time.Duration
	// StopWork stops everything that writes edge.db (the routing source,
	// ACME work) and returns the last good routing document, with Stale
	// set if the source never confirmed it; nil: none.
	StopWork func() *node.Update
	// CloseState closes edge.db, releasing its lock for the successor.
	CloseState func() error
	// StopHTTP3 stops HTTP/3 gracefully and stops reading its socket
	// before ctx (HTTP3Timeout; zero: 2s) ends. Nil: this edge serves no
	// HTTP/3.
	StopHTTP3    func(ctx context.Context)
	HTTP3Timeout time.Duration
	// Log receives a line per step that did not go to plan, and one when
	// edge.db is handed over; the zero value logs nothing.
	Log zerolog.Logger
}

// Run lets go of everything in s's order and tells the successor at each
// release. It returns once the successor may serve HTTP/3, leaving the
// caller to drain its remaining requests (within --shutdown-timeout) and
// exit. An error means the successor was not told something (it then
// finds out by the line closing when this process exits); every step is
// run regardless.
func (h *Handoff) Run(s Steps) error {
	start := time.Now()
	s.StopAccepting()
	settle := s.SettleTimeout
	if settle <= 0 {
		settle = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), settle)
	if err := s.Settle(ctx); err != nil {
		s.Log.Warn().Err(err).Dur("waited", settle).
			Msg("handover: connections accepted before the handover sent no request in time; their TLS handshakes may fail")
	}
	cancel()
	doc := s.StopWork()
	if err := s.CloseState(); err != nil {
		s.Log.Error().Err(err).Msg("handover: closing edge.db failed; the successor waits for its lock")
	}
	relErr := h.release(doc)
	s.Log.Info().Dur("after", time.Since(start)).Bool("document", doc != nil).
		Msg("handover: stopped accepting and released edge.db to the successor")

	if s.StopHTTP3 != nil {
		d := s.HTTP3Timeout
		if d <= 0 {
			d = 2 * time.Second
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		s.StopHTTP3(ctx)
		cancel()
	}
	return errors.Join(relErr, h.releaseHTTP3())
}
