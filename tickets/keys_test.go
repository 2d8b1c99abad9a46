package tickets

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

var start = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// server serves TLS with keys on a loopback listener: each connection gets
// one byte, so that the client reads the session ticket sent before it.
func server(t *testing.T, k *Keys) string {
	t.Helper()
	cert, _ := testsupport.SelfSigned(t)
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}}
	k.Configure(cfg)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				c.Write([]byte{1})
				io.Copy(io.Discard, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// client is a TLS client with a session cache, as a returning browser.
type client struct {
	cfg *tls.Config
}

func newClient(version uint16) *client {
	return &client{cfg: &tls.Config{
		ServerName:         "localhost", // the cache's key, whatever the address
		InsecureSkipVerify: true,
		ClientSessionCache: tls.NewLRUClientSessionCache(8),
		MinVersion:         version,
		MaxVersion:         version,
	}}
}

// connect reports whether a connection to addr resumed a session.
func (c *client) connect(t *testing.T, addr string) bool {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, c.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(conn, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	return conn.ConnectionState().DidResume
}

// memStore is a fleet store in memory; fail makes every call fail.
type memStore struct {
	mu      sync.Mutex
	objects map[string][]byte
	stores  int
	fail    bool
	locks   sync.Mutex
}

func newMemStore() *memStore { return &memStore{objects: map[string][]byte{}} }

var errDown = errors.New("node unreachable")

func (s *memStore) Load(_ context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return nil, errDown
	}
	b, ok := s.objects[key]
	if !ok {
		return nil, fs.ErrNotExist
	}
	return b, nil
}

func (s *memStore) Store(_ context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return errDown
	}
	s.objects[key] = value
	s.stores++
	return nil
}

func (s *memStore) Lock(context.Context, string) error   { s.locks.Lock(); return nil }
func (s *memStore) Unlock(context.Context, string) error { s.locks.Unlock(); return nil }

func (s *memStore) setFail(v bool) {
	s.mu.Lock()
	s.fail = v
	s.mu.Unlock()
}

// advance moves clk on by d, timer by timer, as the n Keys on it wait,
// and returns once each has brought its keys to the new present and waits
// again.
func advance(t *testing.T, clk *clock.Fake, n int, d time.Duration) {
	t.Helper()
	armed := func() bool { return clk.Waiting() == n }
	for remaining := d; remaining > 0; {
		testsupport.WaitFor(t, 5*time.Second, "the keys waiting on the clock", armed)
		step := remaining
		if next, ok := clk.Next(); ok && next > 0 && next < step {
			step = next
		}
		clk.Advance(step)
		remaining -= step
	}
	testsupport.WaitFor(t, 5*time.Second, "the keys waiting on the clock again", armed)
}

func mustNew(t *testing.T, o Options) *Keys {
	t.Helper()
	k, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func testLogger(w io.Writer) zerolog.Logger { return zerolog.New(w) }

func TestResumption(t *testing.T) {
	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		name := tls.VersionName(version)
		t.Run(name+": a session resumes on the same edge", func(t *testing.T) {
			k := mustNew(t, Options{})
			defer k.Close()
			addr := server(t, k)
			c := newClient(version)
			if c.connect(t, addr) {
				t.Fatal("first connection resumed")
			}
			if !c.connect(t, addr) {
				t.Fatal("second connection did not resume")
			}
		})
		t.Run(name+": a session resumes on the successor the keys were handed to", func(t *testing.T) {
			old := mustNew(t, Options{})
			c := newClient(version)
			c.connect(t, server(t, old))
			handed := old.Export()
			old.Close()
			next := mustNew(t, Options{Inherited: handed})
			defer next.Close()
			if !c.connect(t, server(t, next)) {
				t.Fatal("did not resume on the successor")
			}
		})
		t.Run(name+": a session resumes on another edge of the fleet store", func(t *testing.T) {
			store := newMemStore()
			a := mustNew(t, Options{Store: store})
			defer a.Close()
			b := mustNew(t, Options{Store: store})
			defer b.Close()
			c := newClient(version)
			c.connect(t, server(t, a))
			if !c.connect(t, server(t, b)) {
				t.Fatal("did not resume on the second edge")
			}
			if store.stores != 1 {
				t.Errorf("the store was written %d times, want once: one edge makes the keys, the other adopts them", store.stores)
			}
		})
		t.Run(name+": a session does not resume on an edge with other keys", func(t *testing.T) {
			a, b := mustNew(t, Options{}), mustNew(t, Options{})
			defer a.Close()
			defer b.Close()
			c := newClient(version)
			c.connect(t, server(t, a))
			if c.connect(t, server(t, b)) {
				t.Fatal("resumed with keys the edge never had")
			}
		})
	}
}

func TestUnreadableInheritedKeysStartAfresh(t *testing.T) {
	for _, in := range []string{
		`not json`,
		`{"keys":[{"key":"c2hvcnQ=","from":"2026-12-01T00:00:00Z"}]}`,
		`{"keys":[{"key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}]}`,
		`{"accepted":[{"key":"c2hvcnQ=","from":"2026-12-01T00:00:00Z"}]}`,
	} {
		t.Run(in, func(t *testing.T) {
			var log testsupport.SyncBuffer
			k := mustNew(t, Options{Inherited: []byte(in), Log: testLogger(&log)})
			defer k.Close()
			c := newClient(tls.VersionTLS13)
			addr := server(t, k)
			c.connect(t, addr)
			if !c.connect(t, addr) {
				t.Fatal("fresh keys do not resume")
			}
			if !strings.Contains(log.String(), "unreadable") {
				t.Errorf("no log line for the unreadable keys: %s", log.String())
			}
		})
	}
}

func TestRotation(t *testing.T) {
	clk := clock.NewFake(start)
	k := mustNew(t, Options{Clock: clk})
	defer k.Close()
	addr := server(t, k)
	early := newClient(tls.VersionTLS13)
	early.connect(t, addr)

	// A rotation falls due: the next key is announced, not yet used.
	advance(t, clk, 1, DefaultRotate-DefaultLead)
	if got := keyCount(k); got != 2 {
		t.Fatalf("keys after the announcement: %d, want 2", got)
	}
	// Past the rotation: new tickets use the new key, old ones still resume.
	advance(t, clk, 1, DefaultLead)
	late := newClient(tls.VersionTLS13)
	late.connect(t, addr)
	if !early.connect(t, addr) {
		t.Fatal("a ticket under the previous key does not resume after a rotation")
	}
	// Retain after the first key started it is gone; the newer one's
	// tickets still resume, and the keys held stay few.
	advance(t, clk, 1, DefaultRetain-DefaultRotate)
	if !late.connect(t, addr) {
		t.Fatal("a ticket under the current key does not resume")
	}
	if n := keyCount(k); n > 3 {
		t.Errorf("%d keys held after %v, want at most 3", n, DefaultRetain)
	}
}

func TestExpiredKeyNoLongerResumes(t *testing.T) {
	clk := clock.NewFake(start)
	k := mustNew(t, Options{Clock: clk})
	defer k.Close()
	addr := server(t, k)
	c := newClient(tls.VersionTLS13)
	c.connect(t, addr)
	advance(t, clk, 1, DefaultRetain)
	// The client's one ticket was used up by nothing: it is still cached,
	// under a key the edge dropped.
	if c.connect(t, addr) {
		t.Fatal("a ticket under a key past Retain resumed")
	}
}

func TestFleetOutage(t *testing.T) {
	store := newMemStore()
	store.setFail(true)
	clk := clock.NewFake(start)
	var log testsupport.SyncBuffer
	a := mustNew(t, Options{Store: store, Clock: clk, Log: testLogger(&log)})
	defer a.Close()
	addr := server(t, a)
	c := newClient(tls.VersionTLS13)
	c.connect(t, addr)
	if !c.connect(t, addr) {
		t.Fatal("an edge cut off from its store gives no resumable tickets")
	}
	if got := strings.Count(log.String(), "unreadable"); got != 1 {
		t.Errorf("outage logged %d times, want once: %s", got, log.String())
	}
	store.setFail(false)
	advance(t, clk, 1, DefaultSync)
	if !strings.Contains(log.String(), "readable again") {
		t.Errorf("recovery not logged: %s", log.String())
	}
	// The ticket made under the edge's own key still resumes here; a
	// second edge of the store resumes what the first issues now.
	if !c.connect(t, addr) {
		t.Fatal("a ticket under the edge's own key no longer resumes once it adopted the fleet's")
	}
	b := mustNew(t, Options{Store: store, Clock: clk})
	defer b.Close()
	c2 := newClient(tls.VersionTLS13)
	c2.connect(t, addr)
	if !c2.connect(t, server(t, b)) {
		t.Fatal("after the outage, a ticket of the first edge does not resume on the second")
	}
}

func TestFleetRotationOnce(t *testing.T) {
	store := newMemStore()
	clk := clock.NewFake(start)
	a := mustNew(t, Options{Store: store, Clock: clk})
	defer a.Close()
	b := mustNew(t, Options{Store: store, Clock: clk})
	defer b.Close()
	store.mu.Lock()
	before := store.stores
	store.mu.Unlock()
	// Both edges sync on their own timers, and one of them finds the
	// rotation due and writes it; the other adopts it.
	advance(t, clk, 2, DefaultRotate-DefaultLead+DefaultSync)
	if keyCount(a) != 2 || keyCount(b) != 2 {
		t.Fatalf("keys held: %d and %d, want the announced one beside the current one on both", keyCount(a), keyCount(b))
	}
	store.mu.Lock()
	after := store.stores
	store.mu.Unlock()
	if after-before != 1 {
		t.Errorf("the store was written %d times for one rotation, want 1", after-before)
	}
}

func keyCount(k *Keys) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.own.Keys)
}

func TestScheduleRotated(t *testing.T) {
	tm := timing{rotate: 12 * time.Hour, retain: 36 * time.Hour, lead: 30 * time.Minute}
	k := func(from time.Duration) key { return key{Secret: make([]byte, 32), From: start.Add(from)} }
	for _, tc := range []struct {
		name    string
		keys    []key
		at      time.Duration
		want    []time.Duration // the From of each key after, newest first
		changed bool
	}{
		{"no keys: one that encrypts at once", nil, 0, []time.Duration{0}, true},
		{"a fresh key: nothing to do", []key{k(0)}, time.Hour, []time.Duration{0}, false},
		{"a rotation due: the next key starts Lead later", []key{k(0)}, 11*time.Hour + 30*time.Minute, []time.Duration{12 * time.Hour, 0}, true},
		{"an announced key: nothing more", []key{k(12 * time.Hour), k(0)}, 11*time.Hour + 45*time.Minute, []time.Duration{12 * time.Hour, 0}, false},
		{"a key past Retain is dropped", []key{k(36 * time.Hour), k(24 * time.Hour), k(12 * time.Hour), k(0)}, 36*time.Hour + time.Minute, []time.Duration{36 * time.Hour, 24 * time.Hour, 12 * time.Hour}, true},
		{"every key past Retain: one that encrypts at once", []key{k(0)}, 40 * time.Hour, []time.Duration{40 * time.Hour}, true},
		{"none started yet (clocks apart): kept, the oldest encrypts", []key{k(2 * time.Hour)}, 0, []time.Duration{2 * time.Hour}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changed := schedule{Keys: tc.keys}.rotated(start.Add(tc.at), tm)
			var froms []time.Duration
			for _, k := range got.Keys {
				froms = append(froms, k.From.Sub(start))
			}
			if fmt.Sprint(froms) != fmt.Sprint(tc.want) {
				t.Errorf("keys start at %v, want %v", froms, tc.want)
			}
			if changed != tc.changed {
				t.Errorf("changed = %v, want %v", changed, tc.changed)
			}
		})
	}
}

// hungStore is a node that accepts the connection and never answers.
type hungStore struct{ memStore }

func (*hungStore) Load(ctx context.Context, _ string) ([]byte, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func TestAHungStoreDoesNotHoldStartUp(t *testing.T) {
	var log testsupport.SyncBuffer
	k := mustNew(t, Options{Store: &hungStore{}, Log: testLogger(&log)})
	defer k.Close()
	addr := server(t, k)
	c := newClient(tls.VersionTLS13)
	c.connect(t, addr)
	if !c.connect(t, addr) {
		t.Fatal("an edge whose store hangs at start-up gives no resumable tickets")
	}
	if !strings.Contains(log.String(), "unreadable") {
		t.Errorf("the hung store was not logged: %s", log.String())
	}
}

func TestPresentedTicketsAreCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := mustNew(t, Options{Registerer: reg})
	defer a.Close()
	b := mustNew(t, Options{})
	defer b.Close()
	c := newClient(tls.VersionTLS13)
	addrA := server(t, a)
	c.connect(t, addrA)
	c.connect(t, addrA)        // a ticket a knows
	c.connect(t, server(t, b)) // b's, which a never held, replaces it
	c.connect(t, addrA)        // a ticket a does not know
	for _, tc := range []struct {
		result string
		want   float64
	}{{resultKnown, 1}, {resultUnknown, 1}} {
		got, _ := testsupport.MetricValue(t, reg, "scafo_edge_tls_tickets_presented_total", testsupport.Labels{"result": tc.result})
		if got != tc.want {
			t.Errorf(`scafo_edge_tls_tickets_presented_total{result=%q} = %v, want %v`, tc.result, got, tc.want)
		}
	}
	if _, err := New(Options{Registerer: reg}); err == nil {
		t.Error("a second Keys registered on the same registry, want an error")
	}
}
