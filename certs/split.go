package certs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"
)

// accountLocal is the storage certmagic sees when a shared (fleet) store is
// configured: ACME account keys and registrations, certmagic's keys
// "acme/<ca>/users/...", go to this edge's own bbolt store (docs/design.md rule 9:
// the account names no domain and belongs to no fleet); everything else,
// locks included, goes to the shared store.
type accountLocal struct {
	shared certmagic.Storage
	local  certmagic.Storage
}

var (
	_ certmagic.Storage          = (*accountLocal)(nil)
	_ certmagic.TryLocker        = (*accountLocal)(nil)
	_ certmagic.LockLeaseRenewer = (*accountLocal)(nil)
)

// placement says where a key lives: only in local, only in shared, or in
// both (a directory above the account keys, such as "acme/<ca>").
type placement int

const (
	inShared placement = iota
	inLocal
	inBoth
)

func place(key string) placement {
	parts := strings.Split(cleanKey(key), "/")
	switch {
	case len(parts) >= 3 && parts[0] == "acme" && parts[2] == "users":
		return inLocal
	case parts[0] == "" || (parts[0] == "acme" && len(parts) <= 2):
		return inBoth
	default:
		return inShared
	}
}

func (s *accountLocal) pick(key string) certmagic.Storage {
	if place(key) == inLocal {
		return s.local
	}
	return s.shared
}

func (s *accountLocal) Store(ctx context.Context, key string, value []byte) error {
	return s.pick(key).Store(ctx, key, value)
}

func (s *accountLocal) Load(ctx context.Context, key string) ([]byte, error) {
	return s.pick(key).Load(ctx, key)
}

func (s *accountLocal) Delete(ctx context.Context, key string) error {
	if place(key) == inBoth {
		return errors.Join(s.shared.Delete(ctx, key), s.local.Delete(ctx, key))
	}
	return s.pick(key).Delete(ctx, key)
}

func (s *accountLocal) Exists(ctx context.Context, key string) bool {
	if place(key) == inBoth {
		return s.shared.Exists(ctx, key) || s.local.Exists(ctx, key)
	}
	return s.pick(key).Exists(ctx, key)
}

func (s *accountLocal) List(ctx context.Context, dir string, recursive bool) ([]string, error) {
	if place(dir) != inBoth {
		return s.pick(dir).List(ctx, dir, recursive)
	}
	a, errA := s.shared.List(ctx, dir, recursive)
	b, errB := s.local.List(ctx, dir, recursive)
	for _, err := range []error{errA, errB} {
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	if errA != nil && errB != nil {
		return nil, fmt.Errorf("list %q: %w", dir, fs.ErrNotExist)
	}
	keys := slices.Concat(a, b)
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

func (s *accountLocal) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	if place(key) == inBoth {
		if info, err := s.shared.Stat(ctx, key); err == nil || !errors.Is(err, fs.ErrNotExist) {
			return info, err
		}
		return s.local.Stat(ctx, key)
	}
	return s.pick(key).Stat(ctx, key)
}

func (s *accountLocal) Lock(ctx context.Context, name string) error { return s.shared.Lock(ctx, name) }

func (s *accountLocal) Unlock(ctx context.Context, name string) error {
	return s.shared.Unlock(ctx, name)
}

// TryLock forwards to the shared store; certmagic needs it for ARI updates.
func (s *accountLocal) TryLock(ctx context.Context, name string) (bool, error) {
	tl, ok := s.shared.(certmagic.TryLocker)
	if !ok {
		return false, fmt.Errorf("try lock %q: %T cannot try-lock", name, s.shared)
	}
	return tl.TryLock(ctx, name)
}

// RenewLockLease forwards to the shared store when it can renew leases.
func (s *accountLocal) RenewLockLease(ctx context.Context, name string, lease time.Duration) error {
	if r, ok := s.shared.(certmagic.LockLeaseRenewer); ok {
		return r.RenewLockLease(ctx, name, lease)
	}
	return nil
}

func (s *accountLocal) String() string {
	return fmt.Sprintf("%v (ACME accounts in %v)", s.shared, s.local)
}
