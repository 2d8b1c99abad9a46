package main

import (
	"log"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// newStdLogger routes net/http's server errors (TLS handshake failures,
// header parse errors) into the JSON log at debug level: a client can
// produce them at will, so at info level they would be a flood. Failed TLS
// handshakes reach the server only as these lines, so they are counted here.
func newStdLogger(l zerolog.Logger, handshakeErrors prometheus.Counter) *log.Logger {
	return log.New(stdWriter{l: l, handshakeErrors: handshakeErrors}, "", 0)
}

type stdWriter struct {
	l               zerolog.Logger
	handshakeErrors prometheus.Counter
}

func (w stdWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	if strings.Contains(line, "TLS handshake error") {
		w.handshakeErrors.Inc()
	}
	w.l.Debug().Msg(line)
	return len(p), nil
}
