package certs

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	bolt "go.etcd.io/bbolt"

	"github.com/scafo/scafo-edge/certs/certstest"
)

func openTestDB(t testing.TB, dir string) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "edge.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("open bbolt: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestBoltStorageConformance(t *testing.T) {
	certstest.StorageConformance(t, func(t *testing.T) certmagic.Storage {
		s, err := NewBoltStorage(openTestDB(t, t.TempDir()))
		if err != nil {
			t.Fatalf("NewBoltStorage: %v", err)
		}
		s.LockTTL = 700 * time.Millisecond
		s.LockPollInterval = 20 * time.Millisecond
		return s
	})
}

func TestBoltStorageLocks(t *testing.T) {
	ctx := context.Background()
	t.Run("a lock left by another process is stale at once", func(t *testing.T) {
		db := openTestDB(t, t.TempDir())
		s, err := NewBoltStorage(db)
		if err != nil {
			t.Fatal(err)
		}
		// Write the record a crashed earlier process would have left.
		err = db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(locksBucket).Put([]byte("issue_cert_a.test"),
				[]byte(`{"process":"dead","token":"t","created":"2020-01-01T00:00:00Z","expires":"2999-01-01T00:00:00Z"}`))
		})
		if err != nil {
			t.Fatal(err)
		}
		ok, err := s.TryLock(ctx, "issue_cert_a.test")
		if err != nil || !ok {
			t.Fatalf("TryLock over a dead process's lock = %v, %v, want true, nil", ok, err)
		}
	})
	t.Run("a renewed lease keeps a lock past its ttl", func(t *testing.T) {
		s, err := NewBoltStorage(openTestDB(t, t.TempDir()))
		if err != nil {
			t.Fatal(err)
		}
		clk := newFakeClock()
		s.clock = clk
		s.LockTTL = time.Minute
		if err := s.Lock(ctx, "n"); err != nil {
			t.Fatal(err)
		}
		if err := s.RenewLockLease(ctx, "n", time.Hour); err != nil {
			t.Fatalf("RenewLockLease: %v", err)
		}
		clk.Advance(2 * s.LockTTL)
		ok, err := s.TryLock(ctx, "n")
		if err != nil || ok {
			t.Fatalf("TryLock of a renewed lock = %v, %v, want false, nil", ok, err)
		}
	})
	t.Run("unlock of a lock taken over by another holder leaves it held", func(t *testing.T) {
		db := openTestDB(t, t.TempDir())
		a, _ := NewBoltStorage(db)
		b, _ := NewBoltStorage(db)
		clk := newFakeClock()
		a.clock, b.clock = clk, clk
		a.LockTTL = time.Minute
		if err := a.Lock(ctx, "n"); err != nil {
			t.Fatal(err)
		}
		clk.Advance(a.LockTTL + time.Second) // A stalled past its lease
		if err := b.Lock(ctx, "n"); err != nil {
			t.Fatalf("Lock over an expired lock: %v", err)
		}
		if err := a.Unlock(ctx, "n"); err != nil {
			t.Fatalf("Unlock by the old holder: %v", err)
		}
		if ok, _ := a.TryLock(ctx, "n"); ok {
			t.Fatal("the old holder's Unlock released the new holder's lock")
		}
	})
}
