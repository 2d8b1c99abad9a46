package main

import (
	"log"
	"strings"

	"github.com/rs/zerolog"
)

// newStdLogger routes net/http's server errors (TLS handshake failures,
// header parse errors) into the JSON log at debug level: a client can
// produce them at will, so at info level they would be a flood.
func newStdLogger(l zerolog.Logger) *log.Logger {
	return log.New(stdWriter{l}, "", 0)
}

type stdWriter struct{ l zerolog.Logger }

func (w stdWriter) Write(p []byte) (int, error) {
	w.l.Debug().Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}
