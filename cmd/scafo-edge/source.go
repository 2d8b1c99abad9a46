package main

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/edge"
	"github.com/scafo/scafo-edge/node"
)

// runSource polls the routing source (and the operator routes file, if
// any) until the returned stop is called: every good document is swapped
// in, persisted and its table handed to changed (nil: nobody), one table
// at a time. stop waits for the sources to finish.
func (p *parts) runSource(log zerolog.Logger, changed func(*edge.Table)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var done sync.WaitGroup
	var mu sync.Mutex // changed sees the tables in the order they were swapped in
	done.Add(1)
	go func() {
		defer done.Done()
		p.source.Run(ctx, p.seed, func(u node.Update) {
			mu.Lock()
			t := p.updater.Apply(u)
			if changed != nil {
				changed(t)
			}
			mu.Unlock()
			if err := node.SaveDocument(p.db, u); err != nil {
				log.Error().Err(err).Msg("persist routing document failed; the new table is served but a restart would start from the previous one")
			}
		})
	}()
	if p.operator != nil {
		done.Add(1)
		go func() {
			defer done.Done()
			p.operator.Run(ctx, func(u node.OperatorUpdate) {
				mu.Lock()
				defer mu.Unlock()
				if t := p.updater.ApplyOperator(u); t != nil && changed != nil {
					changed(t)
				}
			})
		}()
	}
	return func() {
		cancel()
		done.Wait()
	}
}

func newSource(c *config, token string, log zerolog.Logger, reg prometheus.Registerer) (node.Source, string, error) {
	slog := log.With().Str("component", "source").Logger()
	if c.routesFile != "" {
		src, err := node.NewFileSource(node.FileSourceOptions{
			Path:       c.routesFile,
			Interval:   c.pollInterval,
			Log:        slog,
			Registerer: reg,
		})
		return src, "file " + c.routesFile, err
	}
	src, err := node.NewPoller(node.PollerOptions{
		Node:       c.node,
		Token:      token,
		Prefer:     c.prefer,
		Interval:   c.pollInterval,
		Log:        slog,
		Registerer: reg,
	})
	return src, "node " + c.node, err
}
