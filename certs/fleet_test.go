package certs

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

const fleetToken = "fleet-token"

// openFleetDB opens <dir>/edge.db; the caller closes it (a restart closes
// and reopens the same file).
func openFleetDB(t testing.TB, dir string) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "edge.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("open bbolt: %v", err)
	}
	return db
}

// fleetStore is one edge's FleetStorage on its own bbolt file.
type fleetStore struct {
	*FleetStorage
	local  *BoltStorage
	db     *bolt.DB
	client *node.StorageClient
}

// newFleetStore opens a FleetStorage on the database in dir, talking to n;
// t's cleanup closes it unless close was called first.
func newFleetStore(t testing.TB, n *nodetest.Node, dir string, opts FleetOptions) *fleetStore {
	t.Helper()
	db := openFleetDB(t, dir)
	local, err := NewBoltStorage(db)
	if err != nil {
		t.Fatalf("NewBoltStorage: %v", err)
	}
	if opts.clock != nil {
		local.clock = opts.clock
	}
	client := node.NewStorageClient(n.URL(), fleetToken, nil)
	s, err := NewFleetStorage(client, local, opts)
	if err != nil {
		t.Fatalf("NewFleetStorage: %v", err)
	}
	fs := &fleetStore{FleetStorage: s, local: local, db: db, client: client}
	t.Cleanup(fs.close)
	return fs
}

// close stops the store like a shutdown: retries end, the file closes.
func (s *fleetStore) close() {
	s.Close()
	s.client.CloseIdleConnections()
	s.db.Close()
}

// fastFleet is FleetOptions for tests: short lock bound and retries.
func fastFleet() FleetOptions {
	return FleetOptions{
		LockTTL:     time.Second,
		LockPollMax: 50 * time.Millisecond,
		NodeTimeout: 2 * time.Second,
		RetryMin:    20 * time.Millisecond,
		RetryMax:    200 * time.Millisecond,
	}
}

func TestFleetStorageConformance(t *testing.T) {
	certstest.StorageConformance(t, func(t *testing.T) certmagic.Storage {
		n := nodetest.New(t, nodetest.Options{Token: fleetToken})
		return newFleetStore(t, n, t.TempDir(), fastFleet()).FleetStorage
	})
}

func TestFleetStorageOutage(t *testing.T) {
	ctx := context.Background()

	t.Run("a write during an outage is kept locally, served, and lands when the node returns", func(t *testing.T) {
		n := nodetest.New(t, nodetest.Options{Token: fleetToken})
		s := newFleetStore(t, n, t.TempDir(), fastFleet())
		n.Stop()
		if err := s.Store(ctx, "certificates/ca/a.test/a.test.crt", []byte("cert")); err != nil {
			t.Fatalf("Store during an outage = %v, want nil (kept locally and queued)", err)
		}
		if got := s.Pending(); got != 1 {
			t.Errorf("Pending = %d, want 1", got)
		}
		if v, err := s.Load(ctx, "certificates/ca/a.test/a.test.crt"); err != nil || string(v) != "cert" {
			t.Errorf("Load during the outage = %q, %v, want the local copy", v, err)
		}
		if err := n.Restart(); err != nil {
			t.Fatal(err)
		}
		testsupport.WaitFor(t, 10*time.Second, "the queued write to reach the node", func() bool {
			v, ok := n.StorageObject("certificates/ca/a.test/a.test.crt")
			return ok && string(v) == "cert" && s.Pending() == 0
		})
	})

	t.Run("queued writes survive a restart of the edge and land in order", func(t *testing.T) {
		n := nodetest.New(t, nodetest.Options{Token: fleetToken})
		n.PutStorageObject("a/old", []byte("old"))
		dir := t.TempDir()
		s := newFleetStore(t, n, dir, fastFleet())
		n.Stop()
		for _, step := range []func() error{
			func() error { return s.Store(ctx, "a/b", []byte("1")) },
			func() error { return s.Delete(ctx, "a") },
			func() error { return s.Store(ctx, "a/c", []byte("2")) },
			func() error { return s.Store(ctx, "a/c", []byte("3")) },
		} {
			if err := step(); err != nil {
				t.Fatalf("write during the outage: %v", err)
			}
		}
		s.close()
		s = newFleetStore(t, n, dir, fastFleet())
		// The first put may already have been dropped: the delete queued
		// after it removed its local value, so there is nothing to send.
		if got := s.Pending(); got != 4 && got != 3 {
			t.Fatalf("Pending after the edge restarted = %d, want 3 or 4", got)
		}
		if err := n.Restart(); err != nil {
			t.Fatal(err)
		}
		testsupport.WaitFor(t, 10*time.Second, "the queue to drain", func() bool { return s.Pending() == 0 })
		if got, want := n.StorageKeys(), []string{"a/c"}; !slices.Equal(got, want) {
			t.Errorf("node keys = %q, want %q (the delete replayed between the puts)", got, want)
		}
		if v, _ := n.StorageObject("a/c"); string(v) != "3" {
			t.Errorf("node a/c = %q, want the last write, 3", v)
		}
	})

	t.Run("a value another edge wrote is copied locally and served after the node goes", func(t *testing.T) {
		n := nodetest.New(t, nodetest.Options{Token: fleetToken})
		a := newFleetStore(t, n, t.TempDir(), fastFleet())
		bDir := t.TempDir()
		b := newFleetStore(t, n, bDir, fastFleet())
		if err := a.Store(ctx, "certificates/ca/x.test/x.test.key", []byte("key")); err != nil {
			t.Fatal(err)
		}
		if v, err := b.Load(ctx, "certificates/ca/x.test/x.test.key"); err != nil || string(v) != "key" {
			t.Fatalf("B Load = %q, %v, want what A stored", v, err)
		}
		n.Stop()
		b.close()
		b = newFleetStore(t, n, bDir, fastFleet())
		if v, err := b.Load(ctx, "certificates/ca/x.test/x.test.key"); err != nil || string(v) != "key" {
			t.Errorf("restarted B Load with the node down = %q, %v, want its local copy", v, err)
		}
		if !b.Exists(ctx, "certificates/ca/x.test") {
			t.Error("restarted B: Exists(directory) with the node down = false")
		}
		keys, err := b.List(ctx, "certificates", true)
		if want := []string{"certificates/ca", "certificates/ca/x.test", "certificates/ca/x.test/x.test.key"}; err != nil || !slices.Equal(keys, want) {
			t.Errorf("restarted B List with the node down = %q, %v, want %q", keys, err, want)
		}
	})

	for _, tc := range []struct {
		name   string
		break_ func(n *nodetest.Node)
	}{
		{"a node answering 503", func(n *nodetest.Node) { n.SetStorageStatus(http.StatusServiceUnavailable) }},
		{"a node refusing the token", func(n *nodetest.Node) { n.SetToken("rotated") }},
		{"a node that hangs", func(n *nodetest.Node) { n.SetStorageDelay(time.Minute) }},
	} {
		t.Run(tc.name+" falls back to the local copy within the node timeout", func(t *testing.T) {
			n := nodetest.New(t, nodetest.Options{Token: fleetToken})
			opts := fastFleet()
			opts.NodeTimeout = 300 * time.Millisecond
			s := newFleetStore(t, n, t.TempDir(), opts)
			if err := s.Store(ctx, "k/v", []byte("v")); err != nil {
				t.Fatal(err)
			}
			tc.break_(n)
			start := time.Now()
			if v, err := s.Load(ctx, "k/v"); err != nil || string(v) != "v" {
				t.Errorf("Load = %q, %v, want the local copy", v, err)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("Load took %v, want about the node timeout", d)
			}
			if _, err := s.Load(ctx, "k/none"); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("Load(missing) = %v, want fs.ErrNotExist", err)
			}
		})
	}

	t.Run("while a node hangs one read at a time probes it and the rest use the local copy", func(t *testing.T) {
		n := nodetest.New(t, nodetest.Options{Token: fleetToken})
		clk := newFakeClock()
		opts := fastFleet()
		opts.NodeTimeout, opts.RetryMin, opts.clock = 300*time.Millisecond, 50*time.Millisecond, clk
		s := newFleetStore(t, n, t.TempDir(), opts)
		if err := s.Store(ctx, "k/v", []byte("v")); err != nil {
			t.Fatal(err)
		}
		n.SetStorageDelay(time.Minute)
		if _, err := s.Load(ctx, "k/v"); err != nil { // finds the node hung
			t.Fatal(err)
		}
		before := n.StorageCounts().Gets
		clk.Advance(opts.RetryMin) // past the pause after a failure: a probe is due
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				if v, err := s.Load(ctx, "k/v"); err != nil || string(v) != "v" {
					t.Errorf("Load = %q, %v, want the local copy", v, err)
				}
			})
		}
		wg.Wait()
		if got := n.StorageCounts().Gets - before; got != 1 {
			t.Errorf("the hung node got %d reads from 10 concurrent Loads, want 1 probe", got)
		}
	})

	t.Run("a write the node refuses for good is an error and is not queued", func(t *testing.T) {
		n := nodetest.New(t, nodetest.Options{Token: fleetToken})
		s := newFleetStore(t, n, t.TempDir(), fastFleet())
		n.SetStorageStatus(http.StatusRequestEntityTooLarge)
		err := s.Store(ctx, "big/one", []byte("x"))
		var se *node.StatusError
		if !errors.As(err, &se) || se.Status != http.StatusRequestEntityTooLarge {
			t.Errorf("Store = %v, want the node's 413", err)
		}
		if s.Pending() != 0 {
			t.Errorf("Pending = %d, want 0", s.Pending())
		}
	})

	t.Run("an outage is visible in the metrics and ends there when the node returns", func(t *testing.T) {
		n := nodetest.New(t, nodetest.Options{Token: fleetToken})
		reg := prometheus.NewRegistry()
		opts := fastFleet()
		opts.Registerer = reg
		s := newFleetStore(t, n, t.TempDir(), opts)
		if err := s.Lock(ctx, "held-through"); err != nil {
			t.Fatal(err)
		}
		n.Stop()
		if err := s.Store(ctx, "m/k", []byte("v")); err != nil {
			t.Fatal(err)
		}
		if err := s.RenewLockLease(ctx, "held-through", time.Minute); err != nil {
			t.Errorf("RenewLockLease during an outage = %v, want nil (the issuance goes on)", err)
		}
		for name, want := range map[string]float64{
			"scafo_edge_cert_store_node_up":        0,
			"scafo_edge_cert_store_pending_writes": 1,
		} {
			if got := fleetGauge(t, reg, name); got != want {
				t.Errorf("%s = %v during the outage, want %v", name, got, want)
			}
		}
		if err := n.Restart(); err != nil {
			t.Fatal(err)
		}
		testsupport.WaitFor(t, 10*time.Second, "the node to count as up again", func() bool {
			return fleetGauge(t, reg, "scafo_edge_cert_store_node_up") == 1 &&
				fleetGauge(t, reg, "scafo_edge_cert_store_pending_writes") == 0
		})
		if err := s.Unlock(ctx, "held-through"); err != nil {
			t.Errorf("Unlock after the outage: %v", err)
		}
	})

	t.Run("locks fall back to the local store while the node is down", func(t *testing.T) {
		n := nodetest.New(t, nodetest.Options{Token: fleetToken})
		s := newFleetStore(t, n, t.TempDir(), fastFleet())
		n.Stop()
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := s.Lock(lctx, "issue_cert_down.test"); err != nil {
			t.Fatalf("Lock with the node down: %v", err)
		}
		if ok, err := s.TryLock(ctx, "issue_cert_down.test"); ok || err != nil {
			t.Errorf("second TryLock = %v, %v, want false, nil", ok, err)
		}
		if err := s.Unlock(ctx, "issue_cert_down.test"); err != nil {
			t.Errorf("Unlock: %v", err)
		}
	})
}

func TestFleetStorageLocks(t *testing.T) {
	ctx := context.Background()

	t.Run("a lock is exclusive across edges and its record names the holder", func(t *testing.T) {
		n := nodetest.New(t, nodetest.Options{Token: fleetToken})
		opts := fastFleet()
		opts.Holder = "edge-a"
		a := newFleetStore(t, n, t.TempDir(), opts)
		b := newFleetStore(t, n, t.TempDir(), fastFleet())
		if ok, err := a.TryLock(ctx, "issue_cert_x.test"); !ok || err != nil {
			t.Fatalf("A TryLock = %v, %v", ok, err)
		}
		if rec, _ := n.StorageObject("locks/issue_cert_x.test"); !strings.Contains(string(rec), `"holder":"edge-a"`) {
			t.Errorf("lock record = %s, want it to name edge-a", rec)
		}
		if ok, err := b.TryLock(ctx, "issue_cert_x.test"); ok || err != nil {
			t.Errorf("B TryLock of A's fresh lock = %v, %v, want false, nil", ok, err)
		}
		if err := a.Unlock(ctx, "issue_cert_x.test"); err != nil {
			t.Fatal(err)
		}
		if _, held := n.StorageLock("issue_cert_x.test"); held {
			t.Error("lock still held on the node after Unlock")
		}
		if _, ok := n.StorageObject("locks/issue_cert_x.test"); ok {
			t.Error("lock record left after Unlock")
		}
		if ok, err := b.TryLock(ctx, "issue_cert_x.test"); !ok || err != nil {
			t.Errorf("B TryLock after A's Unlock = %v, %v, want true, nil", ok, err)
		}
	})

	t.Run("a renewed lease keeps the lock past the lock bound", func(t *testing.T) {
		n := nodetest.New(t, nodetest.Options{Token: fleetToken})
		opts := fastFleet()
		opts.clock = newFakeClock()
		a := newFleetStore(t, n, t.TempDir(), opts)
		b := newFleetStore(t, n, t.TempDir(), opts)
		if err := a.Lock(ctx, "renewed"); err != nil {
			t.Fatal(err)
		}
		if err := a.RenewLockLease(ctx, "renewed", time.Minute); err != nil {
			t.Fatalf("RenewLockLease: %v", err)
		}
		lctx, cancel := context.WithCancel(ctx)
		defer cancel()
		done := lockInBackground(lctx, b.FleetStorage, "renewed")
		limit := 2500 * time.Millisecond // past the 1s bound
		if moved, returned, err := advanceWhileWaiting(t, opts.clock.(*clock.Fake), 100*time.Millisecond, limit, done); returned {
			t.Fatalf("B Lock of a renewed lock returned %v after %v, want it to wait past %v", err, moved, limit)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("B Lock of a renewed lock = %v, want it to wait until its context ends", err)
		}
		if err := a.Unlock(ctx, "renewed"); err != nil {
			t.Errorf("A Unlock: %v", err)
		}
	})

	for _, tc := range []struct {
		name  string
		leave func(t *testing.T, n *nodetest.Node, dir string, opts FleetOptions)
	}{
		{"with its record", func(t *testing.T, n *nodetest.Node, dir string, opts FleetOptions) {
			dead := newFleetStore(t, n, dir, opts)
			if err := dead.Lock(ctx, "issue_cert_dead.test"); err != nil {
				t.Fatal(err)
			}
			dead.close() // dies holding it
		}},
		{"before writing its record", func(t *testing.T, n *nodetest.Node, _ string, _ FleetOptions) {
			c := node.NewStorageClient(n.URL(), fleetToken, nil)
			defer c.CloseIdleConnections()
			if ok, err := c.TryLock(ctx, "issue_cert_dead.test", []byte("{}")); !ok || err != nil {
				t.Fatalf("raw TryLock = %v, %v", ok, err)
			}
		}},
	} {
		t.Run("a lock left by a holder that died "+tc.name+" is taken over after the bound", func(t *testing.T) {
			n := nodetest.New(t, nodetest.Options{Token: fleetToken})
			clk := newFakeClock()
			opts := fastFleet()
			opts.clock = clk
			tc.leave(t, n, t.TempDir(), opts)
			s := newFleetStore(t, n, t.TempDir(), opts)
			lctx, cancel := context.WithCancel(ctx)
			defer cancel()
			d, returned, err := advanceWhileWaiting(t, clk, 100*time.Millisecond, time.Minute, lockInBackground(lctx, s.FleetStorage, "issue_cert_dead.test"))
			if !returned || err != nil {
				t.Fatalf("Lock of a dead holder's lock = %v after %v (returned %v)", err, d, returned)
			}
			if d < opts.LockTTL || d > 2*opts.LockTTL {
				t.Errorf("took over after %v, want just past the %v bound", d, opts.LockTTL)
			}
			if err := s.Unlock(ctx, "issue_cert_dead.test"); err != nil {
				t.Errorf("Unlock: %v", err)
			}
		})
	}

	t.Run("an edge whose lock was taken over does not release the new holder's", func(t *testing.T) {
		n := nodetest.New(t, nodetest.Options{Token: fleetToken})
		clk := newFakeClock()
		opts := fastFleet()
		opts.clock = clk
		a := newFleetStore(t, n, t.TempDir(), opts)
		b := newFleetStore(t, n, t.TempDir(), opts)
		if err := a.Lock(ctx, "slow"); err != nil {
			t.Fatal(err)
		}
		clk.Advance(2 * opts.LockTTL) // A stalled past its lease
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := b.Lock(lctx, "slow"); err != nil {
			t.Fatal(err)
		}
		if err := a.RenewLockLease(ctx, "slow", time.Minute); err == nil {
			t.Error("A RenewLockLease after the takeover = nil, want an error")
		}
		if err := a.Unlock(ctx, "slow"); err != nil {
			t.Errorf("A Unlock = %v", err)
		}
		if _, held := n.StorageLock("slow"); !held {
			t.Error("A's late Unlock released B's lock")
		}
		if err := b.Unlock(ctx, "slow"); err != nil {
			t.Errorf("B Unlock: %v", err)
		}
	})
}

func TestShapeList(t *testing.T) {
	keys := []string{"d/a/b/c", "d/a/x", "d/f", "dd/z", "d"}
	for _, tc := range []struct {
		name      string
		dir       string
		recursive bool
		want      []string
	}{
		{"a direct listing cuts keys to the first component", "d", false, []string{"d/a", "d/f"}},
		{"a recursive listing adds every directory between", "d", true, []string{"d/a", "d/a/b", "d/a/b/c", "d/a/x", "d/f"}},
		{"the root lists top-level names", "", false, []string{"d", "dd"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := shapeList(tc.dir, keys, tc.recursive); !slices.Equal(got, tc.want) {
				t.Errorf("shapeList(%q, %v) = %q, want %q", tc.dir, tc.recursive, got, tc.want)
			}
		})
	}
}

// fleetGauge reads the unlabelled gauge name from reg; -1 when absent.
func fleetGauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// lockInBackground runs s.Lock(ctx, name) in a goroutine and returns its
// result's channel.
func lockInBackground(ctx context.Context, s *FleetStorage, name string) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.Lock(ctx, name) }()
	return done
}

// fleetEdge is one edge of a fleet in this process: its two listeners on
// loopback, serving through whichever Manager is current, its own bbolt
// file, and a FleetStorage on the shared test node.
type fleetEdge struct {
	httpLn, httpsLn     net.Listener
	httpPort, httpsPort int
	dir                 string
	cur                 atomic.Pointer[Manager]
	store               *fleetStore
}

func newFleetEdge(t *testing.T) *fleetEdge {
	t.Helper()
	e := &fleetEdge{dir: t.TempDir()}
	var err error
	if e.httpLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if e.httpsLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	e.httpPort = certstest.PortOf(t, e.httpLn.Addr().String())
	e.httpsPort = certstest.PortOf(t, e.httpsLn.Addr().String())
	serveEdge(t, e.httpLn, e.httpsLn, &e.cur)
	return e
}

// serveEdge serves HTTP (challenges, redirects) and HTTPS through the
// current Manager until t ends.
func serveEdge(t testing.TB, httpLn, httpsLn net.Listener, cur *atomic.Pointer[Manager]) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	quiet := log.New(io.Discard, "", 0)
	httpSrv := &http.Server{ErrorLog: quiet, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cur.Load().HTTPHandler(ok).ServeHTTP(w, r)
	})}
	httpsSrv := &http.Server{ErrorLog: quiet, Handler: ok, TLSConfig: &tls.Config{
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return cur.Load().TLSConfig(), nil },
	}}
	done := make(chan struct{}, 2)
	go func() { httpSrv.Serve(httpLn); done <- struct{}{} }()
	go func() { httpsSrv.ServeTLS(httpsLn, "", ""); done <- struct{}{} }()
	t.Cleanup(func() {
		httpSrv.Close()
		httpsSrv.Close()
		<-done
		<-done
	})
}

// start opens the edge's database and fleet store and starts a Manager
// on them with opts.
func (e *fleetEdge) start(t *testing.T, n *nodetest.Node, opts Options, fopts FleetOptions) *Manager {
	t.Helper()
	e.store = newFleetStore(t, n, e.dir, fopts)
	opts.DB, opts.Storage = e.store.db, e.store.FleetStorage
	opts.HTTPPort, opts.HTTPSPort = e.httpPort, e.httpsPort
	m, err := New(context.Background(), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(m.Close) // runs before the store's cleanup
	e.cur.Store(m)
	return m
}

// stop shuts the edge down like a process exit: the Manager, the fleet
// store's retries, the database. The listeners stay for a restart.
func (e *fleetEdge) stop() {
	e.cur.Load().Close()
	e.store.close()
}

// handshake connects with SNI name and returns the leaf served, verified
// against roots.
func (e *fleetEdge) handshake(name string, roots *x509.CertPool) (*x509.Certificate, error) {
	d := &net.Dialer{Timeout: 60 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", e.httpsLn.Addr().String(), &tls.Config{
		ServerName: name, RootCAs: roots, SessionTicketsDisabled: true,
	})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

func acmeOptions(pb *certstest.Pebble, names ...string) Options {
	return Options{
		Mode:    ModeACME,
		Allowed: func(name string) bool { return slices.Contains(names, name) },
		CA:      pb.DirectoryURL,
		CARoot:  string(pb.RootPEM),
		Email:   "ops@example.test",
	}
}

// TestFleetOneOrderForManyEdges is what the fleet store is for: N edges sharing one
// node, each with its own bbolt file and listeners, asked for the same new
// name at the same moment, place one ACME order between them and serve
// the same certificate.
//
// The edges are Managers in this process, and certmagic deduplicates
// on-demand issuance for a name within a process (a package-level map in
// its handshake code), which would hide the fleet store from a test that
// only sent handshakes. So each edge is asked through the call a
// handshake makes, Config.ObtainCertAsync, whose only guard across edges
// is the storage lock; then each edge serves the name over TLS.
// TestFleetEdgeProcesses does the same with one process per edge.
func TestFleetOneOrderForManyEdges(t *testing.T) {
	// Run with each edge on its own bbolt store instead, the same race
	// placed two or three orders for two edges (the edges' challenges then
	// also collide in certmagic's in-process challenge map, so that run is
	// slow and not part of the suite).
	for _, edges := range []int{2, 5} {
		t.Run(fmt.Sprintf("%d edges with the fleet store place one order", edges), func(t *testing.T) {
			n := nodetest.New(t, nodetest.Options{Token: fleetToken})
			fleet := make([]*fleetEdge, edges)
			for i := range fleet {
				fleet[i] = newFleetEdge(t)
			}
			// Pebble validates at the first edge, which answers challenges
			// another edge started (here through certmagic's in-process
			// challenge map as well as the shared store; the process test
			// has only the store).
			pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: fleet[0].httpPort, TLSPort: fleet[0].httpsPort})
			host := "shop.fleet.test"
			for _, e := range fleet {
				e.start(t, n, acmeOptions(pb, host), FleetOptions{LockPollMax: 200 * time.Millisecond})
			}

			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			go1 := make(chan struct{})
			errs := make(chan error, edges)
			for _, e := range fleet {
				go func() {
					<-go1
					errs <- e.cur.Load().cfg.ObtainCertAsync(ctx, host)
				}()
			}
			close(go1)
			for range edges {
				if err := <-errs; err != nil {
					t.Errorf("obtain: %v", err)
				}
			}
			roots := pb.IssuerRoots(t)
			serials := map[string]int{}
			for i, e := range fleet {
				leaf, err := e.handshake(host, roots)
				if err != nil {
					t.Fatalf("edge %d handshake: %v", i, err)
				}
				serials[leaf.SerialNumber.Text(16)]++
			}
			pb.WaitOrderCount(t, 1)
			orders := pb.OrderCount()
			t.Logf("ACME orders for %d edges asking for one name at once: %d", edges, orders)
			if orders != 1 {
				t.Errorf("Pebble saw %d orders, want 1", orders)
			}
			if len(serials) != 1 {
				t.Errorf("edges serve %d different certificates (%v), want one", len(serials), serials)
			}
			for _, k := range n.StorageKeys() {
				if strings.Contains(k, "/users/") {
					t.Errorf("node holds ACME account key %q; accounts stay on each edge", k)
				}
			}
			for i, e := range fleet {
				keys, _ := e.store.local.List(context.Background(), "certificates", true)
				if !slices.ContainsFunc(keys, func(k string) bool { return strings.HasSuffix(k, "/"+host+".crt") }) {
					t.Errorf("edge %d has no local copy of the certificate (local keys %q)", i, keys)
				}
			}
		})
	}
}

func TestFleetNodeOutage(t *testing.T) {
	n := nodetest.New(t, nodetest.Options{Token: fleetToken})
	a, b := newFleetEdge(t), newFleetEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: a.httpPort, TLSPort: a.httpsPort})
	opts := acmeOptions(pb, "shop.fleet.test", "late.fleet.test")
	fopts := fastFleet()
	a.start(t, n, opts, fopts)
	b.start(t, n, opts, fopts)
	roots := pb.IssuerRoots(t)

	serve := func(t *testing.T, e *fleetEdge, name string) string {
		t.Helper()
		leaf, err := e.handshake(name, roots)
		if err != nil {
			t.Fatalf("handshake for %s: %v", name, err)
		}
		return leaf.SerialNumber.Text(16)
	}

	issued := serve(t, a, "shop.fleet.test")
	if got := serve(t, b, "shop.fleet.test"); got != issued {
		t.Fatalf("B serves serial %s, A %s: want the one certificate from the fleet store", got, issued)
	}
	pb.WaitOrderCount(t, 1)

	n.Stop()
	t.Run("with the node gone both edges keep serving", func(t *testing.T) {
		for i, e := range []*fleetEdge{a, b} {
			if got := serve(t, e, "shop.fleet.test"); got != issued {
				t.Errorf("edge %d serves %s, want %s", i, got, issued)
			}
		}
	})

	t.Run("an edge restarted while the node is gone serves its local copy", func(t *testing.T) {
		b.stop()
		b.start(t, n, opts, fopts)
		if got := serve(t, b, "shop.fleet.test"); got != issued {
			t.Errorf("restarted B serves %s, want %s", got, issued)
		}
	})

	t.Run("a certificate issued while the node is gone reaches it when it returns", func(t *testing.T) {
		late := serve(t, a, "late.fleet.test")
		if a.store.Pending() == 0 {
			t.Fatal("A queued nothing while the node was down")
		}
		if err := n.Restart(); err != nil {
			t.Fatal(err)
		}
		testsupport.WaitFor(t, 10*time.Second, "A's queued writes to land", func() bool { return a.store.Pending() == 0 })
		if !slices.ContainsFunc(n.StorageKeys(), func(k string) bool { return strings.HasSuffix(k, "/late.fleet.test.crt") }) {
			t.Fatalf("node keys %q lack late.fleet.test's certificate", n.StorageKeys())
		}
		orders := pb.OrderCount()
		if got := serve(t, b, "late.fleet.test"); got != late {
			t.Errorf("B serves %s for late.fleet.test, want A's %s", got, late)
		}
		if got := pb.OrderCount(); got != orders {
			t.Errorf("B placed an order (%d -> %d) for a certificate the fleet store holds", orders, got)
		}
	})
}

func TestFleetDeadLockHolderDoesNotBlockIssuance(t *testing.T) {
	n := nodetest.New(t, nodetest.Options{Token: fleetToken})
	e := newFleetEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	// An edge took the issuance lock for the name and died before it
	// wrote its record or released the lock.
	c := node.NewStorageClient(n.URL(), fleetToken, nil)
	defer c.CloseIdleConnections()
	if ok, err := c.TryLock(context.Background(), "issue_cert_orphan.fleet.test", []byte("{}")); !ok || err != nil {
		t.Fatalf("leave a lock: %v, %v", ok, err)
	}
	e.start(t, n, acmeOptions(pb, "orphan.fleet.test"), fastFleet())
	start := time.Now()
	if _, err := e.handshake("orphan.fleet.test", pb.IssuerRoots(t)); err != nil {
		t.Fatalf("handshake with the lock left behind: %v", err)
	}
	t.Logf("issued %v after the request, past a dead holder's lock (bound 1s)", time.Since(start).Round(time.Millisecond))
	if got := pb.OrderCount(); got != 1 {
		t.Errorf("orders = %d, want 1", got)
	}
}

// fleetChildEnv carries a fleetChild's configuration to a copy of this
// test binary running TestFleetEdgeProcess as one edge.
const fleetChildEnv = "SCAFO_TEST_FLEET_EDGE"

type fleetChild struct {
	Node, CA, CARoot, Dir string
	Names                 []string
}

// TestFleetEdgeProcess is one edge of TestFleetEdgeProcesses, in a process
// of its own: listeners inherited as fds 3 (HTTP) and 4 (HTTPS), its own
// bbolt file, the fleet store on the parent's test node. It prints
// "fleet-edge-ready" once serving and runs until its stdin closes.
func TestFleetEdgeProcess(t *testing.T) {
	raw := os.Getenv(fleetChildEnv)
	if raw == "" {
		t.Skip("one edge of TestFleetEdgeProcesses; run only by it")
	}
	var cfg fleetChild
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("child config: %v", err)
	}
	var lns [2]net.Listener
	for i := range lns {
		var err error
		if lns[i], err = net.FileListener(os.NewFile(uintptr(3+i), "listener")); err != nil {
			t.Fatalf("inherited listener %d: %v", i, err)
		}
	}
	var cur atomic.Pointer[Manager]
	db := openFleetDB(t, cfg.Dir)
	defer db.Close()
	local, err := NewBoltStorage(db)
	if err != nil {
		t.Fatal(err)
	}
	client := node.NewStorageClient(cfg.Node, fleetToken, nil)
	defer client.CloseIdleConnections()
	store, err := NewFleetStorage(client, local, FleetOptions{LockPollMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	m, err := New(context.Background(), Options{
		Mode:      ModeACME,
		DB:        db,
		Storage:   store,
		Allowed:   func(name string) bool { return slices.Contains(cfg.Names, name) },
		CA:        cfg.CA,
		CARoot:    cfg.CARoot,
		Email:     "ops@example.test",
		HTTPPort:  certstest.PortOf(t, lns[0].Addr().String()),
		HTTPSPort: certstest.PortOf(t, lns[1].Addr().String()),
		Log:       zerolog.New(os.Stderr).Level(zerolog.WarnLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cur.Store(m)
	serveEdge(t, lns[0], lns[1], &cur)
	fmt.Println("fleet-edge-ready")
	io.Copy(io.Discard, os.Stdin)
}

// TestFleetEdgeProcesses is TestFleetOneOrderForManyEdges as production runs it:
// N edge processes (copies of this test binary), each with its own bbolt
// file and listeners, one test node, one Pebble validating at the first
// edge; N simultaneous TLS handshakes for one new name, one per edge.
// Separate processes keep certmagic's in-process deduplication out of it:
// the fleet lock and the shared store alone make the one order, and the
// first edge answers challenges other edges started from the shared store.
func TestFleetEdgeProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts edge processes")
	}
	for _, edges := range []int{2, 5} {
		t.Run(fmt.Sprintf("%d edge processes asking for one new name at once place one order", edges), func(t *testing.T) {
			n := nodetest.New(t, nodetest.Options{Token: fleetToken})
			// Each edge's listeners are opened here and handed to it as
			// files, so the ports Pebble is told are already bound.
			httpAddrs, addrs := make([]string, edges), make([]string, edges)
			files := make([][]*os.File, edges)
			for i := range edges {
				for j, addr := range []*string{&httpAddrs[i], &addrs[i]} {
					ln, err := net.Listen("tcp", "127.0.0.1:0")
					if err != nil {
						t.Fatal(err)
					}
					f, err := ln.(*net.TCPListener).File()
					ln.Close() // the child serves the duplicate
					if err != nil {
						t.Fatalf("listener %d of edge %d: %v", j, i, err)
					}
					files[i] = append(files[i], f)
					*addr = ln.Addr().String()
				}
			}
			// The edges stop after Pebble (cleanups run last-registered
			// first): an edge's ACME client keeps a connection to Pebble
			// that only Pebble's exit closes, and the edge's leak check
			// would count it.
			var stops []func()
			t.Cleanup(func() {
				for _, stop := range stops {
					stop()
				}
			})
			pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: certstest.PortOf(t, httpAddrs[0]), TLSPort: certstest.PortOf(t, addrs[0])})
			host := "proc.fleet.test"

			ready := make(chan int, edges)
			for i := range edges {
				stops = append(stops, startFleetChild(t, i, files[i], fleetChild{
					Node: n.URL(), CA: pb.DirectoryURL, CARoot: string(pb.RootPEM), Dir: t.TempDir(), Names: []string{host},
				}, ready))
			}
			deadline := time.After(30 * time.Second)
			for range edges {
				select {
				case <-ready:
				case <-deadline:
					t.Fatal("edge processes not ready after 30s")
				}
			}

			roots := pb.IssuerRoots(t)
			type result struct {
				serial string
				err    error
			}
			results := make(chan result, edges)
			go1 := make(chan struct{})
			for _, addr := range addrs {
				go func() {
					<-go1
					conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 60 * time.Second}, "tcp", addr, &tls.Config{
						ServerName: host, RootCAs: roots, SessionTicketsDisabled: true,
					})
					if err != nil {
						results <- result{err: err}
						return
					}
					defer conn.Close()
					results <- result{serial: conn.ConnectionState().PeerCertificates[0].SerialNumber.Text(16)}
				}()
			}
			close(go1)
			serials := map[string]int{}
			for i := range edges {
				r := <-results
				if r.err != nil {
					t.Errorf("handshake %d: %v", i, r.err)
					continue
				}
				serials[r.serial]++
			}
			pb.WaitOrderCount(t, 1)
			t.Logf("ACME orders for %d edge processes asking for one name at once: %d (serials served: %v)", edges, pb.OrderCount(), serials)
			if got := pb.OrderCount(); got != 1 {
				t.Errorf("Pebble saw %d orders, want 1", got)
			}
			if len(serials) != 1 {
				t.Errorf("edges serve %d different certificates, want one", len(serials))
			}
		})
	}
}

// startFleetChild runs edge i as a copy of this test binary, sending i on
// ready once it serves. The returned func stops it and waits for it to
// exit; its output is logged if t has failed.
func startFleetChild(t *testing.T, i int, files []*os.File, cfg fleetChild, ready chan<- int) func() {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^TestFleetEdgeProcess$", "-test.count=1", "-test.timeout=3m")
	// The child inherits certstest.PebbleDirEnv from this process's
	// TestMain, so it uses the Pebble built here instead of building it.
	cmd.Env = append(os.Environ(), fleetChildEnv+"="+string(raw))
	cmd.ExtraFiles = files
	var output testsupport.SyncBuffer
	cmd.Stderr = &output
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start edge %d: %v", i, err)
	}
	for _, f := range files {
		f.Close() // the child has its own copies
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "fleet-edge-ready" {
				ready <- i
				continue
			}
			fmt.Fprintln(&output, sc.Text())
		}
	}()
	return func() {
		stdin.Close() // the edge shuts down
		exited := make(chan error, 1)
		go func() { <-scanned; exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("edge %d exited: %v", i, err)
			}
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("edge %d did not stop within 15s of its stdin closing", i)
		}
		if t.Failed() {
			t.Logf("edge %d output:\n%s", i, output.String())
		}
	}
}
