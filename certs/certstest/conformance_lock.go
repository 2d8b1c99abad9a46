package certstest

// The locking half of the storage conformance suite: what certmagic's
// issuance locks rely on (one holder at a time, release, expiry of a dead
// holder's lock, a waiting locker's context).

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

func releasedLockIsFree(t *testing.T, s certmagic.Storage) {
	ctx := context.Background()
	for range 3 {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := s.Lock(lctx, "issue_cert_a.test"); err != nil {
			cancel()
			t.Fatalf("Lock: %v", err)
		}
		cancel()
		if err := s.Unlock(ctx, "issue_cert_a.test"); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
	}
}

func heldLockBlocks(t *testing.T, s certmagic.Storage) {
	ctx := context.Background()
	if err := s.Lock(ctx, "held"); err != nil {
		t.Fatalf("Lock: %v", err)
	}
	defer s.Unlock(ctx, "held")
	lctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Lock(lctx, "held")
	if err == nil {
		t.Fatal("second Lock of a held, fresh lock succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second Lock error = %v, want one wrapping context.DeadlineExceeded", err)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Errorf("Lock returned %v after its context ended", waited)
	}
	if err := s.Lock(ctx, "other-name"); err != nil {
		t.Errorf("Lock of a different name: %v", err)
	} else {
		s.Unlock(ctx, "other-name")
	}
}

func tryLockDoesNotWait(t *testing.T, s certmagic.Storage) {
	tl := s.(certmagic.TryLocker)
	ctx := context.Background()
	ok, err := tl.TryLock(ctx, "try")
	if err != nil || !ok {
		t.Fatalf("TryLock(free) = %v, %v, want true, nil", ok, err)
	}
	start := time.Now()
	ok, err = tl.TryLock(ctx, "try")
	if err != nil || ok {
		t.Fatalf("TryLock(held) = %v, %v, want false, nil", ok, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("TryLock(held) took %v, want no waiting", d)
	}
	if err := tl.Unlock(ctx, "try"); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	ok, err = tl.TryLock(ctx, "try")
	if err != nil || !ok {
		t.Fatalf("TryLock after Unlock = %v, %v, want true, nil", ok, err)
	}
	tl.Unlock(ctx, "try")
}

func lockersTakeTurns(t *testing.T, s certmagic.Storage) {
	ctx := context.Background()
	const lockers, rounds = 4, 3
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, lockers*rounds)
	lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for range lockers {
		wg.Go(func() {
			for range rounds {
				if err := s.Lock(lctx, "shared"); err != nil {
					errs <- err
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				// Hold briefly so overlapping holders would be caught.
				time.Sleep(5 * time.Millisecond)
				inside.Add(-1)
				if err := s.Unlock(ctx, "shared"); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("locker: %v", err)
	}
	if n := overlaps.Load(); n != 0 {
		t.Errorf("%d times two lockers held the lock at once", n)
	}
}

func deadHoldersLockExpires(t *testing.T, s certmagic.Storage) {
	ctx := context.Background()
	if err := s.Lock(ctx, "stale"); err != nil {
		t.Fatalf("Lock: %v", err)
	}
	// The holder never unlocks nor renews: it died.
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.Lock(lctx, "stale"); err != nil {
		t.Fatalf("Lock of a lock left by a dead holder: %v (after %v)", err, time.Since(start))
	}
	if err := s.Unlock(ctx, "stale"); err != nil {
		t.Errorf("Unlock after taking over: %v", err)
	}
}

func canceledLockerStops(t *testing.T, s certmagic.Storage) {
	ctx := context.Background()
	if err := s.Lock(ctx, "cancel-me"); err != nil {
		t.Fatalf("Lock: %v", err)
	}
	defer s.Unlock(ctx, "cancel-me")
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Lock(lctx, "cancel-me") }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Lock after cancel = %v, want context.Canceled", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Lock kept waiting after its context was canceled")
	}
}
