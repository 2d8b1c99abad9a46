package certs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/scafo/scafo-edge/internal/clock"
	bolt "go.etcd.io/bbolt"
)

// Bucket names inside the shared state file (<state-dir>/edge.db). The
// routing state lives in other buckets of the same file; these two are ours.
var (
	objectsBucket = []byte("certmagic")
	locksBucket   = []byte("certmagic-locks")
)

const (
	// DefaultLockTTL bounds how long a lock stays held without renewal. It
	// covers certmagic's first obtain attempt (its obtain timeout is 90s and
	// it renews the lease before every attempt through RenewLockLease).
	DefaultLockTTL = 5 * time.Minute
	// DefaultLockPollInterval is how often a waiting Lock looks again at a
	// lock held by someone else; a release by this process wakes it sooner.
	DefaultLockPollInterval = 250 * time.Millisecond
)

// processToken names this process in lock records. bbolt holds an exclusive
// file lock on the database, so a lock record written under another token
// was left by a process that is gone (crashed or killed before Unlock): it
// is stale at once, and a restarted edge does not wait out the TTL.
var processToken = randomHex(8)

// randomHex returns n random bytes in hex: lock tokens and holder names.
func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("certs: read random: %v", err))
	}
	return hex.EncodeToString(b)
}

// lockWake lets a store wake its own Lock waiters when it releases a lock,
// so they need not wait out their next poll. The zero value is ready.
type lockWake struct {
	mu sync.Mutex
	ch chan struct{}
}

// next returns a channel closed at the next release.
func (w *lockWake) next() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

// release wakes every waiter.
func (w *lockWake) release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}

// pollLock calls try until it takes the lock for name, fails, or ctx ends,
// waiting between tries for wait() on clk or for a release of wake,
// whichever comes first.
func pollLock(ctx context.Context, clk clock.Clock, name string, wake *lockWake, wait func() time.Duration, try func(context.Context, string) (bool, error)) error {
	for {
		released := wake.next()
		ok, err := try(ctx, name)
		if err != nil || ok {
			return err
		}
		// A timer nobody receives from is collected (Go 1.23): none to stop.
		select {
		case <-ctx.Done():
			return fmt.Errorf("lock %q: %w", name, ctx.Err())
		case <-released:
		case <-clk.After(wait()):
		}
	}
}

// BoltStorage is a certmagic.Storage, certmagic.TryLocker and
// certmagic.LockLeaseRenewer kept in two buckets of a bbolt database.
//
// Values are stored with their modification time. Directories are implicit,
// as certmagic's Storage defines them: a key is a directory when it is a
// component-wise prefix of another key.
//
// Locks are records holding the holder's token and an expiry. A lock is
// stale, and may be taken over, when its expiry has passed or when it was
// written by another process (bbolt's file lock means that process is
// dead). Like certmagic's FileStorage, this trades perfect exclusion on
// expiry for never deadlocking on a crashed holder: certmagic re-checks
// storage after acquiring a lock, so a rare overlap costs at most a
// duplicate order.
//
// Set the exported fields before first use; they are not synchronised.
type BoltStorage struct {
	db *bolt.DB

	// LockTTL is how long a lock is held without renewal. Zero means
	// DefaultLockTTL.
	LockTTL time.Duration
	// LockPollInterval is how often a blocked Lock re-checks. Zero means
	// DefaultLockPollInterval.
	LockPollInterval time.Duration

	mu sync.Mutex
	// held maps lock names this value holds to the token written for them,
	// so Unlock never releases a lock someone else took over.
	held     map[string]string
	unlocked lockWake
	// clock is the wall clock; tests set a fake one after NewBoltStorage.
	clock clock.Clock
}

// Interface guards: certmagic looks for the optional interfaces by type
// assertion (TryLocker for ARI updates, LockLeaseRenewer before retries).
var (
	_ certmagic.Storage          = (*BoltStorage)(nil)
	_ certmagic.TryLocker        = (*BoltStorage)(nil)
	_ certmagic.LockLeaseRenewer = (*BoltStorage)(nil)
)

// NewBoltStorage returns a storage on db, creating its buckets.
func NewBoltStorage(db *bolt.DB) (*BoltStorage, error) {
	if db == nil {
		return nil, errors.New("bolt storage: nil database")
	}
	err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{objectsBucket, locksBucket} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("create storage buckets: %w", err)
	}
	return &BoltStorage{db: db, held: map[string]string{}, clock: clock.Real}, nil
}

func (s *BoltStorage) String() string { return "BoltStorage:" + s.db.Path() }

// cleanKey drops leading and trailing slashes, which certmagic keys never
// carry but path-joined callers sometimes produce.
func cleanKey(key string) string { return strings.Trim(key, "/") }

// childPrefix is the byte prefix every key under dir starts with.
func childPrefix(dir string) []byte {
	if dir == "" {
		return nil
	}
	return []byte(dir + "/")
}

// Store puts value at key with the current time as its modification time.
func (s *BoltStorage) Store(ctx context.Context, key string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	key = cleanKey(key)
	if key == "" {
		return errors.New("store: empty key")
	}
	rec := make([]byte, 8+len(value))
	binary.BigEndian.PutUint64(rec, uint64(s.clock.Now().UnixNano()))
	copy(rec[8:], value)
	err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(objectsBucket).Put([]byte(key), rec)
	})
	if err != nil {
		return fmt.Errorf("store %q: %w", key, err)
	}
	return nil
}

// Load returns the value at key, or an error wrapping fs.ErrNotExist.
func (s *BoltStorage) Load(ctx context.Context, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	key = cleanKey(key)
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		rec := tx.Bucket(objectsBucket).Get([]byte(key))
		if rec == nil {
			return fs.ErrNotExist
		}
		// bbolt's bytes are only valid inside the transaction.
		out = bytes.Clone(rec[8:])
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load %q: %w", key, err)
	}
	return out, nil
}

// Delete removes key and every key beneath it. A missing key is not an error.
func (s *BoltStorage) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	key = cleanKey(key)
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(objectsBucket)
		var doomed [][]byte
		if key != "" && b.Get([]byte(key)) != nil {
			doomed = append(doomed, []byte(key))
		}
		// Collect first: deleting under a moving cursor can skip keys.
		p := childPrefix(key)
		c := b.Cursor()
		for k, _ := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = c.Next() {
			doomed = append(doomed, bytes.Clone(k))
		}
		for _, k := range doomed {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete %q: %w", key, err)
	}
	return nil
}

// Exists reports whether key is a file or a directory.
func (s *BoltStorage) Exists(ctx context.Context, key string) bool {
	if ctx.Err() != nil {
		return false
	}
	key = cleanKey(key)
	found := false
	_ = s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(objectsBucket)
		if key != "" && b.Get([]byte(key)) != nil {
			found = true
			return nil
		}
		p := childPrefix(key)
		k, _ := b.Cursor().Seek(p)
		found = k != nil && bytes.HasPrefix(k, p)
		return nil
	})
	return found
}

// List returns the keys directly under dir, or every key and directory
// beneath it when recursive is true, as full keys in sorted order. A dir
// with nothing under it gives an error wrapping fs.ErrNotExist, unless it is
// a file, which lists as empty.
func (s *BoltStorage) List(ctx context.Context, dir string, recursive bool) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dir = cleanKey(dir)
	seen := map[string]struct{}{}
	isFile := false
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(objectsBucket)
		isFile = dir != "" && b.Get([]byte(dir)) != nil
		p := childPrefix(dir)
		c := b.Cursor()
		for k, _ := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = c.Next() {
			rel := string(k[len(p):])
			if !recursive {
				if i := strings.IndexByte(rel, '/'); i >= 0 {
					rel = rel[:i]
				}
				seen[string(p)+rel] = struct{}{}
				continue
			}
			// Walk like FileStorage: intermediate directories are listed too.
			for i := 0; i < len(rel); i++ {
				if rel[i] == '/' {
					seen[string(p)+rel[:i]] = struct{}{}
				}
			}
			seen[string(k)] = struct{}{}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", dir, err)
	}
	if len(seen) == 0 && !isFile {
		return nil, fmt.Errorf("list %q: %w", dir, fs.ErrNotExist)
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, nil
}

// Stat describes key: size and modification time for a file, IsTerminal
// false for a directory, an error wrapping fs.ErrNotExist otherwise.
func (s *BoltStorage) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	if err := ctx.Err(); err != nil {
		return certmagic.KeyInfo{}, err
	}
	key = cleanKey(key)
	info := certmagic.KeyInfo{Key: key}
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(objectsBucket)
		if rec := b.Get([]byte(key)); key != "" && rec != nil {
			info.IsTerminal = true
			info.Size = int64(len(rec) - 8)
			info.Modified = time.Unix(0, int64(binary.BigEndian.Uint64(rec)))
			return nil
		}
		p := childPrefix(key)
		c := b.Cursor()
		found := false
		for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			found = true
			if m := time.Unix(0, int64(binary.BigEndian.Uint64(v))); m.After(info.Modified) {
				info.Modified = m
			}
		}
		if !found {
			return fs.ErrNotExist
		}
		return nil
	})
	if err != nil {
		return certmagic.KeyInfo{}, fmt.Errorf("stat %q: %w", key, err)
	}
	return info, nil
}

// lockRecord is the value of a lock in the locks bucket.
type lockRecord struct {
	Process string    `json:"process"`
	Token   string    `json:"token"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
}

func (r lockRecord) stale(now time.Time) bool {
	return r.Process != processToken || now.After(r.Expires)
}

func (s *BoltStorage) ttl() time.Duration {
	if s.LockTTL > 0 {
		return s.LockTTL
	}
	return DefaultLockTTL
}

func (s *BoltStorage) pollInterval() time.Duration {
	if s.LockPollInterval > 0 {
		return s.LockPollInterval
	}
	return DefaultLockPollInterval
}

// Lock blocks until it holds the lock for name, or ctx ends.
func (s *BoltStorage) Lock(ctx context.Context, name string) error {
	return pollLock(ctx, s.clock, name, &s.unlocked, s.pollInterval, s.TryLock)
}

// TryLock takes the lock for name if it is free or stale, without waiting.
func (s *BoltStorage) TryLock(ctx context.Context, name string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	key := []byte(name)
	// A read transaction first: a waiter polling a held lock must not cost
	// a write (and an fsync) per poll.
	busy := false
	if err := s.db.View(func(tx *bolt.Tx) error {
		rec, ok, err := readLock(tx, key)
		busy = ok && !rec.stale(s.clock.Now())
		return err
	}); err != nil {
		return false, fmt.Errorf("read lock %q: %w", name, err)
	}
	if busy {
		return false, nil
	}
	token := randomHex(12)
	got := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		now := s.clock.Now()
		rec, ok, err := readLock(tx, key)
		if err != nil {
			return err
		}
		if ok && !rec.stale(now) {
			return nil
		}
		v, err := json.Marshal(lockRecord{Process: processToken, Token: token, Created: now, Expires: now.Add(s.ttl())})
		if err != nil {
			return err
		}
		got = true
		return tx.Bucket(locksBucket).Put(key, v)
	})
	if err != nil {
		return false, fmt.Errorf("take lock %q: %w", name, err)
	}
	if got {
		s.mu.Lock()
		s.held[name] = token
		s.mu.Unlock()
	}
	return got, nil
}

// Unlock releases the lock for name if this storage still holds it. A lock
// that expired and was taken over is left to its new holder.
func (s *BoltStorage) Unlock(_ context.Context, name string) error {
	s.mu.Lock()
	token, ok := s.held[name]
	delete(s.held, name)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("unlock %q: not held by this storage", name)
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		rec, ok, err := readLock(tx, []byte(name))
		if err != nil || !ok || rec.Token != token {
			return err
		}
		return tx.Bucket(locksBucket).Delete([]byte(name))
	})
	s.unlocked.release()
	if err != nil {
		return fmt.Errorf("unlock %q: %w", name, err)
	}
	return nil
}

// RenewLockLease extends a lock this storage holds to now+lease.
func (s *BoltStorage) RenewLockLease(ctx context.Context, name string, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	token, ok := s.held[name]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("renew lock %q: not held by this storage", name)
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		rec, ok, err := readLock(tx, []byte(name))
		if err != nil {
			return err
		}
		if !ok || rec.Token != token {
			return errors.New("lock was taken over")
		}
		rec.Expires = s.clock.Now().Add(lease)
		v, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		return tx.Bucket(locksBucket).Put([]byte(name), v)
	})
	if err != nil {
		return fmt.Errorf("renew lock %q: %w", name, err)
	}
	return nil
}

func readLock(tx *bolt.Tx, key []byte) (lockRecord, bool, error) {
	v := tx.Bucket(locksBucket).Get(key)
	if v == nil {
		return lockRecord{}, false, nil
	}
	var rec lockRecord
	if err := json.Unmarshal(v, &rec); err != nil {
		// A record we cannot read cannot be honoured; treat it as stale
		// rather than blocking the name forever.
		return lockRecord{}, false, nil
	}
	return rec, true, nil
}
