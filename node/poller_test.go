package node_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

const interval = 20 * time.Millisecond

type pollerSetup struct {
	n    *nodetest.Node
	p    *node.Poller
	logs *testsupport.SyncBuffer
	reg  *prometheus.Registry
}

// newPoller starts a test node with token "tok" and id "vps-b" serving doc
// (nil: draining), and a poller against it; edit tweaks the options.
func newPoller(t *testing.T, doc *node.Document, edit func(*node.PollerOptions)) pollerSetup {
	t.Helper()
	s := pollerSetup{
		n:    nodetest.New(t, nodetest.Options{Token: "tok", ID: "vps-b"}),
		logs: &testsupport.SyncBuffer{},
		reg:  prometheus.NewPedanticRegistry(),
	}
	if doc != nil {
		s.n.SetDocument(doc)
	}
	opts := node.PollerOptions{
		Node:       s.n.URL(),
		Token:      "tok",
		Interval:   interval,
		Timeout:    2 * time.Second,
		Log:        zerolog.New(s.logs),
		Registerer: s.reg,
	}
	if edit != nil {
		edit(&opts)
	}
	var err error
	if s.p, err = node.NewPoller(opts); err != nil {
		t.Fatalf("NewPoller: %v", err)
	}
	return s
}

func TestPollerSendsTokenAndPreferAndAppliesTheDocument(t *testing.T) {
	for _, tc := range []struct {
		name      string
		prefer    string
		wantQuery string // "" means no prefer parameter at all
		wantFirst string // node first on every route and in api.upstreams
	}{
		{"the default prefers the answering node", "", "self", "vps-b"},
		{"self prefers the answering node", "self", "self", "vps-b"},
		{"a node id goes first", "vps-c", "vps-c", "vps-c"},
		{"an id nobody matches keeps the fleet's order", "vps-z", "vps-z", "vps-a"},
		{"none sends no prefer and keeps the fleet's order", "none", "", "vps-a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newPoller(t, testDoc("shop.apps.example.com", "blog.apps.example.com"), func(o *node.PollerOptions) { o.Prefer = tc.prefer })
			u := next(t, run(t, s.p, nil))

			req := s.n.LastRequest()
			if got := req.Header.Get("Authorization"); got != "Bearer tok" {
				t.Errorf("Authorization = %q, want %q", got, "Bearer tok")
			}
			if req.Path != node.RoutesPath {
				t.Errorf("path = %q, want %q", req.Path, node.RoutesPath)
			}
			if got, ok := req.Query["prefer"]; tc.wantQuery == "" && ok || tc.wantQuery != "" && (len(got) != 1 || got[0] != tc.wantQuery) {
				t.Errorf("prefer = %q (present %v), want %q", got, ok, tc.wantQuery)
			}
			if req.Header.Get("If-None-Match") != "" {
				t.Errorf("first poll sent If-None-Match %q with no document held", req.Header.Get("If-None-Match"))
			}
			for _, r := range u.Doc.Routes {
				if r.Upstreams[0].Node != tc.wantFirst {
					t.Errorf("route %s upstreams = %v, want %s first", r.Host, nodes(r.Upstreams), tc.wantFirst)
				}
			}
			if got := u.Doc.API.Upstreams[0].Node; got != tc.wantFirst && !(tc.wantFirst == "vps-c" && got == "vps-a") {
				// vps-c has no API upstream: the order stays the fleet's.
				t.Errorf("api upstreams = %v, want %s first", nodes(u.Doc.API.Upstreams), tc.wantFirst)
			}
			if u.Stale || u.Fingerprint != node.Fingerprint(u.Body) || u.FetchedAt.IsZero() {
				t.Errorf("update = stale %v, fingerprint %.12s of body %.12s, fetched %v", u.Stale, u.Fingerprint, node.Fingerprint(u.Body), u.FetchedAt)
			}
		})
	}
}

func TestPollerSendsIfNoneMatchAndAccepts304(t *testing.T) {
	s := newPoller(t, testDoc("a.example"), nil)
	updates := run(t, s.p, nil)
	u := next(t, updates)
	s.n.WaitRequests(t, 4)
	none(t, updates)
	if got, want := s.n.LastRequest().Header.Get("If-None-Match"), `"`+u.Fingerprint+`"`; got != want {
		t.Errorf("If-None-Match = %q, want %q", got, want)
	}
	if v, _ := testsupport.MetricValue(t, s.reg, "scafo_edge_routing_polls_total", testsupport.Labels{"result": "not_modified"}); v < 2 {
		t.Errorf("not_modified polls = %v, want at least 2", v)
	}
	if st := s.p.Status(); st.ConsecutiveFailures != 0 || st.LastError != "" || st.Fingerprint != u.Fingerprint {
		t.Errorf("status = %+v", st)
	}
}

func TestPollerDoesNotApplyAnUnchangedBody(t *testing.T) {
	s := newPoller(t, testDoc("a.example"), nil)
	s.n.SetETag(false) // the node answers 200 with the same body every poll
	updates := run(t, s.p, nil)
	next(t, updates)
	s.n.WaitRequests(t, 4)
	none(t, updates)
	if v, _ := testsupport.MetricValue(t, s.reg, "scafo_edge_routing_polls_total", testsupport.Labels{"result": "unchanged"}); v < 2 {
		t.Errorf("unchanged polls = %v, want at least 2", v)
	}
	if v, _ := testsupport.MetricValue(t, s.reg, "scafo_edge_routing_document_changes_total", nil); v != 1 {
		t.Errorf("document changes = %v, want 1", v)
	}
}

func TestPollerAppliesAChangeWithinTwoPolls(t *testing.T) {
	s := newPoller(t, testDoc("a.example"), nil)
	servedBy := make(chan int, 10)
	updates := make(chan node.Update, 10)
	runApply(t, s.p, nil, func(u node.Update) {
		// Polls are sequential: while apply runs, the request that carried
		// this document is the last one the node has seen.
		servedBy <- s.n.Requests()
		updates <- u
	})
	next(t, updates)
	<-servedBy
	s.n.WaitRequests(t, 3)

	before := s.n.Requests()
	changed := time.Now()
	s.n.SetDocument(testDoc("a.example", "b.example"))
	u := next(t, updates)
	took := time.Since(changed)
	// The poll in flight when the document changed may carry the old one;
	// the one after it must carry the new one.
	if by := <-servedBy; by > before+1 {
		t.Errorf("change carried by request %d, want at most %d (two polls)", by, before+1)
	}
	if !slices.Equal(hosts(u.Doc), []string{"a.example", "b.example"}) {
		t.Errorf("hosts = %v", hosts(u.Doc))
	}
	t.Logf("change applied %v after it was made (interval %v)", took, interval)
}

func TestPollerKeepsTheLastGoodDocument(t *testing.T) {
	tooBig := testDoc("a.example", "b.example")
	for i := range 200 {
		tooBig.Routes = append(tooBig.Routes, node.Route{Host: fmt.Sprintf("h%d.example", i), Application: "x", Upstreams: []node.Upstream{}})
	}
	for _, tc := range []struct {
		name       string
		result     string // the polls_total result label
		errContain string
		level      string // of the failure log line
		fail, heal func(s pollerSetup)
	}{
		{
			name: "a 503 draining node", result: "draining", errContain: "503", level: "warn",
			fail: func(s pollerSetup) { s.n.SetDraining(true) },
			heal: func(s pollerSetup) { s.n.SetDraining(false) },
		},
		{
			name: "a rejected token is a 401 said plainly", result: "unauthorized", errContain: "rejected the ingress token (401", level: "error",
			fail: func(s pollerSetup) { s.n.SetToken("rotated") },
			heal: func(s pollerSetup) { s.n.SetToken("tok") },
		},
		{
			name: "a 403", result: "unauthorized", errContain: "rejected the ingress token (403", level: "error",
			fail: func(s pollerSetup) { s.n.SetStatus(http.StatusForbidden) },
			heal: func(s pollerSetup) { s.n.SetStatus(0) },
		},
		{
			name: "a 500", result: "http_error", errContain: "500 Internal Server Error", level: "warn",
			fail: func(s pollerSetup) { s.n.SetStatus(http.StatusInternalServerError) },
			heal: func(s pollerSetup) { s.n.SetStatus(0) },
		},
		{
			name: "a 502 from a proxy in front", result: "http_error", errContain: "502", level: "warn",
			fail: func(s pollerSetup) { s.n.SetStatus(http.StatusBadGateway) },
			heal: func(s pollerSetup) { s.n.SetStatus(0) },
		},
		{
			name: "a 404 from the wrong daemon", result: "http_error", errContain: "404", level: "warn",
			fail: func(s pollerSetup) { s.n.SetStatus(http.StatusNotFound) },
			heal: func(s pollerSetup) { s.n.SetStatus(0) },
		},
		{
			name: "a node that answers after the timeout", result: "timeout", errContain: "deadline exceeded", level: "warn",
			fail: func(s pollerSetup) { s.n.SetDelay(time.Hour) },
			heal: func(s pollerSetup) { s.n.SetDelay(0) },
		},
		{
			name: "a refused connection", result: "unreachable", errContain: "connection refused", level: "warn",
			fail: func(s pollerSetup) { s.n.Stop() },
			heal: func(s pollerSetup) {
				if err := s.n.Restart(); err != nil {
					panic(err)
				}
			},
		},
		{
			name: "a garbage body", result: "invalid", errContain: "decode json", level: "warn",
			fail: func(s pollerSetup) { s.n.SetGarbage(true) },
			heal: func(s pollerSetup) { s.n.SetGarbage(false) },
		},
		{
			name: "an invalid document", result: "invalid", errContain: "v is 2", level: "warn",
			fail: func(s pollerSetup) { s.n.SetBody([]byte(`{"v":2,"routes":[]}`)) },
			heal: func(s pollerSetup) {},
		},
		{
			name: "a document over the size limit", result: "too_large", errContain: "byte limit", level: "warn",
			fail: func(s pollerSetup) { s.n.SetDocument(tooBig) },
			heal: func(s pollerSetup) {},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newPoller(t, testDoc("a.example"), func(o *node.PollerOptions) {
				// Short only where a timeout is the point: elsewhere a slow
				// CI machine must not add a timeout to the failure under test.
				if tc.result == "timeout" {
					o.Timeout = 100 * time.Millisecond
				}
				o.MaxSize = 4 << 10
			})
			updates := run(t, s.p, nil)
			good := next(t, updates)

			tc.fail(s)
			testsupport.WaitFor(t, 10*time.Second, "three failed polls", func() bool { return s.p.Status().ConsecutiveFailures >= 3 })
			none(t, updates)
			st := s.p.Status()
			if st.Fingerprint != good.Fingerprint {
				t.Errorf("status fingerprint = %.12s, want the last good %.12s", st.Fingerprint, good.Fingerprint)
			}
			if !strings.Contains(st.LastError, tc.errContain) {
				t.Errorf("last error = %q, want it to contain %q", st.LastError, tc.errContain)
			}
			if v, _ := testsupport.MetricValue(t, s.reg, "scafo_edge_routing_polls_total", testsupport.Labels{"result": tc.result}); v < 3 {
				t.Errorf("polls_total{result=%q} = %v, want at least 3", tc.result, v)
			}
			if v, _ := testsupport.MetricValue(t, s.reg, "scafo_edge_routing_consecutive_failures", nil); v < 3 {
				t.Errorf("consecutive failures gauge = %v, want at least 3", v)
			}
			fails := s.logs.LogEntries("poll failed")
			if len(fails) != 1 {
				t.Fatalf("%d failure log lines over %d failed polls, want 1:\n%s", len(fails), st.ConsecutiveFailures, s.logs)
			}
			if fails[0]["level"] != tc.level || fails[0]["result"] != tc.result || !strings.Contains(fails[0]["message"].(string), "keeping the last good document") {
				t.Errorf("failure log = %v, want level %s, result %s, keeping the last good document", fails[0], tc.level, tc.result)
			}

			tc.heal(s)
			s.n.SetDocument(testDoc("a.example", "b.example"))
			u := next(t, updates)
			if !slices.Equal(hosts(u.Doc), []string{"a.example", "b.example"}) {
				t.Errorf("after recovery hosts = %v", hosts(u.Doc))
			}
			at := s.n.Requests()
			s.n.WaitRequests(t, at+2)
			if got := s.logs.LogEntries("recovered"); len(got) != 1 {
				t.Errorf("%d recovery log lines, want 1:\n%s", len(got), s.logs)
			}
			if st := s.p.Status(); st.ConsecutiveFailures != 0 || st.LastError != "" {
				t.Errorf("status after recovery = %+v", st)
			}
		})
	}
}

func TestPollerLogsAgainWhenTheCauseChanges(t *testing.T) {
	s := newPoller(t, testDoc("a.example"), nil)
	updates := run(t, s.p, nil)
	next(t, updates)

	s.n.SetStatus(500)
	testsupport.WaitFor(t, 10*time.Second, "failures", func() bool { return s.p.Status().ConsecutiveFailures >= 2 })
	s.n.SetStatus(0)
	s.n.SetBody([]byte(`{"v":1}`))
	testsupport.WaitFor(t, 10*time.Second, "an invalid document", func() bool { return strings.Contains(s.p.Status().LastError, "routes is missing") })
	n := s.p.Status().ConsecutiveFailures
	testsupport.WaitFor(t, 10*time.Second, "more failures", func() bool { return s.p.Status().ConsecutiveFailures >= n+2 })
	s.n.SetBody([]byte(`{"v":1,"routes":null}`)) // another broken document
	testsupport.WaitFor(t, 10*time.Second, "another failure", func() bool { return s.p.Status().ConsecutiveFailures >= n+4 })

	if got := s.logs.LogEntries("poll failed"); len(got) != 3 {
		t.Errorf("%d failure lines, want 3 (500, one broken document, another):\n%s", len(got), s.logs)
	}
	none(t, updates)
}

func TestPollerBeforeTheFirstDocument(t *testing.T) {
	s := newPoller(t, nil, nil) // a node before its first pass answers 503
	updates := run(t, s.p, nil)
	testsupport.WaitFor(t, 10*time.Second, "failed polls", func() bool { return s.p.Status().ConsecutiveFailures >= 3 })
	none(t, updates)
	if st := s.p.Status(); st.Fingerprint != "" || !st.LastSuccess.IsZero() {
		t.Errorf("status = %+v, want no document and no success", st)
	}
	if got := s.logs.LogEntries("no document yet"); len(got) != 1 {
		t.Errorf("%d 'no document yet' lines, want 1:\n%s", len(got), s.logs)
	}
	if v, ok := testsupport.MetricValue(t, s.reg, "scafo_edge_routing_seconds_since_last_good", nil); !ok || v != -1 {
		t.Errorf("seconds since last good = %v (present %v), want -1 with no document", v, ok)
	}
	s.n.SetDocument(testDoc("a.example"))
	u := next(t, updates)
	if got, _ := testsupport.MetricValue(t, s.reg, "scafo_edge_routing_document_info", testsupport.Labels{"fingerprint": u.Fingerprint}); got != 1 {
		t.Errorf("document_info{fingerprint=%.12s} = %v, want 1", u.Fingerprint, got)
	}
}

func TestPollerWithASeed(t *testing.T) {
	doc := testDoc("a.example")
	t.Run("the node serving the same document sends nothing on", func(t *testing.T) {
		s := newPoller(t, doc, func(o *node.PollerOptions) { o.Prefer = "none" })
		s.n.SetETag(false)
		body, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		seed := &node.Update{Doc: doc, Body: body, Fingerprint: node.Fingerprint(body), FetchedAt: time.Now().Add(-time.Hour), Stale: true}
		updates := run(t, s.p, seed)
		s.n.WaitRequests(t, 1)
		if got, want := s.n.LastRequest().Header.Get("If-None-Match"), `"`+seed.Fingerprint+`"`; got != want {
			t.Errorf("first If-None-Match = %q, want the seed's %q", got, want)
		}
		testsupport.WaitFor(t, 10*time.Second, "the seed confirmed", func() bool { return !s.p.Status().Stale })
		s.n.WaitRequests(t, 3)
		none(t, updates)
	})
	t.Run("the node down keeps the seed, stale", func(t *testing.T) {
		s := newPoller(t, doc, nil)
		s.n.Stop()
		seed := &node.Update{Doc: doc, Body: []byte(`{"v":1,"routes":[]}`), Fingerprint: node.Fingerprint([]byte(`{"v":1,"routes":[]}`)),
			FetchedAt: time.Now().Add(-time.Hour), Stale: true}
		updates := run(t, s.p, seed)
		testsupport.WaitFor(t, 10*time.Second, "failures", func() bool { return s.p.Status().ConsecutiveFailures >= 2 })
		none(t, updates)
		st := s.p.Status()
		if !st.Stale || st.Fingerprint != seed.Fingerprint {
			t.Errorf("status = %+v, want the seed, stale", st)
		}
		if v, _ := testsupport.MetricValue(t, s.reg, "scafo_edge_routing_stale", nil); v != 1 {
			t.Errorf("stale gauge = %v, want 1", v)
		}
		if v, _ := testsupport.MetricValue(t, s.reg, "scafo_edge_routing_seconds_since_last_good", nil); v < 3600 {
			t.Errorf("seconds since last good = %v, want the seed's age (over 3600)", v)
		}
	})
}

func TestNewPollerRefusesBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts node.PollerOptions
	}{
		{"no node", node.PollerOptions{}},
		{"a node without a scheme", node.PollerOptions{Node: "127.0.0.1:7400"}},
		{"a node with a query", node.PollerOptions{Node: "http://127.0.0.1:7400?x=1"}},
		{"a token with a line break", node.PollerOptions{Node: "http://127.0.0.1:7400", Token: "a\nb"}},
		{"a size limit above the document limit", node.PollerOptions{Node: "http://127.0.0.1:7400", MaxSize: node.MaxDocumentSize + 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := node.NewPoller(tc.opts); err == nil {
				t.Error("NewPoller succeeded, want an error")
			}
		})
	}
	t.Run("metrics registered twice", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		opts := node.PollerOptions{Node: "http://127.0.0.1:7400", Registerer: reg}
		if _, err := node.NewPoller(opts); err != nil {
			t.Fatal(err)
		}
		if _, err := node.NewPoller(opts); err == nil {
			t.Error("second NewPoller on one registry succeeded, want a registration error")
		}
	})
}

func TestPollerRunReturnsWhenTheContextEnds(t *testing.T) {
	s := newPoller(t, testDoc("a.example"), nil)
	s.n.SetDelay(time.Hour) // Run is blocked in a poll when the context ends
	run(t, s.p, nil)
	s.n.WaitRequests(t, 1)
	// run's cleanup cancels and fails the test if Run does not return.
}
