package node

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/scafo/scafo-edge/internal/clock"
)

// FileSource keeps a current routing document from a file (--routes-file):
// the same pipeline as the Poller, fed by re-reading the file every interval
// and comparing its fingerprint. No inotify: a poll of a file is cheap, works
// on every mount (bind mounts, ConfigMaps swapped by symlink), and cannot
// miss an event.
//
// A file caught half-written fails to parse and is retried next interval,
// the last good document kept meanwhile; writing to a temporary file and
// renaming it over the path avoids even that.
type FileSource struct {
	loop
	path string
}

// FileSourceOptions configures a FileSource.
type FileSourceOptions struct {
	// Path is the routes file. Required.
	Path string
	// Interval between reads, jittered by ±10%. Zero: 5s.
	Interval time.Duration
	// Log receives failures (once per cause), recoveries and changes. The
	// zero value logs nothing.
	Log zerolog.Logger
	// Registerer receives the scafo_edge_routing_* collectors. Nil: no
	// metrics.
	Registerer prometheus.Registerer
}

// NewFileSource checks opts and returns a FileSource; nothing is read
// until Run.
func NewFileSource(opts FileSourceOptions) (*FileSource, error) {
	if opts.Path == "" {
		return nil, fmt.Errorf("routes file: empty path")
	}
	f := &FileSource{path: opts.Path}
	f.loop = loop{
		source:   "file " + opts.Path,
		interval: opts.Interval,
		maxSize:  MaxDocumentSize,
		fetch:    f.read,
		log:      opts.Log,
		clock:    clock.Real,
	}
	if f.interval <= 0 {
		f.interval = 5 * time.Second
	}
	f.st.Source = f.source
	var err error
	if f.m, err = newMetrics(opts.Registerer, &f.loop); err != nil {
		return nil, err
	}
	return f, nil
}

// Run re-reads the file until ctx ends; see Source.
func (f *FileSource) Run(ctx context.Context, seed *Update, apply func(Update)) {
	f.run(ctx, seed, apply)
}

func (f *FileSource) read(context.Context, string) (fetched, error) {
	fh, err := os.Open(f.path)
	if err != nil {
		return fetched{}, &pollError{resultReadError, fmt.Errorf("open routes file: %w", err)}
	}
	defer fh.Close()
	body, err := io.ReadAll(io.LimitReader(fh, f.maxSize+1))
	if err != nil {
		return fetched{}, &pollError{resultReadError, fmt.Errorf("read routes file: %w", err)}
	}
	if int64(len(body)) > f.maxSize {
		return fetched{}, &pollError{resultTooLarge, fmt.Errorf("routes file %s is over the %d byte limit", f.path, f.maxSize)}
	}
	return fetched{body: body}, nil
}
