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
		stamp, _, _ := strings.Cut(path.Base(key), "-")
		ns, err := strconv.ParseInt(stamp, 10, 64)
		if err != nil {
			continue // not a record of ours
		}
		t := time.Unix(0, ns)
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
