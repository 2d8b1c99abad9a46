// Package stamps keeps dated events in a certmagic.Storage, one key per
// event under a directory, so that every edge sharing the store (the fleet
// store) counts every edge's events over a sliding window, and a restart
// forgets none.
package stamps

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"
)

// Record stores one event at t under dir, with value as its content.
func Record(ctx context.Context, storage certmagic.Storage, dir string, t time.Time, value []byte) error {
	// The random part keeps two edges' events of one nanosecond apart.
	var b [4]byte
	rand.Read(b[:])
	key := fmt.Sprintf("%s/%020d-%s", strings.TrimSuffix(dir, "/"), t.UnixNano(), hex.EncodeToString(b[:]))
	if err := storage.Store(ctx, key, value); err != nil {
		return fmt.Errorf("record %s: %w", dir, err)
	}
	return nil
}

// Since returns when the events under dir within window before now
// happened, at most limit of them, and deletes older ones (best effort: a
// record left behind is read, and dropped, again). A missing dir holds no
// events.
func Since(ctx context.Context, storage certmagic.Storage, dir string, now time.Time, window time.Duration, limit int) ([]time.Time, error) {
	keys, err := storage.List(ctx, strings.TrimSuffix(dir, "/"), false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	var times []time.Time
	for _, key := range keys {
		t, ok := parseKey(key)
		if !ok {
			continue // not a record of ours
		}
		if !now.Before(t.Add(window)) {
			storage.Delete(ctx, key)
			continue
		}
		if len(times) < limit {
			times = append(times, t)
		}
	}
	return times, nil
}

// Sweep deletes the events older than window under every directory below
// prefix, and returns how many it deleted. Since drops a directory's old
// events when it reads them; Sweep is for directories no one reads again.
// A missing prefix holds nothing.
func Sweep(ctx context.Context, storage certmagic.Storage, prefix string, now time.Time, window time.Duration) (int, error) {
	prefix = strings.TrimSuffix(prefix, "/")
	keys, err := storage.List(ctx, prefix, true)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("sweep %s: %w", prefix, err)
	}
	deleted := 0
	var errs []error
	for _, key := range keys {
		// A recursive listing names the directories too: never one of
		// those, whatever its name (parseKey's shape is a record's only).
		t, ok := parseKey(key)
		if !ok || now.Before(t.Add(window)) {
			continue
		}
		if err := storage.Delete(ctx, key); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		deleted++
	}
	if err := errors.Join(errs...); err != nil {
		return deleted, fmt.Errorf("sweep %s: %w", prefix, err)
	}
	return deleted, nil
}

// keyLen is the length of a record's key under its directory: 20 digits of
// Unix nanoseconds, "-", 8 hex digits (Record).
const keyLen = 20 + 1 + 8

// parseKey returns when the event recorded under key happened, if key has
// the shape Record gives: a directory named like a host ("1-2.example")
// must never pass for one, as deleting it would take its records along.
func parseKey(key string) (time.Time, bool) {
	base := path.Base(key)
	if len(base) != keyLen || base[20] != '-' {
		return time.Time{}, false
	}
	for i, c := range []byte(base) {
		switch {
		case i == 20:
		case i < 20 && c >= '0' && c <= '9':
		case i > 20 && (c >= '0' && c <= '9' || c >= 'a' && c <= 'f'):
		default:
			return time.Time{}, false
		}
	}
	ns, err := strconv.ParseInt(base[:20], 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}
