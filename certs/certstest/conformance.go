// Package certstest holds test helpers for certificate storage and issuance
// that more than one package's tests use: the storage conformance suite, a
// Pebble ACME server with its challenge test server, and a fake of the
// Cloudflare DNS API that writes into that challenge server.
package certstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// StorageConformance runs the behaviour certmagic relies on against stores
// made by newStorage.
//
// newStorage must return a new, empty store for the test it is given, and
// arrange its cleanup. Its locks must expire when their holder stops
// renewing them: the store under test must treat a lock that was neither
// released nor renewed as stale after a bound between 500ms and 3s (set a
// short lock TTL in the factory). The suite simulates a holder that died by
// taking a lock and never releasing it.
func StorageConformance(t *testing.T, newStorage func(t *testing.T) certmagic.Storage) {
	t.Helper()
	type storageCase struct {
		name string
		run  func(t *testing.T, s certmagic.Storage)
	}
	cases := []storageCase{
		{"a stored value loads back and a second store overwrites it", storeLoadsBackAndOverwrites},
		{"binary values survive byte for byte", binaryValuesSurvive},
		{"a missing key loads as not exist", missingKeyIsNotExist},
		{"exists sees files and directories by component, not by string prefix", existsByComponent},
		{"stat describes files and directories and refuses missing keys", statDescribesKeys},
		{"list returns direct children or, recursively, everything beneath", listChildrenOrAll},
		{"delete removes a key and everything beneath it and ignores missing keys", deleteRemovesSubtree},
		{"concurrent stores to different keys all land", concurrentStoresLand},
		{"a released lock can be taken again at once", releasedLockIsFree},
		{"a held lock blocks another locker until its context ends", heldLockBlocks},
		{"concurrent lockers get the lock one at a time", lockersTakeTurns},
		{"a lock whose holder died expires and can be taken", deadHoldersLockExpires},
		{"a canceled context stops a waiting locker", canceledLockerStops},
	}
	if _, ok := newStorageProbe(t, newStorage).(certmagic.TryLocker); ok {
		cases = append(cases, storageCase{"try-lock takes a free lock and refuses a held one without waiting", tryLockDoesNotWait})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, newStorage(t)) })
	}
}

func storeLoadsBackAndOverwrites(t *testing.T, s certmagic.Storage) {
	mustStore(t, s, "a/b/c.crt", []byte("one"))
	if got := mustLoad(t, s, "a/b/c.crt"); string(got) != "one" {
		t.Fatalf("Load = %q, want %q", got, "one")
	}
	mustStore(t, s, "a/b/c.crt", []byte("two"))
	if got := mustLoad(t, s, "a/b/c.crt"); string(got) != "two" {
		t.Fatalf("Load after overwrite = %q, want %q", got, "two")
	}
}

func binaryValuesSurvive(t *testing.T, s certmagic.Storage) {
	val := make([]byte, 70000)
	for i := range val {
		val[i] = byte(i * 7)
	}
	mustStore(t, s, "bin/blob", val)
	if got := mustLoad(t, s, "bin/blob"); !bytes.Equal(got, val) {
		t.Fatalf("Load returned %d bytes that differ from the %d stored", len(got), len(val))
	}
}

func missingKeyIsNotExist(t *testing.T, s certmagic.Storage) {
	ctx := context.Background()
	_, err := s.Load(ctx, "nope/nothing")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load(missing) error = %v, want fs.ErrNotExist", err)
	}
}

func existsByComponent(t *testing.T, s certmagic.Storage) {
	ctx := context.Background()
	mustStore(t, s, "certs/ca/example.com/example.com.crt", []byte("x"))
	for _, tc := range []struct {
		key  string
		want bool
	}{
		{"certs/ca/example.com/example.com.crt", true},
		{"certs/ca/example.com", true},
		{"certs", true},
		{"certs/ca/example", false},
		{"cert", false},
		{"certs/ca/example.com/example.com.crt/deeper", false},
		{"other", false},
	} {
		if got := s.Exists(ctx, tc.key); got != tc.want {
			t.Errorf("Exists(%q) = %v, want %v", tc.key, got, tc.want)
		}
	}
}

func statDescribesKeys(t *testing.T, s certmagic.Storage) {
	ctx := context.Background()
	before := time.Now().Add(-2 * time.Second)
	mustStore(t, s, "d/file", []byte("12345"))
	fi, err := s.Stat(ctx, "d/file")
	if err != nil {
		t.Fatalf("Stat(file): %v", err)
	}
	if fi.Key != "d/file" || !fi.IsTerminal || fi.Size != 5 {
		t.Errorf("Stat(file) = %+v, want key d/file, terminal, size 5", fi)
	}
	if fi.Modified.Before(before) || fi.Modified.After(time.Now().Add(2*time.Second)) {
		t.Errorf("Stat(file).Modified = %v, want about now", fi.Modified)
	}
	di, err := s.Stat(ctx, "d")
	if err != nil {
		t.Fatalf("Stat(dir): %v", err)
	}
	if di.Key != "d" || di.IsTerminal {
		t.Errorf("Stat(dir) = %+v, want key d, not terminal", di)
	}
	if _, err := s.Stat(ctx, "missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat(missing) error = %v, want fs.ErrNotExist", err)
	}
}

func listChildrenOrAll(t *testing.T, s certmagic.Storage) {
	ctx := context.Background()
	for _, k := range []string{"acme/ca1/sites/a.test/a.test.crt", "acme/ca1/sites/a.test/a.test.key", "acme/ca1/sites/b.test/b.test.crt", "acme/ca1/users/me/me.key", "acme/ca1file", "acmeother/x"} {
		mustStore(t, s, k, []byte("v"))
	}
	got := mustList(t, s, "acme", false)
	want := []string{"acme/ca1", "acme/ca1file"}
	if !slices.Equal(got, want) {
		t.Errorf("List(acme, non-recursive) = %q, want %q", got, want)
	}
	got = mustList(t, s, "acme/ca1/sites", true)
	want = []string{"acme/ca1/sites/a.test", "acme/ca1/sites/a.test/a.test.crt", "acme/ca1/sites/a.test/a.test.key", "acme/ca1/sites/b.test", "acme/ca1/sites/b.test/b.test.crt"}
	if !slices.Equal(got, want) {
		t.Errorf("List(acme/ca1/sites, recursive) = %q, want %q", got, want)
	}
	if _, err := s.List(ctx, "nothing/here", false); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("List(missing) error = %v, want fs.ErrNotExist", err)
	}
}

func deleteRemovesSubtree(t *testing.T, s certmagic.Storage) {
	ctx := context.Background()
	for _, k := range []string{"x/y/1", "x/y/z/2", "x/y", "x/yy/3", "x/keep"} {
		mustStore(t, s, k, []byte("v"))
	}
	if err := s.Delete(ctx, "x/y"); err != nil {
		t.Fatalf("Delete(x/y): %v", err)
	}
	for _, tc := range []struct {
		key  string
		want bool
	}{{"x/y", false}, {"x/y/1", false}, {"x/y/z/2", false}, {"x/yy/3", true}, {"x/keep", true}} {
		if got := s.Exists(ctx, tc.key); got != tc.want {
			t.Errorf("after Delete(x/y): Exists(%q) = %v, want %v", tc.key, got, tc.want)
		}
	}
	if err := s.Delete(ctx, "x/y"); err != nil {
		t.Errorf("Delete of an already deleted key = %v, want nil", err)
	}
	if err := s.Delete(ctx, "never/was"); err != nil {
		t.Errorf("Delete(missing) = %v, want nil", err)
	}
}

func concurrentStoresLand(t *testing.T, s certmagic.Storage) {
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Go(func() {
			if err := s.Store(ctx, fmt.Sprintf("many/%02d", i), []byte{byte(i)}); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent Store: %v", err)
	}
	if got := mustList(t, s, "many", false); len(got) != 16 {
		t.Errorf("List(many) has %d keys, want 16", len(got))
	}
}

// newStorageProbe makes one store only to learn which optional interfaces
// the implementation offers.
func newStorageProbe(t *testing.T, newStorage func(t *testing.T) certmagic.Storage) certmagic.Storage {
	return newStorage(t)
}

func mustStore(t *testing.T, s certmagic.Storage, key string, val []byte) {
	t.Helper()
	if err := s.Store(context.Background(), key, val); err != nil {
		t.Fatalf("Store(%q): %v", key, err)
	}
}

func mustLoad(t *testing.T, s certmagic.Storage, key string) []byte {
	t.Helper()
	v, err := s.Load(context.Background(), key)
	if err != nil {
		t.Fatalf("Load(%q): %v", key, err)
	}
	return v
}

func mustList(t *testing.T, s certmagic.Storage, prefix string, recursive bool) []string {
	t.Helper()
	keys, err := s.List(context.Background(), prefix, recursive)
	if err != nil {
		t.Fatalf("List(%q, %v): %v", prefix, recursive, err)
	}
	slices.Sort(keys)
	return keys
}
