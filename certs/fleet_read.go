package certs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/caddyserver/certmagic"

	"github.com/scafo/scafo-edge/node"
)

// dirty reports whether a queued write touches key: the key itself, a
// key beneath it, or a key above it (a delete). The node is behind this
// edge on such a key, so the local copy answers.
func (s *FleetStorage) dirty(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, op := range s.queue {
		if op.Key == key || isUnder(key, op.Key) || isUnder(op.Key, key) {
			return true
		}
	}
	return false
}

// isUnder reports whether key lies beneath dir, component-wise.
func isUnder(key, dir string) bool {
	return dir == "" || strings.HasPrefix(key, dir+"/")
}

// fromNode reports whether a read of key should ask the node, counting a
// read the local copy answers instead.
func (s *FleetStorage) fromNode(key string) bool {
	if !s.dirty(key) && s.available() {
		return true
	}
	s.m.localReads.Inc()
	return false
}

// Load returns the value at key from the node, or from the local copy
// when the node does not answer.
func (s *FleetStorage) Load(ctx context.Context, key string) ([]byte, error) {
	key = cleanKey(key)
	g := s.gen.Load()
	if !s.fromNode(key) {
		return s.local.Load(ctx, key)
	}
	nctx, cancel := s.nodeCtx(ctx)
	v, err := s.remote.Get(nctx, key)
	cancel()
	switch {
	case err == nil:
		s.up()
		s.keepCopy(ctx, g, key, v)
		return v, nil
	case errors.Is(err, fs.ErrNotExist):
		s.up()
		return nil, fmt.Errorf("load %q: %w", key, fs.ErrNotExist)
	case ctx.Err() != nil:
		return nil, err
	}
	s.outage(ctx, err)
	s.m.localReads.Inc()
	return s.local.Load(ctx, key)
}

// keepCopy copies what the node returned into the local store, unless a
// write of this edge may have raced the read (see localMu).
func (s *FleetStorage) keepCopy(ctx context.Context, g uint64, key string, v []byte) {
	s.localMu.Lock()
	defer s.localMu.Unlock()
	if s.inflight > 0 || s.gen.Load() != g {
		return
	}
	if old, err := s.local.Load(ctx, key); err == nil && bytes.Equal(old, v) {
		return
	}
	if err := s.local.Store(ctx, key, v); err != nil {
		s.log.Warn().Err(err).Str("key", key).Msg("certificate store: could not keep a local copy")
	}
}

// Exists reports whether key is a file or a directory, asking the node
// and falling back to the local copy.
func (s *FleetStorage) Exists(ctx context.Context, key string) bool {
	_, err := s.Stat(ctx, key)
	return err == nil
}

// Stat describes key from the node (a file, or a directory when keys lie
// beneath it), or from the local copy when the node does not answer.
func (s *FleetStorage) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	key = cleanKey(key)
	if !s.fromNode(key) {
		return s.local.Stat(ctx, key)
	}
	nctx, cancel := s.nodeCtx(ctx)
	defer cancel()
	var info node.ObjectInfo
	var err error
	if key != "" {
		info, err = s.remote.Stat(nctx, key)
	} else {
		err = fs.ErrNotExist
	}
	if err == nil {
		s.up()
		return certmagic.KeyInfo{Key: key, Modified: info.Modified, Size: info.Size, IsTerminal: true}, nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		_, err = s.remote.List(nctx, key, false)
		if err == nil {
			s.up()
			return certmagic.KeyInfo{Key: key}, nil
		}
		if errors.Is(err, fs.ErrNotExist) {
			s.up()
			return certmagic.KeyInfo{}, fmt.Errorf("stat %q: %w", key, fs.ErrNotExist)
		}
	}
	if ctx.Err() != nil {
		return certmagic.KeyInfo{}, err
	}
	s.outage(ctx, err)
	s.m.localReads.Inc()
	return s.local.Stat(ctx, key)
}

// List returns the keys directly under dir, or every key and directory
// beneath it when recursive is true, in sorted order, from the node or,
// when it does not answer, the local copy. Nothing under dir is an error
// wrapping fs.ErrNotExist.
func (s *FleetStorage) List(ctx context.Context, dir string, recursive bool) ([]string, error) {
	dir = cleanKey(dir)
	if !s.fromNode(dir) {
		return s.localList(ctx, dir, recursive)
	}
	nctx, cancel := s.nodeCtx(ctx)
	keys, err := s.remote.List(nctx, dir, recursive)
	cancel()
	switch {
	case err == nil:
		s.up()
		return shapeList(dir, keys, recursive), nil
	case errors.Is(err, fs.ErrNotExist):
		s.up()
		return nil, fmt.Errorf("list %q: %w", dir, fs.ErrNotExist)
	case ctx.Err() != nil:
		return nil, err
	}
	s.outage(ctx, err)
	s.m.localReads.Inc()
	return s.localList(ctx, dir, recursive)
}

func (s *FleetStorage) localList(ctx context.Context, dir string, recursive bool) ([]string, error) {
	keys, err := s.local.List(ctx, dir, recursive)
	if err != nil {
		return nil, err
	}
	keys = slices.DeleteFunc(keys, func(k string) bool { return k == fleetOutbox || isUnder(k, fleetOutbox) })
	if len(keys) == 0 && dir == "" {
		return nil, fmt.Errorf("list %q: %w", dir, fs.ErrNotExist)
	}
	return keys, nil
}

// shapeList makes what the node listed into what certmagic expects
// whatever the node's listing style: only keys beneath dir, cut to the
// direct child when not recursive, and with every directory between dir
// and a key when recursive (a bucket lists objects only).
func shapeList(dir string, keys []string, recursive bool) []string {
	seen := map[string]bool{}
	base := ""
	if dir != "" {
		base = dir + "/"
	}
	for _, k := range keys {
		k = cleanKey(k)
		if !isUnder(k, dir) || k == dir {
			continue
		}
		rel := k[len(base):]
		for i := 0; i < len(rel); i++ {
			if rel[i] != '/' {
				continue
			}
			if !recursive {
				break
			}
			seen[base+rel[:i]] = true
		}
		if !recursive {
			if i := strings.IndexByte(rel, '/'); i >= 0 {
				rel = rel[:i]
			}
		}
		seen[base+rel] = true
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
