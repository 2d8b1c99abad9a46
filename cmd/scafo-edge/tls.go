package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"

	"github.com/scafo/scafo-edge/edge"
)

// tlsSetup is what the TLS mode contributes to the listeners.
type tlsSetup struct {
	config       *tls.Config                     // nil: no HTTPS listener
	wrapHTTP     func(http.Handler) http.Handler // nil: the plain handler as is
	covers       func(sni, host string) bool     // the 421 rule's coverage test
	certificates func() []certSummary            // for the status page; nil: none
	stop         func()
}

type certSummary struct {
	Names    []string
	Issuer   string
	NotAfter string
}

func (t tlsSetup) httpHandler(h http.Handler) http.Handler {
	if t.wrapHTTP == nil {
		return h
	}
	return t.wrapHTTP(h)
}

func setupTLS(ctx context.Context, c *config, db *bolt.DB, live *edge.Live, log zerolog.Logger, reg prometheus.Registerer) (tlsSetup, error) {
	if c.tlsMode == "off" {
		return tlsSetup{stop: func() {}}, nil
	}
	return tlsSetup{}, fmt.Errorf("--tls %s: not wired yet", c.tlsMode)
}
