package edge

import (
	"fmt"
	"strings"
	"testing"

	"github.com/scafo/scafo-edge/node"
)

func up(n string) []node.Upstream { return []node.Upstream{{Node: n, Address: "127.0.0.1:1"}} }

// testDocument is the flip example of path-routing-design.md plus the
// wildcard and API cases of routing-and-ingress.md.
func testDocument() *node.Document {
	return &node.Document{
		V: 1,
		Routes: []node.Route{
			{Host: "ti.to", Application: "classic", Upstreams: up("classic"),
				Paths: map[string]string{"paulca": "go.tito.io", "bob": "go.tito.io", "beta": "beta.tito.io"}},
			{Host: "go.tito.io", Application: "tito-go", Upstreams: up("go")},
			{Host: "beta.tito.io", Application: "tito-beta", Upstreams: up("beta")},
			{Host: "shop.apps.example.com", Application: "shop", Upstreams: up("shop")},
			{Host: "deutsche.tito.page", Application: "tito-go", Upstreams: up("go")},
			{Host: "*.tito.page", Application: "classic", Upstreams: up("classic")},
			{Host: "Mixed.Example.ORG.", Application: "mixed", Upstreams: up("mixed")},
		},
		API: &node.API{
			Hosts:     []string{"apps.example.com", "shop.apps.example.com"},
			Upstreams: up("api"),
			Denied:    []string{"/v1/storage"}, // omits /v1/ingress/routes on purpose
		},
	}
}

func compileTest(t testing.TB) *Table {
	t.Helper()
	tbl, drops := Compile(testDocument())
	if len(drops) != 1 || !strings.Contains(drops[0].Reason, "route wins") {
		t.Fatalf("Compile drops = %v, want one API-host-shadowed drop", drops)
	}
	return tbl
}

func describe(r Resolution) string {
	switch r.Outcome {
	case NoRoute:
		return "no route"
	case BadHost:
		return "bad host"
	case Denied:
		return "denied"
	}
	if r.Route.API {
		return "api"
	}
	return r.Route.Application + "@" + r.Route.Host
}

func TestResolveHost(t *testing.T) {
	tbl := compileTest(t)
	cases := []struct {
		name, host, want string
	}{
		{"exact host matches", "shop.apps.example.com", "shop@shop.apps.example.com"},
		{"host lookup is case-insensitive (rule 3)", "SHOP.Apps.Example.com", "shop@shop.apps.example.com"},
		{"port is dropped (rule 3)", "shop.apps.example.com:8443", "shop@shop.apps.example.com"},
		{"one trailing dot is dropped (rule 3)", "shop.apps.example.com.", "shop@shop.apps.example.com"},
		{"two trailing dots are malformed", "shop.apps.example.com..", "bad host"},
		{"document hosts are normalised too", "mixed.example.org", "mixed@mixed.example.org"},
		{"exact wins over the enclosing wildcard (rule 3)", "deutsche.tito.page", "tito-go@deutsche.tito.page"},
		{"wildcard matches exactly one label", "other.tito.page", "classic@*.tito.page"},
		{"wildcard never matches two labels below the base", "a.b.tito.page", "no route"},
		{"wildcard key does not match its bare base", "tito.page", "no route"},
		{"no wildcard exists unless the document names one", "nothing.apps.example.com", "no route"},
		{"a literal wildcard Host is malformed", "*.tito.page", "bad host"},
		{"API host routes to the API", "apps.example.com", "api"},
		{"API host a route also names goes to the route", "shop.apps.example.com", "shop@shop.apps.example.com"},
		{"empty host is malformed", "", "bad host"},
		{"host with a space is malformed", "shop apps", "bad host"},
		{"host with a bad port is malformed", "shop.apps.example.com:80x", "bad host"},
		{"empty label is malformed", "shop..example.com", "bad host"},
		{"leading dot is malformed", ".example.com", "bad host"},
		{"a bracketed IPv6 literal is well formed but unrouted", "[::1]:8080", "no route"},
		{"an IPv4 literal is well formed but unrouted", "127.0.0.1:80", "no route"},
		{"overlong label is malformed", strings.Repeat("a", 64) + ".tito.page", "bad host"},
		{"overlong host is malformed", strings.Repeat("a.", 200) + "com", "bad host"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := describe(tbl.Resolve(c.host, "/", "/")); got != c.want {
				t.Errorf("Resolve(%q, /) = %s, want %s", c.host, got, c.want)
			}
		})
	}
}

func TestResolvePath(t *testing.T) {
	tbl := compileTest(t)
	const classic, goapp, beta = "classic@ti.to", "tito-go@go.tito.io", "tito-beta@beta.tito.io"
	// Every example of path-routing-design.md §6, raw path as it arrives and
	// its decoded form as net/url gives it.
	cases := []struct {
		name, raw, decoded, want string
	}{
		{"prefix matches its own segment", "/paulca", "/paulca", goapp},
		{"prefix matches its subtree", "/paulca/awesomeconf/admin", "/paulca/awesomeconf/admin", goapp},
		{"segment boundary only", "/paulcarson", "/paulcarson", classic},
		{"root falls through to the host's route", "/", "/", classic},
		{"empty path falls through", "", "", classic},
		{"doubled leading slash is caught by the normalised spelling", "//paulca/foo", "//paulca/foo", goapp},
		{"dot-dot to a prefix: normalised hit wins", "/paulca/../bob", "/paulca/../bob", goapp},
		{"dot-dot to a different prefix: normalised wins", "/paulca/../beta", "/paulca/../beta", beta},
		{"dot-dot to a non-prefix: raw hit keeps the flipped account", "/paulca/../carol", "/paulca/../carol", goapp},
		{"encoded dot-dot normalises to the prefix", "/%2e%2e/bob", "/../bob", goapp},
		{"encoded slash decodes to the prefix (safe direction)", "/paulca%2ffoo", "/paulca/foo", goapp},
		{"encoded letters decode to the prefix", "/p%61ulca/x", "/paulca/x", goapp},
		{"dot segment before the prefix", "/./paulca", "/./paulca", goapp},
		{"unknown first segment", "/carol/x", "/carol/x", classic},
		{"doubled slash then dot-dot keeps the flipped account off the legacy route", "//paulca/../x", "//paulca/../x", goapp},
		{"doubled slash before an encoded prefix", "//p%61ulca", "//paulca", goapp},
		{"prefixes are case-sensitive", "/PAULCA", "/PAULCA", classic},
		{"query is not part of the path", "/paulca", "/paulca", goapp},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := tbl.Resolve("ti.to", c.raw, c.decoded)
			if d := describe(got); d != c.want {
				t.Errorf("Resolve(ti.to, %q) = %s, want %s", c.raw, d, c.want)
			}
		})
	}
	t.Run("a path hit returns the target route wholesale (rule 5)", func(t *testing.T) {
		r := tbl.Resolve("ti.to", "/paulca/x", "/paulca/x")
		if r.Route.Application != "tito-go" || r.Route.Upstreams[0].Node != "go" || r.Prefix != "paulca" {
			t.Errorf("Resolve = %+v, want the go.tito.io route with prefix paulca", r)
		}
	})
	t.Run("a target's own prefix map is never consulted", func(t *testing.T) {
		doc := &node.Document{V: 1, Routes: []node.Route{
			{Host: "a.example", Application: "a", Upstreams: up("a"), Paths: map[string]string{"x": "b.example"}},
			{Host: "b.example", Application: "b", Upstreams: up("b"), Paths: map[string]string{"x": "a.example"}},
		}}
		tbl, _ := Compile(doc)
		if got := describe(tbl.Resolve("a.example", "/x", "/x")); got != "b@b.example" {
			t.Errorf("Resolve(a.example, /x) = %s, want b@b.example", got)
		}
	})
}

func TestDeniedPrefixes(t *testing.T) {
	tbl := compileTest(t)
	cases := []struct {
		raw, decoded string
		denied       bool
	}{
		{"/v1/storage", "/v1/storage", true},
		{"/v1/storage/objects/x", "/v1/storage/objects/x", true},
		{"/v1/ingress/routes", "/v1/ingress/routes", true}, // mandatory though the document omits it
		{"/v1/ingress/routes/traefik", "/v1/ingress/routes/traefik", true},
		{"//v1/storage", "//v1/storage", true},
		{"/v1/./storage", "/v1/./storage", true},
		{"/v1/x/../storage", "/v1/x/../storage", true},
		{"/v1/%73torage", "/v1/storage", true},
		{"/v1/storage%2fobjects", "/v1/storage/objects", true},
		{"/v1/%2573torage", "/v1/%73torage", true},
		{"/V1/Storage", "/V1/Storage", true},
		{"/v1\\storage", "/v1\\storage", true},
		{"/v1;x/storage", "/v1;x/storage", true},
		{"/v1/storage;jsessionid=1", "/v1/storage;jsessionid=1", true},
		{"/v1/storage/", "/v1/storage/", true},
		{"/v1/storagex", "/v1/storagex", false},
		{"/v1/ingress/routesx", "/v1/ingress/routesx", false},
		{"/v1/apps", "/v1/apps", false},
		{"/", "/", false},
		{"/v1/stor%zzage", "/v1/stor%zzage", false},
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s is allowed", c.raw)
		if c.denied {
			name = fmt.Sprintf("%s is denied", c.raw)
		}
		t.Run(name, func(t *testing.T) {
			got := tbl.Resolve("apps.example.com", c.raw, c.decoded)
			if (got.Outcome == Denied) != c.denied {
				t.Errorf("Resolve(apps.example.com, %q) = %s, denied want %v", c.raw, describe(got), c.denied)
			}
		})
	}
	t.Run("denied prefixes apply only on API hosts", func(t *testing.T) {
		if got := describe(tbl.Resolve("go.tito.io", "/v1/storage", "/v1/storage")); got != "tito-go@go.tito.io" {
			t.Errorf("Resolve(go.tito.io, /v1/storage) = %s, want the app route", got)
		}
	})
	t.Run("mandatory prefixes are denied when the document lists none", func(t *testing.T) {
		tbl, _ := Compile(&node.Document{V: 1, API: &node.API{Hosts: []string{"apex.example"}, Upstreams: up("api")}})
		if got := tbl.Resolve("apex.example", "/v1/storage/x", "/v1/storage/x"); got.Outcome != Denied {
			t.Errorf("Resolve = %s, want denied", describe(got))
		}
	})
}

func TestCompileDrops(t *testing.T) {
	doc := &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: up("a"), Paths: map[string]string{
			"ok": "b.example", "/slash": "b.example", "a/b": "b.example", ".": "b.example", "..": "b.example",
			"": "b.example", "ghost": "nowhere.example", "sp ace": "b.example",
		}},
		{Host: "b.example", Application: "b", Upstreams: up("b")},
		{Host: "A.example", Application: "dup", Upstreams: up("dup")},
	}}
	tbl, drops := Compile(doc)
	if len(drops) != 8 {
		t.Errorf("Compile drops = %d %v, want 8", len(drops), drops)
	}
	if got := tbl.PrefixCount(); got != 1 {
		t.Errorf("PrefixCount = %d, want 1", got)
	}
	if got := describe(tbl.Resolve("a.example", "/ok", "/ok")); got != "b@b.example" {
		t.Errorf("the valid prefix survives its neighbours' drops: got %s", got)
	}
	if got := describe(tbl.Resolve("a.example", "/ghost", "/ghost")); got != "a@a.example" {
		t.Errorf("a prefix with an unknown target falls through to the host: got %s", got)
	}

	t.Run("prefixes beyond the cap are dropped in sorted key order", func(t *testing.T) {
		paths := make(map[string]string, MaxPathsPerRoute+5)
		for i := range MaxPathsPerRoute + 5 {
			paths[fmt.Sprintf("p%05d", i)] = "b.example"
		}
		doc := &node.Document{V: 1, Routes: []node.Route{
			{Host: "a.example", Application: "a", Upstreams: up("a"), Paths: paths},
			{Host: "b.example", Application: "b", Upstreams: up("b")},
		}}
		tbl, drops := Compile(doc)
		if len(drops) != 5 || drops[0].Entry != fmt.Sprintf("p%05d", MaxPathsPerRoute) {
			t.Fatalf("drops = %d (first %v), want 5 starting at p%05d", len(drops), drops[:min(1, len(drops))], MaxPathsPerRoute)
		}
		if got := describe(tbl.Resolve("a.example", "/p09999", "/p09999")); got != "b@b.example" {
			t.Errorf("last kept prefix resolves to %s", got)
		}
	})
}

func TestCertifiable(t *testing.T) {
	tbl := compileTest(t)
	cases := []struct {
		name string
		want bool
	}{
		{"shop.apps.example.com", true},
		{"apps.example.com", true},
		{"deutsche.tito.page", true},
		{"SHOP.apps.example.com.", true},
		{"*.tito.page", false},
		{"other.tito.page", false},
		{"tito.page", false},
		{"unknown.example", false},
	}
	for _, c := range cases {
		if got := tbl.Certifiable(c.name); got != c.want {
			t.Errorf("Certifiable(%q) = %v, want %v", c.name, got, c.want)
		}
	}
	var none *Table
	if none.Certifiable("shop.apps.example.com") {
		t.Error("a nil table (before the first document) approved a name")
	}
}

func TestResolveDoesNotAllocate(t *testing.T) {
	tbl := compileTest(t)
	cases := []struct{ name, host, path string }{
		{"exact host without a prefix map", "shop.apps.example.com", "/cart"},
		{"upper-case host", "SHOP.APPS.EXAMPLE.COM:443", "/cart"},
		{"wildcard host", "other.tito.page", "/"},
		{"path hit", "ti.to", "/paulca/awesomeconf"},
		{"path miss", "ti.to", "/carol/x"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if n := testing.AllocsPerRun(100, func() { tbl.Resolve(c.host, c.path, c.path) }); n != 0 {
				t.Errorf("Resolve(%q, %q) allocates %v times, want 0", c.host, c.path, n)
			}
		})
	}
}
