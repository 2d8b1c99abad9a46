package main

import (
	"context"
	"sync"

	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/handover"
)

// offer lets the next edge started on --state-dir take this one's sockets.
// The channel receives the handoff once a successor holds them. stop ends
// the offer, after an exchange already under way, and returns the handoff
// of a successor that took the sockets and that nobody received, for the
// caller to run; later calls return nil.
func offer(c *config, sv *servers, log zerolog.Logger) (handoffs <-chan *handover.Handoff, stop func() *handover.Handoff) {
	if !c.handover {
		return nil, func() *handover.Handoff { return nil }
	}
	o, err := handover.Listen(c.stateDir, log)
	if err != nil {
		log.Warn().Err(err).Msg("handover: cannot offer this edge's sockets to a successor; an upgrade will have to stop it first")
		return nil, func() *handover.Handoff { return nil }
	}
	if sv.tls.tickets != nil {
		o.State = sv.tls.tickets.Export
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan *handover.Handoff, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		h, err := o.Wait(ctx, sv.raw)
		switch {
		case err == nil:
			got <- h
		case ctx.Err() == nil:
			log.Error().Err(err).Msg("handover: no longer offering this edge's sockets; an upgrade will have to stop it first")
		}
	}()
	var once sync.Once
	return got, func() *handover.Handoff {
		var pending *handover.Handoff
		once.Do(func() {
			cancel()
			<-done
			o.Close()
			select {
			case pending = <-got:
			default:
			}
		})
		return pending
	}
}
