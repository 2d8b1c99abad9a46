package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/admission"
	"github.com/scafo/scafo-edge/backhaul"
	"github.com/scafo/scafo-edge/certs"
	"github.com/scafo/scafo-edge/certs/prefetch"
	"github.com/scafo/scafo-edge/edge"
	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// fakeSource is a node.Source whose status the test sets.
type fakeSource struct{ st node.PollStatus }

func (f *fakeSource) Run(ctx context.Context, _ *node.Update, _ func(node.Update)) { <-ctx.Done() }
func (f *fakeSource) Status() node.PollStatus                                      { return f.st }

var _ node.Source = (*fakeSource)(nil)

// statusT0 is the fixed "now" of the status tests.
var statusT0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const statusToken = "s3cret-ingress-token"

// statusFixture is an admin server over a compiled table: a plain host whose
// first upstream refuses connections (so backhaul has ejected it), a
// wildcard, a path-routed host, its targets, and an API apex.
type statusFixture struct {
	admin    *Server
	deadAddr string // first upstream of shop.example.test, refusing
	liveAddr string // second upstream, a real server
}

func newStatusFixture(t *testing.T, extra ...node.Route) *statusFixture {
	t.Helper()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "upstream\n")
	}))
	t.Cleanup(upstream.Close)
	dead := testsupport.ClosedAddr(t)
	live := upstream.Listener.Addr().String()

	doc := &node.Document{
		V: 1,
		Routes: append([]node.Route{
			{Host: "shop.example.test", Application: "shop", Upstreams: []node.Upstream{
				{Node: "box-down", Address: dead}, {Node: "box-a", Address: live}}},
			{Host: "*.tenant.example.test", Application: "tenant", Upstreams: []node.Upstream{
				{Node: "box-b", Address: "10.1.0.7:8080"}}},
			{Host: "classic.example.test", Application: "classic", Upstreams: []node.Upstream{
				{Node: "box-a", Address: "10.1.0.5:8080"}},
				Paths: map[string]string{"paulca": "go.example.test", "beta": "shop.example.test"}},
			{Host: "go.example.test", Application: "tito-go", Upstreams: []node.Upstream{
				{Node: "box-b", Address: "10.1.0.6:9000"}}},
		}, extra...),
		API: &node.API{
			Hosts:     []string{"api.example.test", "platform.example.test"},
			Upstreams: []node.Upstream{{Node: "box-a", Address: "10.1.0.5:7400"}},
			Denied:    []string{"/v1/storage", "/v1/ingress/routes", "/v1/secrets"},
		},
	}
	if _, drops := edge.Compile(doc); len(drops) > 0 {
		t.Fatalf("fixture document has drops: %v", drops)
	}
	live0 := &edge.Live{}
	testsupport.Must(edge.NewUpdater(live0, zerolog.Nop(), nil)).Apply(node.Update{
		Doc: doc, Fingerprint: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		FetchedAt: statusT0.Add(-90 * time.Second),
	})

	// One request through backhaul: box-down refuses, box-a answers, so
	// the health the page shows is backhaul's own, not made up.
	proxy := testsupport.Must(backhaul.New(backhaul.Options{EjectBase: time.Minute, Clock: clock.NewFake(statusT0)}))
	t.Cleanup(proxy.Close)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "http://shop.example.test/", nil)
	if _, err := proxy.Forward(rec, req, live0.Load().Routes()[0].Upstreams); err != nil {
		t.Fatalf("Forward through the fixture's upstreams: %v", err)
	}

	return &statusFixture{
		admin: &Server{
			Live: live0,
			Source: &fakeSource{st: node.PollStatus{
				Source:              "node http://127.0.0.1:7400",
				LastAttempt:         statusT0.Add(-2 * time.Second),
				LastSuccess:         statusT0.Add(-7 * time.Second),
				LastChange:          statusT0.Add(-90 * time.Second),
				LastError:           "poll: connection refused",
				ConsecutiveFailures: 1,
			}},
			Registry: prometheus.NewRegistry(),
			Proxy:    proxy,
			Token:    statusToken,
			Started:  statusT0.Add(-time.Hour),
			Clock:    clock.NewFake(statusT0),
		},
		deadAddr: dead,
		liveAddr: live,
	}
}

func serveAdmin(h http.Handler, path, remote, token string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("GET", "http://admin"+path, nil)
	req.RemoteAddr = remote
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestAdminSurfacesThatRevealAddressesArePrivileged(t *testing.T) {
	f := newStatusFixture(t)
	h := f.admin.Handler()
	private := []string{"/", "/status.json", "/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/goroutine?debug=1"}
	cases := []struct {
		name   string
		remote string
		token  string
		want   int
	}{
		{"a loopback client needs no token", "127.0.0.1:50000", "", 200},
		{"an IPv6 loopback client needs no token", "[::1]:50000", "", 200},
		{"a remote client without the token is refused", "203.0.113.9:50000", "", 403},
		{"a remote client with a wrong token is refused", "203.0.113.9:50000", "not-the-token", 403},
		{"a remote client with the ingress token is served", "203.0.113.9:50000", statusToken, 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, p := range private {
				rec := serveAdmin(h, p, tc.remote, tc.token)
				if rec.Code != tc.want {
					t.Errorf("GET %s from %s = %d, want %d", p, tc.remote, rec.Code, tc.want)
				}
				if rec.Code == 403 && strings.Contains(rec.Body.String(), f.liveAddr) {
					t.Errorf("GET %s: the refusal reveals an upstream address: %q", p, rec.Body)
				}
			}
		})
	}
	t.Run("without a configured token a remote client is refused whatever it sends", func(t *testing.T) {
		a := *f.admin
		a.Token = ""
		h := a.Handler()
		for _, tok := range []string{"", "anything"} {
			if rec := serveAdmin(h, "/status.json", "203.0.113.9:50000", tok); rec.Code != 403 {
				t.Errorf("GET /status.json with token %q = %d, want 403", tok, rec.Code)
			}
		}
	})
	t.Run("health stays open to a remote client (metrics: access_test.go)", func(t *testing.T) {
		for _, p := range []string{"/healthz", "/readyz"} {
			if rec := serveAdmin(h, p, "203.0.113.9:50000", ""); rec.Code != 200 {
				t.Errorf("GET %s from a remote client = %d, want 200", p, rec.Code)
			}
		}
	})
	t.Run("an unknown admin path is not the status page", func(t *testing.T) {
		if rec := serveAdmin(h, "/nope", "127.0.0.1:50000", ""); rec.Code != 404 {
			t.Errorf("GET /nope = %d, want 404", rec.Code)
		}
	})
	t.Run("pprof is not served by the default mux", func(t *testing.T) {
		// The admin mux answers; DefaultServeMux (which importing
		// net/http/pprof fills) is not what any listener serves.
		if rec := serveAdmin(h, "/debug/pprof/", "127.0.0.1:50000", ""); !strings.Contains(rec.Body.String(), "goroutine") {
			t.Errorf("GET /debug/pprof/ did not list profiles: %q", rec.Body.String())
		}
	})
}

func fetchStatusJSON(t *testing.T, a *Server) Status {
	t.Helper()
	rec := serveAdmin(a.Handler(), "/status.json", "127.0.0.1:1", "")
	if rec.Code != 200 {
		t.Fatalf("GET /status.json = %d: %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var v Status
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("decode status.json: %v\n%s", err, rec.Body)
	}
	return v
}

func TestStatusJSONDescribesTheLiveTable(t *testing.T) {
	f := newStatusFixture(t)
	v := fetchStatusJSON(t, f.admin)

	t.Run("document and poll state", func(t *testing.T) {
		d := v.Document
		if d == nil {
			t.Fatal("document is null with a table loaded")
		}
		if d.Fingerprint != "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" || d.AgeSeconds != 90 ||
			d.Routes != 4 || d.PathPrefixes != 2 || d.APIHosts != 2 || d.Stale {
			t.Errorf("document = %+v", *d)
		}
		p := v.Poll
		if p.Source != "node http://127.0.0.1:7400" || p.LastError != "poll: connection refused" || p.ConsecutiveFailures != 1 ||
			p.LastSuccess == nil || !p.LastSuccess.Equal(statusT0.Add(-7*time.Second)) {
			t.Errorf("poll = %+v", p)
		}
	})

	t.Run("document.path_prefixes is the sum of routes[].path_count", func(t *testing.T) {
		sum := 0
		for _, r := range v.Routes {
			sum += r.PathCount
		}
		if v.Document == nil || v.Document.PathPrefixes != sum {
			t.Errorf("document.path_prefixes = %+v, routes' path_count sum to %d", v.Document, sum)
		}
	})
	t.Run("routes in document order with upstreams in priority order and their health", func(t *testing.T) {
		var hosts []string
		for _, r := range v.Routes {
			hosts = append(hosts, r.Host)
		}
		if got, want := strings.Join(hosts, " "), "shop.example.test *.tenant.example.test classic.example.test go.example.test"; got != want {
			t.Fatalf("hosts = %s, want %s", got, want)
		}
		shop := v.Routes[0]
		if len(shop.Upstreams) != 2 {
			t.Fatalf("shop upstreams = %+v", shop.Upstreams)
		}
		down, up := shop.Upstreams[0], shop.Upstreams[1]
		if down.Node != "box-down" || down.Address != f.deadAddr || down.Health != healthEjected || down.Failures != 1 ||
			down.EjectedUntil == nil || !down.EjectedUntil.Equal(statusT0.Add(time.Minute)) {
			t.Errorf("first upstream = %+v, want box-down ejected for a minute after one failure", down)
		}
		if up.Node != "box-a" || up.Health != healthOK {
			t.Errorf("second upstream = %+v, want box-a ok", up)
		}
		if got := v.Routes[3].Upstreams[0].Health; got != healthUntried {
			t.Errorf("an upstream no request used has health %q, want %q", got, healthUntried)
		}
		if !v.Routes[1].Wildcard || v.Routes[0].Wildcard {
			t.Errorf("wildcard flags = %v, %v", v.Routes[1].Wildcard, v.Routes[0].Wildcard)
		}
	})
	t.Run("path prefixes sorted under their host with the target's application", func(t *testing.T) {
		c := v.Routes[2]
		want := []PathStatus{{"beta", "shop.example.test", "shop"}, {"paulca", "go.example.test", "tito-go"}}
		if c.PathCount != 2 || fmt.Sprint(c.Paths) != fmt.Sprint(want) {
			t.Errorf("paths = %d %+v, want %+v", c.PathCount, c.Paths, want)
		}
	})
	t.Run("API hosts with every denied prefix, the mandatory ones included", func(t *testing.T) {
		if v.API == nil {
			t.Fatal("api is null")
		}
		if got := strings.Join(v.API.Hosts, " "); got != "api.example.test platform.example.test" {
			t.Errorf("api hosts = %s", got)
		}
		denied := strings.Join(v.API.Denied, " ")
		for _, d := range []string{"/v1/storage", "/v1/ingress/routes", "/v1/secrets"} {
			if !strings.Contains(denied, d) {
				t.Errorf("denied %q lacks %s", denied, d)
			}
		}
	})
	t.Run("certificates say none while TLS is not wired", func(t *testing.T) {
		if len(v.Certs) != 0 || !strings.HasPrefix(v.CertsNote, "none") {
			t.Errorf("certificates = %+v, note %q", v.Certs, v.CertsNote)
		}
	})
	t.Run("certificates with expiry when the manager reports them", func(t *testing.T) {
		a := *f.admin
		a.Certificates = func() []certs.CertInfo {
			return []certs.CertInfo{
				{Names: []string{"shop.example.test"}, Issuer: "Scafo internal CA", NotAfter: statusT0.Add(60 * 24 * time.Hour)},
				{Names: []string{"go.example.test"}, Issuer: "Scafo internal CA", NotAfter: statusT0.Add(3 * 24 * time.Hour)},
			}
		}
		v := fetchStatusJSON(t, &a)
		if len(v.Certs) != 2 || v.Certs[0].Expiring || !v.Certs[1].Expiring || v.Certs[1].ExpiresIn != "3d0h" {
			t.Errorf("certificates = %+v", v.Certs)
		}
	})
	t.Run("names waiting for a prefetched certificate, one not reaching the fleet", func(t *testing.T) {
		a := *f.admin
		a.Prefetch = prefetchFixture
		v := fetchStatusJSON(t, &a)
		if len(v.Prefetch) != 2 || v.Prefetch[1].State != "unreachable" || v.Prefetch[1].Failures != 3 ||
			!v.Prefetch[1].NextTry.Equal(statusT0.Add(4*time.Minute)) {
			t.Errorf("certificate_prefetch = %+v", v.Prefetch)
		}
		_, page := fetchPage(t, a.Handler(), "/")
		for _, want := range []string{"Waiting for a prefetched certificate", "new.example.test", "dark.example.test", "does not reach this fleet", "answered 404 Not Found"} {
			if !strings.Contains(page, want) {
				t.Errorf("page lacks %q", want)
			}
		}
		if v := fetchStatusJSON(t, f.admin); v.Prefetch != nil {
			t.Errorf("certificate_prefetch with prefetch off = %+v, want absent", v.Prefetch)
		}
	})
	t.Run("names with failed validations at the CA, one held back", func(t *testing.T) {
		a := *f.admin
		a.FailedValidations = func() []certs.ValidationCount {
			return []certs.ValidationCount{
				{Name: "broken.example.test", Failed: 4, HeldUntil: statusT0.Add(40 * time.Minute)},
				{Name: "flaky.example.test", Failed: 1},
			}
		}
		v := fetchStatusJSON(t, &a)
		if len(v.FailedValidations) != 2 || v.FailedValidations[0].LastHour != 4 || v.FailedValidations[0].Limit != certs.FailedValidationLimit ||
			v.FailedValidations[0].HeldUntil == nil || !v.FailedValidations[0].HeldUntil.Equal(statusT0.Add(40*time.Minute)) || v.FailedValidations[1].HeldUntil != nil {
			t.Errorf("failed_validations = %+v", v.FailedValidations)
		}
		_, page := fetchPage(t, a.Handler(), "/")
		for _, want := range []string{"Failed validations at the CA in the last hour", "broken.example.test", "flaky.example.test"} {
			if !strings.Contains(page, want) {
				t.Errorf("page lacks %q", want)
			}
		}
		if v := fetchStatusJSON(t, f.admin); v.FailedValidations != nil {
			t.Errorf("failed_validations without ACME = %+v, want absent", v.FailedValidations)
		}
	})
	t.Run("before the first document the document is null and routes empty", func(t *testing.T) {
		a := *f.admin
		a.Live = &edge.Live{}
		v := fetchStatusJSON(t, &a)
		if v.Document != nil || v.Routes == nil || len(v.Routes) != 0 || v.API != nil {
			t.Errorf("status = %+v", v)
		}
	})
}

// prefetchFixture is a prefetch queue with one name waiting its turn and
// one whose DNS does not reach the fleet yet.
func prefetchFixture() []prefetch.Entry {
	return []prefetch.Entry{
		{Name: "new.example.test", State: prefetch.Waiting, Added: statusT0, Next: statusT0},
		{Name: "dark.example.test", State: prefetch.Unreachable, Added: statusT0.Add(-time.Hour), Next: statusT0.Add(4 * time.Minute),
			Failures: 3, Error: "name does not reach this fleet: answered 404 Not Found"},
	}
}

func fetchPage(t *testing.T, h http.Handler, path string) (*httptest.ResponseRecorder, string) {
	t.Helper()
	rec := serveAdmin(h, path, "127.0.0.1:1", "")
	if rec.Code != 200 {
		t.Fatalf("GET %s = %d: %s", path, rec.Code, rec.Body)
	}
	return rec, rec.Body.String()
}

// pathRow matches a prefix row of the page.
var pathRow = regexp.MustCompile(`<tr class="path"><td class="prefix">/([^<]*)</td>`)

func TestStatusPage(t *testing.T) {
	f := newStatusFixture(t)
	rec, page := fetchPage(t, f.admin.Handler(), "/")

	t.Run("is self-contained HTML without scripts or external assets", func(t *testing.T) {
		if ct := rec.Header().Get("Content-Type"); ct != "text/html; charset=utf-8" {
			t.Errorf("Content-Type = %q", ct)
		}
		csp := rec.Header().Get("Content-Security-Policy")
		if !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("Content-Security-Policy = %q", csp)
		}
		for _, bad := range []string{"<script", "src=", "<link", `href="http`, `href="//`, "url(", "@import"} {
			if strings.Contains(page, bad) {
				t.Errorf("page contains %q", bad)
			}
		}
	})
	t.Run("shows the document, the poll state and every host", func(t *testing.T) {
		for _, want := range []string{
			"9f86d081884c", "1m30s ago", "up 1h0m0s ·", "node http://127.0.0.1:7400", "poll: connection refused",
			"shop.example.test", "*.tenant.example.test", "classic.example.test", "go.example.test",
			"tito-go", f.deadAddr, f.liveAddr, ">ejected<", ">ok<", ">untried<",
			"api.example.test", "platform.example.test", "/v1/secrets", "/v1/ingress/routes",
			"none: TLS is off",
		} {
			if !strings.Contains(page, want) {
				t.Errorf("page lacks %q", want)
			}
		}
	})
	t.Run("lists path prefixes right under their host, before the next host", func(t *testing.T) {
		host := strings.Index(page, `id="route-classic.example.test"`)
		next := strings.Index(page, `id="route-go.example.test"`)
		beta := strings.Index(page, `<td class="prefix">/beta</td>`)
		paulca := strings.Index(page, `<td class="prefix">/paulca</td>`)
		if host < 0 || !(host < beta && beta < paulca && paulca < next) {
			t.Errorf("positions host=%d /beta=%d /paulca=%d next host=%d, want increasing", host, beta, paulca, next)
		}
	})
	t.Run("lists upstreams in priority order", func(t *testing.T) {
		if i, j := strings.Index(page, f.deadAddr), strings.Index(page, f.liveAddr); i < 0 || i > j {
			t.Errorf("box-down at %d, box-a at %d: want box-down first", i, j)
		}
	})
	t.Run("is refused to a remote client without the token", func(t *testing.T) {
		rec := serveAdmin(f.admin.Handler(), "/", "198.51.100.1:4000", "")
		if rec.Code != 403 || strings.Contains(rec.Body.String(), "example.test") {
			t.Errorf("GET / from a remote client = %d %q", rec.Code, rec.Body)
		}
	})
	t.Run("shows the load: pressure, connections against the budget, the memory limit and its source, each application's share", func(t *testing.T) {
		a := *f.admin
		a.Admission = func() admission.Status {
			return admission.Status{
				Pressure: true, PressureReason: "connections past the high-water mark", PressureSince: statusT0,
				ClientConns: 1700, IdleConns: 120, UpstreamConns: 140, MaxConns: 2000, ConnsPerClient: 125, RequestsPerClient: 125,
				MemoryLimit: 268435456, MemoryFrom: admission.MemoryFromCgroupV1, MemoryFile: "/sys/fs/cgroup/memory/edge/memory.limit_in_bytes",
				Apps: []admission.AppLoad{{Application: "slow-app", InFlight: 750, Queued: 62, Limit: 750}, {Application: "fast-app", InFlight: 3, Limit: 180}},
			}
		}
		_, page := fetchPage(t, a.Handler(), "/")
		for _, want := range []string{"yes: connections past the high-water mark", "1700 client (120 idle) + 140 upstream of 2000",
			"limit 268435456 bytes, from cgroup v1 <code>/sys/fs/cgroup/memory/edge/memory.limit_in_bytes</code>",
			"<td>slow-app</td><td>750</td><td><span class=\"bad\">62</span></td><td>750</td>"} {
			if !strings.Contains(page, want) {
				t.Errorf("page lacks %q", want)
			}
		}
		if strings.Index(page, "fast-app") > strings.Index(page, "slow-app") {
			t.Error("applications are not listed by name")
		}
		rec := serveAdmin(a.Handler(), "/status.json", "127.0.0.1:4000", "")
		var v struct {
			Load struct {
				Pressure    bool   `json:"pressure"`
				MaxConns    int    `json:"max_conns"`
				MemoryLimit int64  `json:"memory_limit_bytes"`
				MemoryFrom  string `json:"memory_limit_from"`
				MemoryFile  string `json:"memory_limit_file"`
				Apps        []struct {
					Application string `json:"application"`
					Queued      int    `json:"queued"`
				} `json:"applications"`
			} `json:"load"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		if !v.Load.Pressure || v.Load.MaxConns != 2000 || len(v.Load.Apps) != 2 || v.Load.Apps[1].Queued != 62 ||
			v.Load.MemoryLimit != 268435456 || v.Load.MemoryFrom != "cgroup v1" || v.Load.MemoryFile != "/sys/fs/cgroup/memory/edge/memory.limit_in_bytes" {
			t.Errorf("status.json load = %+v", v.Load)
		}
	})
	t.Run("escapes names from the document", func(t *testing.T) {
		a := *f.admin
		live := &edge.Live{}
		testsupport.Must(edge.NewUpdater(live, zerolog.Nop(), nil)).Apply(node.Update{Doc: &node.Document{V: 1, Routes: []node.Route{
			{Host: "x.example.test", Application: "<script>alert(1)</script>", Upstreams: []node.Upstream{{Node: "n", Address: "10.0.0.1:1"}}},
		}}, Fingerprint: "f", FetchedAt: statusT0})
		a.Live = live
		_, page := fetchPage(t, a.Handler(), "/")
		if strings.Contains(page, "<script>") {
			t.Error("an application name was rendered as markup")
		}
	})
}

func TestStatusPageStaysUsableWithTenThousandPrefixes(t *testing.T) {
	paths := make(map[string]string, edge.MaxPathsPerRoute)
	for i := range edge.MaxPathsPerRoute {
		paths[fmt.Sprintf("user%05d", i)] = "go.example.test"
	}
	f := newStatusFixture(t, node.Route{Host: "big.example.test", Application: "big",
		Upstreams: []node.Upstream{{Node: "box-a", Address: "10.1.0.5:8080"}}, Paths: paths})
	h := f.admin.Handler()

	_, page := fetchPage(t, h, "/")
	rows := pathRow.FindAllStringSubmatch(page, -1)
	// classic.example.test's two prefixes plus big's first pagePathLimit.
	if got, want := len(rows), 2+pagePathLimit; got != want {
		t.Errorf("page lists %d prefix rows, want %d", got, want)
	}
	if !strings.Contains(page, fmt.Sprintf("and %d more prefixes", edge.MaxPathsPerRoute-pagePathLimit)) {
		t.Error("page does not say how many prefixes it left out")
	}
	if !strings.Contains(page, "10000 prefixes") {
		t.Error("page does not give the host's prefix count")
	}
	if len(page) > 64<<10 {
		t.Errorf("page is %d bytes with 10,000 prefixes; want it bounded under 64 KiB", len(page))
	}

	_, all := fetchPage(t, h, "/?paths=10000")
	if got := len(pathRow.FindAllStringSubmatch(all, -1)); got != 2+edge.MaxPathsPerRoute {
		t.Errorf("?paths=10000 lists %d prefix rows, want %d", got, 2+edge.MaxPathsPerRoute)
	}

	v := fetchStatusJSON(t, f.admin)
	if big := v.Routes[4]; big.PathCount != edge.MaxPathsPerRoute || len(big.Paths) != edge.MaxPathsPerRoute {
		t.Errorf("status.json carries %d of %d prefixes, want all", len(big.Paths), big.PathCount)
	}
}

// TestStatusPageInABrowser loads the page in headless Chromium from a
// loopback listener and checks the rendered DOM. CI installs chromium
// (.ci/run) and sets CI, where a missing browser fails the test: a skipped
// browser test would hide a broken page.
func TestStatusPageInABrowser(t *testing.T) {
	chromium := testsupport.NeedTool(t, "chromium", "chromium")
	f := newStatusFixture(t)
	srv := httptest.NewServer(f.admin.Handler()) // 127.0.0.1: privileged
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	shot := filepath.Join(dir, "status.png")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+filepath.Join(dir, "profile"),
		"--window-size=1280,1000",
		"--screenshot="+shot,
		"--dump-dom", srv.URL+"/")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, lastLines(stderr.String(), 20))
	}
	dom := stdout.String()
	t.Logf("screenshot: %s", shot)
	// t.TempDir goes with the test; SCAFO_KEEP_SCREENSHOT=FILE keeps a copy.
	if d := os.Getenv("SCAFO_KEEP_SCREENSHOT"); d != "" {
		if b, err := os.ReadFile(shot); err == nil {
			os.WriteFile(d, b, 0o644)
		}
	}

	for _, want := range []string{
		"shop.example.test", "*.tenant.example.test", "classic.example.test", "go.example.test",
		"/paulca", "/beta", f.deadAddr, f.liveAddr, "api.example.test", "/v1/ingress/routes", "9f86d081884c",
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered DOM lacks %q", want)
		}
	}
	// The rendered DOM keeps the prefix rows inside the table, under their
	// host: a template slip that leaves them outside would show here.
	host := strings.Index(dom, "classic.example.test")
	paulca := strings.Index(dom, "/paulca")
	next := strings.Index(dom, `id="route-go.example.test"`)
	if !(host < paulca && paulca < next) {
		t.Errorf("rendered order host=%d /paulca=%d next host=%d", host, paulca, next)
	}
	if fi, err := os.Stat(shot); err != nil || fi.Size() == 0 {
		t.Errorf("no screenshot written: %v", err)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
