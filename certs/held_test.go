package certs

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// stallingStorage is a certmagic.Storage whose loads of wildcard
// certificates wait until release is closed, as a fleet store on a hung
// node does (up to heldLoadTimeout).
type stallingStorage struct {
	certmagic.Storage
	entered chan struct{}
	release chan struct{}
}

func (s *stallingStorage) Load(ctx context.Context, key string) ([]byte, error) {
	if strings.Contains(key, "wildcard_") {
		select {
		case s.entered <- struct{}{}:
		default:
		}
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.Storage.Load(ctx, key)
}

// TestHeldWildcardsAnswerWhileStorageIsSlow: the status page asks
// NotRenewed for every certificate it lists; a Load waiting on storage
// must not hold those answers back for as long as it waits.
func TestHeldWildcardsAnswerWhileStorageIsSlow(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	local, err := NewBoltStorage(db)
	if err != nil {
		t.Fatal(err)
	}
	st := &stallingStorage{Storage: local, entered: make(chan struct{}, 1), release: make(chan struct{})}
	m, err := New(context.Background(), Options{Mode: ModeACME, DB: db, Storage: st, CA: "https://127.0.0.1:1/dir"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	h := NewHeldWildcards(m)
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		h.Load([]string{"*.apps.example"})
	}()
	release := sync.OnceFunc(func() { close(st.release) })
	defer func() {
		release()
		<-loaded
	}()
	select {
	case <-st.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("Load never read the storage")
	}
	answered := make(chan bool)
	go func() { answered <- h.NotRenewed([]string{"shop.example"}) }()
	select {
	case got := <-answered:
		if got {
			t.Error("NotRenewed(shop.example) = true, want false")
		}
	case <-time.After(2 * time.Second):
		release() // let the goroutines end before failing
		<-answered
		t.Fatal("NotRenewed waited for a Load blocked on storage")
	}
}

// TestHeldWildcardsLookForTheLatestDocumentsKeys: each routing document's
// keys were loaded on a goroutine of their own, which recorded them for the
// minutely look; one that ran late put an older document's keys back, and
// a wildcard added since was never looked for again.
func TestHeldWildcardsLookForTheLatestDocumentsKeys(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	m, err := New(context.Background(), Options{Mode: ModeACME, DB: db, CA: "https://127.0.0.1:1/dir"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	h := NewHeldWildcards(m)
	older, latest := []string{"*.a.example"}, []string{"*.a.example", "*.b.example"}
	h.Want(older)
	h.Want(latest)
	h.Load(older) // the older document's load, late
	h.mu.Lock()
	got := h.keys
	h.mu.Unlock()
	if !slices.Equal(got, latest) {
		t.Errorf("keys looked for again = %v, want the latest document's %v", got, latest)
	}
}
