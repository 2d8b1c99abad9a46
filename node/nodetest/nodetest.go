// Package nodetest runs an in-process Scafo node for tests and the demo: a
// real HTTP server on loopback that serves GET /v1/ingress/routes as
// routing-and-ingress.md describes it (bearer token, ?prefer= reordering,
// 503 draining before the first reconcile pass, ETag/If-None-Match), with
// switches to make it fail in each way a real node can. It also serves the
// node's certificate storage surface (/v1/storage: objects, list, stat and
// try-only locks, as node.StorageClient calls it), kept in memory across
// Stop and Restart, with its own failure switches and counters.
//
// Every test in the project that needs a node uses this one:
//
//	n := nodetest.New(t, nodetest.Options{Token: "tok", ID: "vps-a"})
//	n.SetDocument(doc)       // the first pass: stops answering 503 draining
//	n.SetStatus(500)         // every poll now fails with 500 ...
//	n.SetStatus(0)           // ... and now it does not
//	n.Stop(); n.Restart()    // connection refused, then back on the same port
//	n.SetStorageStatus(503)  // the storage surface fails; routes are unaffected
//	n.StorageCounts()        // what the storage surface was asked
//
// All methods are safe from any goroutine.
package nodetest

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/node"
)

// Options configure a Node.
type Options struct {
	// Token is the ingress bearer token the node requires. Empty: every
	// request is accepted without one.
	Token string
	// ID is this node's id: ?prefer=self puts the upstreams whose node is
	// ID first. Empty: "self".
	ID string
	// Addr is the listen address. Empty: 127.0.0.1 on a free port.
	Addr string
}

// Request is what the node saw of a routes request.
type Request struct {
	Method string
	Path   string
	Query  url.Values
	Header http.Header
}

// Garbage is the body served by SetGarbage(true): a truncated document, as
// a proxy that cut the connection would leave it.
const Garbage = `{"v": 1, "routes": [{"host": "cut.example", "upst`

// Node is a running test node. Create it with New or Start.
type Node struct {
	opts Options
	addr string // fixed across Stop/Restart
	mux  *http.ServeMux

	mu       sync.Mutex
	srv      *httptest.Server // nil while stopped
	stop     chan struct{}    // closed by Stop, wakes delayed handlers
	doc      *node.Document   // nil when body is raw
	body     []byte           // raw body (SetBody)
	draining bool
	status   int
	delay    time.Duration
	garbage  bool
	noETag   bool
	token    string
	requests int
	last     Request

	st *storage // the /v1/storage surface; set once by Start, survives Stop
}

// New starts a Node and stops it when the test ends. It fails the test if
// the node cannot start.
func New(t testing.TB, opts Options) *Node {
	t.Helper()
	n, err := Start(opts)
	if err != nil {
		t.Fatalf("start test node: %v", err)
	}
	t.Cleanup(n.Close)
	return n
}

// Start starts a Node; Close stops it. A new node has no document and
// answers 503 draining until SetDocument or SetBody.
func Start(opts Options) (*Node, error) {
	if opts.ID == "" {
		opts.ID = "self"
	}
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	n := &Node{opts: opts, token: opts.Token, draining: true, mux: http.NewServeMux()}
	n.mux.HandleFunc("GET "+node.RoutesPath, n.serveRoutes)
	n.registerStorage(n.mux)

	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	n.addr = ln.Addr().String()
	n.serve(ln)
	return n, nil
}

func (n *Node) serve(ln net.Listener) {
	srv := httptest.NewUnstartedServer(n.mux)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	n.mu.Lock()
	n.srv = srv
	n.stop = make(chan struct{})
	n.mu.Unlock()
}

// URL is the node's base URL, e.g. "http://127.0.0.1:40123"; it stays the
// same across Stop and Restart.
func (n *Node) URL() string { return "http://" + n.addr }

// SetDocument serves doc from now on, reordered per request by ?prefer=,
// and ends draining (the node's first reconcile pass is done). A nil
// Routes is served as [] so that a literal Document{V: 1} is the empty
// fleet; use SetBody to serve a document without routes.
func (n *Node) SetDocument(doc *node.Document) {
	c := *doc
	if c.Routes == nil {
		c.Routes = []node.Route{}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.doc, n.body, n.draining = &c, nil, false
}

// SetBody serves body verbatim (no prefer reordering) from now on, and
// ends draining: for documents a Document cannot express, broken ones
// included.
func (n *Node) SetBody(body []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.doc, n.body, n.draining = nil, append([]byte(nil), body...), false
}

// SetDraining switches the 503 draining answer a node gives before its
// first reconcile pass.
func (n *Node) SetDraining(on bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.draining = on
}

// SetStatus answers every routes request with code and a short body,
// before checking the token; 0 restores normal service.
func (n *Node) SetStatus(code int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.status = code
}

// SetDelay holds every routes request for d before answering (a client
// that gives up, or Stop, ends the wait); 0 restores.
func (n *Node) SetDelay(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.delay = d
}

// SetGarbage serves Garbage with 200 instead of the document while on.
func (n *Node) SetGarbage(on bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.garbage = on
}

// SetETag switches ETag and If-None-Match support (on by default). Off, the
// node never sends an ETag and never answers 304.
func (n *Node) SetETag(on bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.noETag = !on
}

// SetToken changes the token the node requires (empty: none).
func (n *Node) SetToken(tok string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.token = tok
}

// Requests is the number of routes requests received, answered or not.
func (n *Node) Requests() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.requests
}

// LastRequest is the last routes request received.
func (n *Node) LastRequest() Request {
	n.mu.Lock()
	defer n.mu.Unlock()
	r := n.last
	r.Header = r.Header.Clone()
	r.Query = url.Values(http.Header(r.Query).Clone())
	return r
}

// WaitRequests waits until the node has received at least count routes
// requests, failing the test after 10 seconds.
func (n *Node) WaitRequests(t testing.TB, count int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n.Requests() < count {
		if time.Now().After(deadline) {
			t.Fatalf("test node: %d routes requests after 10s, want %d", n.Requests(), count)
		}
		time.Sleep(2 * time.Millisecond) // polling a counter, not synchronising on time
	}
}

// Stop closes the listener and every connection: polls are refused until
// Restart. Stopping a stopped node does nothing.
func (n *Node) Stop() {
	n.mu.Lock()
	srv, stop := n.srv, n.stop
	n.srv = nil
	n.mu.Unlock()
	if srv == nil {
		return
	}
	close(stop)
	srv.CloseClientConnections()
	srv.Close()
}

// Restart listens again on the same address after Stop, retrying for a
// second in case the port is briefly still held. Restarting a running
// node does nothing.
func (n *Node) Restart() error {
	n.mu.Lock()
	running := n.srv != nil
	n.mu.Unlock()
	if running {
		return nil
	}
	var ln net.Listener
	var err error
	for deadline := time.Now().Add(time.Second); ; {
		if ln, err = net.Listen("tcp", n.addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("restart test node on %s: %w", n.addr, err)
	}
	n.serve(ln)
	return nil
}

// Close stops the node for good.
func (n *Node) Close() { n.Stop() }

func (n *Node) serveRoutes(w http.ResponseWriter, r *http.Request) {
	n.mu.Lock()
	n.requests++
	n.last = Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(), Header: r.Header.Clone()}
	delay, stop := n.delay, n.stop
	n.mu.Unlock()

	if !hold(r, delay, stop) {
		return
	}

	n.mu.Lock()
	status, draining, garbage, noETag := n.status, n.draining, n.garbage, n.noETag
	doc, raw := n.doc, n.body
	n.mu.Unlock()

	switch {
	case status != 0:
		http.Error(w, fmt.Sprintf("test node: forced status %d", status), status)
		return
	case !authorized(w, r, n.currentToken()):
		return
	case draining:
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"draining"}` + "\n"))
		return
	case garbage:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(Garbage))
		return
	}

	body := raw
	if doc != nil {
		var err error
		if body, err = json.Marshal(reorder(doc, n.preferred(r.URL.Query()))); err != nil {
			http.Error(w, "test node: marshal document: "+err.Error(), http.StatusInternalServerError)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if !noETag {
		etag := `"` + node.Fingerprint(body) + `"`
		w.Header().Set("ETag", etag)
		if matchETag(r.Header.Get("If-None-Match"), etag) {
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	_, _ = w.Write(body)
}

// hold waits delay before a handler answers r, and reports whether it
// should: a client that gives up, or Stop (closing stop), ends the wait.
func hold(r *http.Request, delay time.Duration, stop <-chan struct{}) bool {
	if delay <= 0 {
		return true
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	case <-stop:
		return false
	}
}

// preferred is the node id ?prefer= names: "self" is this node, an absent
// or empty parameter is nobody.
func (n *Node) preferred(q url.Values) string {
	switch p := q.Get("prefer"); p {
	case "self":
		return n.opts.ID
	default:
		return p
	}
}

// authorized reports whether r bears token (any request does when token
// is empty), answering 401 itself when it does not. Every surface of the
// node sits behind the same ingress token.
func authorized(w http.ResponseWriter, r *http.Request, token string) bool {
	if token == "" {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
		return true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="scafo"`)
	http.Error(w, "unauthorized", http.StatusUnauthorized)
	return false
}

// currentToken is the token the node requires now.
func (n *Node) currentToken() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.token
}

// matchETag implements If-None-Match's weak comparison (RFC 9110 §13.1.2).
func matchETag(header, etag string) bool {
	for c := range strings.SplitSeq(header, ",") {
		c = strings.TrimPrefix(strings.TrimSpace(c), "W/")
		if c == "*" || c == etag {
			return true
		}
	}
	return false
}

// reorder returns doc with the upstreams of node id first on every route
// and in api.upstreams, the others keeping their order
// (routing-and-ingress.md, "Upstream order and prefer"). An id nobody
// matches has no effect. doc itself is not modified.
func reorder(doc *node.Document, id string) *node.Document {
	if id == "" {
		return doc
	}
	c := *doc
	c.Routes = make([]node.Route, len(doc.Routes))
	for i, r := range doc.Routes {
		r.Upstreams = preferFirst(r.Upstreams, id)
		c.Routes[i] = r
	}
	if doc.API != nil {
		api := *doc.API
		api.Upstreams = preferFirst(api.Upstreams, id)
		c.API = &api
	}
	return &c
}

func preferFirst(ups []node.Upstream, id string) []node.Upstream {
	if ups == nil {
		return nil
	}
	out := make([]node.Upstream, 0, len(ups))
	for _, u := range ups {
		if u.Node == id {
			out = append(out, u)
		}
	}
	for _, u := range ups {
		if u.Node != id {
			out = append(out, u)
		}
	}
	return out
}
