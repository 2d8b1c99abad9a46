package edge

import (
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// nodeDoc is a node's document for the merge cases: exact hosts, a
// wildcard, a path map and the API apex.
func nodeDoc() *node.Document {
	return &node.Document{V: 1,
		Routes: []node.Route{
			{Host: "shop.example.com", Application: "shop", Upstreams: up("shop")},
			{Host: "grafana.box.example", Application: "node-grafana", Upstreams: up("node-grafana")},
			{Host: "a.apps.example", Application: "node-a", Upstreams: up("node-a")},
			{Host: "*.custom.example", Application: "node-wild", Upstreams: up("node-wild")},
			{Host: "ti.to", Application: "classic", Upstreams: up("classic"),
				Paths: map[string]string{"tools": "tools.box.example", "gone": "nowhere.example", "shop": "shop.example.com"}},
		},
		API: &node.API{Hosts: []string{"apps.example.com"}, Upstreams: up("api"), Denied: []string{"/v1/storage"}},
	}
}

// operatorDoc is an operator file naming some of the node's hosts, a
// wildcard over a node's exact host, an exact host under a node's
// wildcard, and the API host.
func operatorDoc() *node.OperatorDocument {
	return &node.OperatorDocument{V: 1, Routes: []node.OperatorRoute{
		{Host: "grafana.box.example", Application: "grafana", Upstreams: up("op-grafana")},
		{Host: "*.apps.example", Application: "op-wild", Upstreams: up("op-wild")},
		{Host: "x.custom.example", Application: "op-x", Upstreams: up("op-x")},
		{Host: "tools.box.example", Upstreams: up("op-tools")},
		{Host: "Apps.Example.COM", Application: "sneaky", Upstreams: up("op-api")},
		{Host: "www.example.com", Redirect: &node.Redirect{To: "https://example.com"}},
	}}
}

func TestCompileWithOperatorRoutes(t *testing.T) {
	tbl, drops, conflicts := CompileWith(nodeDoc(), operatorDoc())

	t.Run("a host both name is the operator's, reported as a conflict", func(t *testing.T) {
		want := []Conflict{{Host: "grafana.box.example", NodeApplication: "node-grafana", OperatorApplication: "grafana"}}
		if !slices.Equal(conflicts, want) || !slices.Equal(tbl.Conflicts(), want) {
			t.Errorf("conflicts = %v, table's %v, want %v", conflicts, tbl.Conflicts(), want)
		}
	})
	t.Run("an operator route for an API host is refused by name", func(t *testing.T) {
		var got []string
		for _, d := range drops {
			got = append(got, d.Host+": "+d.Reason)
		}
		if len(drops) != 2 || drops[0].Host != "apps.example.com" || !strings.Contains(drops[0].Reason, "API host refused") {
			t.Errorf("drops = %q, want the API host refused, then the node's dangling path target", got)
		}
	})

	cases := []struct {
		name, host, path string
		wantApp          string
		wantOperator     bool
		wantOutcome      Outcome
	}{
		{"the operator's exact host wins the key both name", "grafana.box.example", "/", "grafana", true, Routed},
		{"a node host the operator does not name stays the node's", "shop.example.com", "/", "shop", false, Routed},
		{"a node's exact host under an operator wildcard stays the node's (rule 3)", "a.apps.example", "/", "node-a", false, Routed},
		{"the operator wildcard answers the names nobody names exactly", "b.apps.example", "/", "op-wild", true, Routed},
		{"an operator exact host under a node wildcard is the operator's", "x.custom.example", "/", "op-x", true, Routed},
		{"the node wildcard still answers its other names", "y.custom.example", "/", "node-wild", false, Routed},
		{"an operator route without an application is named by its host", "tools.box.example", "/", "tools.box.example", true, Routed},
		{"the API host stays the API's", "apps.example.com", "/v1/apps", "", false, Routed},
		{"the API's denied prefixes still hold (rule 6)", "apps.example.com", "/v1/storage/x", "", false, Denied},
		{"a node path entry may lead into an operator host", "ti.to", "/tools/x", "tools.box.example", true, Routed},
		{"a node path entry into a node host is kept", "ti.to", "/shop", "shop", false, Routed},
		{"a redirect host is a route", "www.example.com", "/a", "www.example.com", true, Routed},
		{"a name neither names is no route", "nothing.example", "/", "", false, NoRoute},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := tbl.Resolve(tc.host, tc.path, tc.path)
			if res.Outcome != tc.wantOutcome {
				t.Fatalf("Resolve(%q, %q) = outcome %v, want %v", tc.host, tc.path, res.Outcome, tc.wantOutcome)
			}
			if tc.wantOutcome == NoRoute {
				return
			}
			if res.Route.API {
				if tc.wantApp != "" {
					t.Errorf("Resolve(%q) = the API apex, want %q", tc.host, tc.wantApp)
				}
				return
			}
			if res.Route.Application != tc.wantApp || res.Route.Operator != tc.wantOperator {
				t.Errorf("Resolve(%q, %q) = %q (operator %v), want %q (operator %v)", tc.host, tc.path,
					res.Route.Application, res.Route.Operator, tc.wantApp, tc.wantOperator)
			}
		})
	}

	t.Run("certificates: operator exact hosts count, an operator wildcard approves none (rule 8)", func(t *testing.T) {
		for name, want := range map[string]bool{
			"grafana.box.example": true, "tools.box.example": true, "www.example.com": true, "x.custom.example": true,
			"*.apps.example": false, "b.apps.example": false, "a.apps.example": true, "nothing.example": false,
		} {
			if got := tbl.Certifiable(name); got != want {
				t.Errorf("Certifiable(%q) = %v, want %v", name, got, want)
			}
		}
	})
	t.Run("the routes list the node's, then the operator's", func(t *testing.T) {
		var got []string
		for _, r := range tbl.Routes() {
			got = append(got, r.Host)
		}
		want := []string{"shop.example.com", "a.apps.example", "*.custom.example", "ti.to",
			"grafana.box.example", "*.apps.example", "x.custom.example", "tools.box.example", "www.example.com"}
		if !slices.Equal(got, want) {
			t.Errorf("Routes() = %v, want %v", got, want)
		}
	})
	t.Run("without an operator file, the table is Compile's", func(t *testing.T) {
		plain, drops := Compile(nodeDoc())
		with, drops2, conflicts := CompileWith(nodeDoc(), nil)
		if len(conflicts) != 0 || len(drops) != len(drops2) || len(plain.Routes()) != len(with.Routes()) {
			t.Errorf("CompileWith(doc, nil) = %d routes, %v, %v; Compile = %d routes, %v", len(with.Routes()), drops2, conflicts, len(plain.Routes()), drops)
		}
		for _, r := range plain.Routes() {
			if r.Operator || r.policy != nil {
				t.Errorf("node route %s has operator marks", r.Host)
			}
		}
	})
}

func TestUpdaterMergesOperatorFile(t *testing.T) {
	live := &Live{}
	logs := &testsupport.SyncBuffer{}
	reg := prometheus.NewPedanticRegistry()
	up, err := NewUpdater(live, zerolog.New(logs), reg)
	if err != nil {
		t.Fatal(err)
	}
	conflicts := func() float64 {
		v, _ := testsupport.MetricValue(t, reg, "scafo_edge_operator_route_conflicts", nil)
		return v
	}
	if err := up.SetOperator(node.OperatorUpdate{Doc: operatorDoc(), Fingerprint: "op1"}, reg); err != nil {
		t.Fatal(err)
	}
	if live.Load() != nil {
		t.Fatal("SetOperator published a table before the node's first document (rule 1)")
	}
	if tbl := up.ApplyOperator(node.OperatorUpdate{Doc: operatorDoc(), Fingerprint: "op1"}); tbl != nil || live.Load() != nil {
		t.Fatal("ApplyOperator published a table before the node's first document (rule 1)")
	}
	tbl := up.Apply(node.Update{Doc: nodeDoc(), Fingerprint: "n1"})
	if live.Load() != tbl || tbl.OperatorFingerprint() != "op1" || tbl.Fingerprint() != "n1" {
		t.Fatalf("Apply: live %p, table %p, fingerprints %q %q", live.Load(), tbl, tbl.Fingerprint(), tbl.OperatorFingerprint())
	}
	if got := conflicts(); got != 1 {
		t.Errorf("scafo_edge_operator_route_conflicts = %v, want 1", got)
	}
	if e := logs.LogEntries("host named by both the node's document and the operator routes file; the operator's route serves it"); len(e) != 1 || e[0]["host"] != "grafana.box.example" || e[0]["node_application"] != "node-grafana" {
		t.Errorf("conflict log = %v, want one naming grafana.box.example and node-grafana", e)
	}

	t.Run("an operator edit that drops the conflicting host gives it back to the node", func(t *testing.T) {
		op := operatorDoc()
		op.Routes = op.Routes[1:]
		tbl := up.ApplyOperator(node.OperatorUpdate{Doc: op, Fingerprint: "op2"})
		if tbl == nil || live.Load() != tbl {
			t.Fatal("ApplyOperator did not swap")
		}
		if r := tbl.ResolveHost("grafana.box.example"); r == nil || r.Operator || r.Application != "node-grafana" {
			t.Errorf("grafana.box.example = %+v, want the node's route", r)
		}
		if got := conflicts(); got != 0 {
			t.Errorf("scafo_edge_operator_route_conflicts = %v, want 0", got)
		}
	})
	t.Run("a node document that names an operator host again cannot take it", func(t *testing.T) {
		up.ApplyOperator(node.OperatorUpdate{Doc: operatorDoc(), Fingerprint: "op3"})
		tbl := up.Apply(node.Update{Doc: nodeDoc(), Fingerprint: "n2"})
		if r := tbl.ResolveHost("grafana.box.example"); r == nil || !r.Operator {
			t.Errorf("grafana.box.example = %+v, want the operator's route", r)
		}
		if got := conflicts(); got != 1 {
			t.Errorf("scafo_edge_operator_route_conflicts = %v, want 1", got)
		}
	})
}

func TestUpdaterWithoutOperatorRegistersNothingNew(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	up, err := NewUpdater(&Live{}, zerolog.Nop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	up.Apply(node.Update{Doc: nodeDoc()})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.Contains(mf.GetName(), "operator") {
			t.Errorf("metric %s exported without an operator file", mf.GetName())
		}
	}
}

// The bcrypt hash of "s3cret" at the minimum cost, so tests stay fast.
const s3cretHash = "$2a$04$KS98S0tAZG5k4gXURbV28O5diKwQN8I59g9zojtGj0VxJz8WXwny2"

// headerUpstream answers with headers an operator may want gone, and
// echoes the Authorization header it received.
type headerUpstream struct {
	srv  *httptest.Server
	mu   sync.Mutex
	auth []string
}

func newHeaderUpstream(t *testing.T) *headerUpstream {
	u := &headerUpstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.auth = append(u.auth, r.Header.Get("Authorization"))
		u.mu.Unlock()
		w.Header().Set("Server", "grafana")
		w.Header().Set("X-Powered-By", "php")
		io.WriteString(w, "grafana "+r.URL.Path)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func TestHandlerOperatorPolicies(t *testing.T) {
	f := newHandlerFixture(t)
	g := newHeaderUpstream(t)
	gup := []node.Upstream{{Node: "box", Address: g.srv.Listener.Addr().String()}}
	op := &node.OperatorDocument{V: 1, Routes: []node.OperatorRoute{
		{Host: "www.example.com", Redirect: &node.Redirect{To: "https://example.com", Status: 301, KeepPath: true}},
		{Host: "old.example.com", Redirect: &node.Redirect{To: "https://new.example.com/landing"}},
		{Host: "grafana.example.com", Upstreams: gup, BasicAuth: &node.BasicAuth{Realm: "grafana", Users: []string{"admin:" + s3cretHash}},
			Headers: &node.HeaderRules{Remove: []string{"x-powered-by"}, Set: map[string]string{"Strict-Transport-Security": "max-age=63072000", "Server": "edge"}}},
		{Host: "internal.example.com", Upstreams: gup, Allow: []string{"127.0.0.1"}},
		{Host: "elsewhere.example.com", Upstreams: gup, Allow: []string{"10.0.0.0/8"}},
		{Host: "plain.example.com", Upstreams: gup},
	}}
	doc := &node.Document{V: 1, Routes: []node.Route{
		{Host: "ti.to", Application: "classic", Upstreams: []node.Upstream{{Node: "a", Address: f.classic.addr()}},
			Paths: map[string]string{"grafana": "grafana.example.com"}},
	}}
	tbl, drops, _ := CompileWith(doc, op)
	if len(drops) > 0 {
		t.Fatalf("drops: %v", drops)
	}
	f.live.Store(tbl)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(t *testing.T, host, target string, hdr map[string]string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", f.srv.URL+target, nil)
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	basic := func(user, pass string) map[string]string {
		return map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))}
	}

	cases := []struct {
		name, host, target string
		hdr                map[string]string
		wantStatus         int
		wantHeader         map[string]string // "" value: absent
		wantBody           string
		wantReason         Reason
	}{
		{"a redirect keeps the path and query as they arrived", "www.example.com", "/a%2Fb/c?x=1&y", nil, 301,
			map[string]string{"Location": "https://example.com/a%2Fb/c?x=1&y"}, "", ReasonRedirect},
		{"a redirect without keep_path goes to its URL alone, 308 by default", "old.example.com", "/deep/path?q", nil, 308,
			map[string]string{"Location": "https://new.example.com/landing"}, "", ReasonRedirect},
		{"basic auth without credentials is 401 with a challenge", "grafana.example.com", "/", nil, 401,
			map[string]string{"WWW-Authenticate": `Basic realm="grafana", charset="UTF-8"`}, "", ReasonUnauthorized},
		{"basic auth with a wrong password is 401", "grafana.example.com", "/", basic("admin", "guess"), 401, nil, "", ReasonUnauthorized},
		{"basic auth with an unknown user is 401", "grafana.example.com", "/", basic("root", "s3cret"), 401, nil, "", ReasonUnauthorized},
		{"basic auth with the right password is forwarded, header rules applied", "grafana.example.com", "/d", basic("admin", "s3cret"), 200,
			map[string]string{"X-Powered-By": "", "Server": "edge", "Strict-Transport-Security": "max-age=63072000"}, "grafana /d", ""},
		{"a node path entry into the operator host keeps its basic auth (rule 5)", "ti.to", "/grafana/x", nil, 401, nil, "", ReasonUnauthorized},
		{"an allowed client address is forwarded", "internal.example.com", "/", nil, 200, nil, "grafana /", ""},
		{"a client outside the allow list is 403", "elsewhere.example.com", "/", nil, 403, nil, "", ReasonNotAllowed},
		{"an operator route without rules is proxied as is", "plain.example.com", "/p", nil, 200,
			map[string]string{"X-Powered-By": "php", "Server": "grafana"}, "grafana /p", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := get(t, tc.host, tc.target, tc.hdr)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("GET %s%s = %d %q, want %d", tc.host, tc.target, resp.StatusCode, body, tc.wantStatus)
			}
			for k, v := range tc.wantHeader {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			if tc.wantBody != "" && body != tc.wantBody {
				t.Errorf("body = %q, want %q", body, tc.wantBody)
			}
			if rec := f.obs.awaitLast(t); rec.Reason != tc.wantReason {
				t.Errorf("record reason = %q, want %q", rec.Reason, tc.wantReason)
			}
		})
	}
	t.Run("the Authorization header never reaches the upstream", func(t *testing.T) {
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, a := range g.auth {
			if a != "" {
				t.Errorf("upstream received Authorization %q", a)
			}
		}
	})
	t.Run("a password that passed is not checked again", func(t *testing.T) {
		v := tbl.ResolveHost("grafana.example.com").policy.auth.v
		v.mu.Lock()
		n := len(v.passed)
		v.mu.Unlock()
		if n != 1 {
			t.Errorf("verified pairs = %d, want 1", n)
		}
		// With every slot taken, only a remembered pair can pass.
		for range cap(v.slots) {
			v.slots <- struct{}{}
		}
		defer func() {
			for range cap(v.slots) {
				<-v.slots
			}
		}()
		if resp, _ := get(t, "grafana.example.com", "/", basic("admin", "s3cret")); resp.StatusCode != 200 {
			t.Errorf("remembered pair = %d, want 200", resp.StatusCode)
		}
	})
	t.Run("trusted proxies: the allow list judges the client they vouch for", func(t *testing.T) {
		h := &Handler{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
		for _, tc := range []struct {
			xff  []string
			nets string
			want bool
		}{
			{[]string{"10.1.2.3"}, "10.0.0.0/8", true},
			{[]string{"192.0.2.1"}, "10.0.0.0/8", false},
			{[]string{"10.9.9.9, 192.0.2.1"}, "10.0.0.0/8", false}, // the left entry is forgeable
			{nil, "127.0.0.0/8", false},                            // a proxy vouching for nobody
		} {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = "127.0.0.1:5000"
			if tc.xff != nil {
				r.Header["X-Forwarded-For"] = tc.xff
			}
			if got := h.allowed(r, []netip.Prefix{netip.MustParsePrefix(tc.nets)}); got != tc.want {
				t.Errorf("allowed(XFF %q, %s) = %v, want %v", tc.xff, tc.nets, got, tc.want)
			}
		}
	})
}
