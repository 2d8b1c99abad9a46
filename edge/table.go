// Package edge owns the routing side of scafo-edge: compiling a routing
// document into an immutable Table, swapping the live table atomically, host
// lookup (normalised by internal/hostname, the rule certs shares), resolution
// (exact host, one-label wildcard, first path segment), the API apex and its
// denied prefixes, and the request handler with the statuses the edge answers
// itself.
//
// It does not know about ACME or how bytes reach an upstream: the handler hands
// a resolved route's upstream list to a Forwarder.
package edge

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/scafo/scafo-edge/node"
)

// MaxPathsPerRoute bounds a route's prefix map (docs/design.md, "The routing
// document extension"). Beyond it, prefixes are dropped in sorted key order.
const MaxPathsPerRoute = 10000

// mandatoryDenied are the API prefixes routing-and-ingress.md lists. They are
// denied on API hosts even when a document omits them: the edge does not trust
// the daemon behind it (docs/design.md rule 6).
var mandatoryDenied = []string{"/v1/storage", "/v1/ingress/routes"}

// Route is one compiled route. It is immutable once its Table is built; a
// request keeps using the Route it resolved even after a swap.
type Route struct {
	// Host is the normalised key the document named: a host or "*.<base>".
	Host        string
	Application string
	// Upstreams is the priority list, first healthy one first.
	Upstreams []node.Upstream
	// API reports whether this is the platform API apex route.
	API bool

	// paths maps a bare first segment to the target route; nil when the
	// route has no prefix map, so a plain host costs one nil check.
	paths map[string]*Route
}

// Wildcard reports whether the route's key is a "*.<base>" wildcard key.
func (r *Route) Wildcard() bool { return strings.HasPrefix(r.Host, "*.") }

// Paths returns the route's prefix map as sorted (prefix, target host) pairs.
// It allocates; it is for status surfaces, not the request path.
func (r *Route) Paths() []PathEntry {
	out := make([]PathEntry, 0, len(r.paths))
	for p, t := range r.paths {
		out = append(out, PathEntry{Prefix: p, Target: t})
	}
	slices.SortFunc(out, func(a, b PathEntry) int { return strings.Compare(a.Prefix, b.Prefix) })
	return out
}

// PathEntry is one prefix of a route's prefix map.
type PathEntry struct {
	Prefix string
	Target *Route
}

// Drop is one entry of an otherwise valid document that Compile left out.
type Drop struct {
	Host   string // the route (or API host) the entry belonged to
	Entry  string // the prefix, target or host that was dropped
	Reason string
}

func (d Drop) String() string {
	return fmt.Sprintf("%s: dropped %q: %s", d.Host, d.Entry, d.Reason)
}

// Table is an immutable compiled routing document. All methods are safe for
// concurrent use; nothing mutates a Table after Compile returns it.
type Table struct {
	// hosts holds every route key and every API host; the API hosts share
	// one Route whose API field is set.
	hosts    map[string]*Route
	routes   []*Route // document order, for status surfaces
	api      *Route
	apiHosts []string
	denied   []string // canonical: lower-case, cleaned, no trailing slash
	prefixes int

	// Set by Updater.Apply before the table is published.
	fingerprint string
	fetchedAt   time.Time
}

// Compile builds a Table from a parsed document. Entries that are wrong on
// their own (a bad path prefix, a path target that is not a route of the
// document, prefixes beyond MaxPathsPerRoute, a duplicate host, an API host a
// route also names) are left out and reported as drops; the rest is kept.
func Compile(doc *node.Document) (*Table, []Drop) {
	t := &Table{hosts: make(map[string]*Route, len(doc.Routes)+4)}
	var drops []Drop

	kept := make([]*Route, len(doc.Routes)) // nil where a duplicate lost
	for i, dr := range doc.Routes {
		key := canonicalKey(dr.Host)
		if _, dup := t.hosts[key]; dup {
			drops = append(drops, Drop{Host: key, Entry: dr.Host, Reason: "duplicate host, first wins"})
			continue
		}
		r := &Route{Host: key, Application: dr.Application, Upstreams: slices.Clone(dr.Upstreams)}
		t.hosts[key] = r
		t.routes = append(t.routes, r)
		kept[i] = r
	}

	// Targets resolve to routes of this document only; a target's own prefix
	// map is never consulted again, so a hit cannot chain or loop.
	for i, dr := range doc.Routes {
		if len(dr.Paths) == 0 {
			continue
		}
		r := kept[i]
		if r == nil {
			continue
		}
		prefixes := make([]string, 0, len(dr.Paths))
		for p := range dr.Paths {
			prefixes = append(prefixes, p)
		}
		slices.Sort(prefixes)
		paths := make(map[string]*Route, min(len(prefixes), MaxPathsPerRoute))
		for _, p := range prefixes {
			target := dr.Paths[p]
			if why := invalidPrefix(p); why != "" {
				drops = append(drops, Drop{Host: r.Host, Entry: p, Reason: why})
				continue
			}
			tr := t.hosts[canonicalKey(target)]
			if tr == nil {
				drops = append(drops, Drop{Host: r.Host, Entry: p, Reason: fmt.Sprintf("target %q is not a route of this document", target)})
				continue
			}
			if len(paths) == MaxPathsPerRoute {
				drops = append(drops, Drop{Host: r.Host, Entry: p, Reason: fmt.Sprintf("more than %d prefixes", MaxPathsPerRoute)})
				continue
			}
			paths[p] = tr
		}
		if len(paths) > 0 {
			r.paths = paths
			t.prefixes += len(paths)
		}
	}

	t.denied = canonicalDenied(nil)
	if doc.API != nil {
		t.api = &Route{Host: "", Application: "", Upstreams: slices.Clone(doc.API.Upstreams), API: true}
		for _, h := range doc.API.Hosts {
			key := canonicalKey(h)
			if _, taken := t.hosts[key]; taken {
				// routing-and-ingress.md: application routes win over the apex.
				drops = append(drops, Drop{Host: key, Entry: h, Reason: "API host is also a route host, the route wins"})
				continue
			}
			if t.api.Host == "" {
				t.api.Host = key
			}
			t.hosts[key] = t.api
			t.apiHosts = append(t.apiHosts, key)
		}
		t.denied = canonicalDenied(doc.API.Denied)
	}
	return t, drops
}

// canonicalKey lower-cases a document host and drops one trailing dot, the
// same normalisation a request's Host gets.
func canonicalKey(h string) string {
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// invalidPrefix says why p cannot be a stored prefix, or "" when it can. A
// prefix is one bare segment with exactly one spelling (path-routing-design.md
// §2): no slash, no dot segment, nothing a request path would spell twice.
func invalidPrefix(p string) string {
	switch {
	case p == "":
		return "empty prefix"
	case p == "." || p == "..":
		return "dot-segment prefix"
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '/':
			return "prefix contains a slash (prefixes are bare segments)"
		case c == '\\', c == '%', c == '?', c == '#', c == ';':
			return fmt.Sprintf("prefix contains %q", c)
		case c < 0x21 || c == 0x7f:
			return "prefix contains a control or space character"
		}
	}
	return ""
}

// Routes returns the table's routes in document order. The slice is shared:
// callers must not modify it.
func (t *Table) Routes() []*Route { return t.routes }

// APIRoute returns the API apex route, or nil when the document publishes none.
func (t *Table) APIRoute() *Route { return t.api }

// APIHosts returns the hosts routed to the API apex.
func (t *Table) APIHosts() []string { return t.apiHosts }

// Denied returns the canonical denied prefixes enforced on API hosts.
func (t *Table) Denied() []string { return t.denied }

// PrefixCount returns the number of path prefixes kept across all routes.
func (t *Table) PrefixCount() int { return t.prefixes }

// Certifiable reports whether name may get a certificate: the document names
// it exactly, as a route host or an API host (docs/design.md rule 8). A wildcard
// key never approves issuance, nor does any name that only a wildcard covers.
func (t *Table) Certifiable(name string) bool {
	if t == nil {
		return false
	}
	key := canonicalKey(name)
	if strings.HasPrefix(key, "*") {
		return false
	}
	_, ok := t.hosts[key]
	return ok
}

// Fingerprint returns the fingerprint of the document the table was built from.
func (t *Table) Fingerprint() string { return t.fingerprint }

// FetchedAt returns when that document was fetched from its source.
func (t *Table) FetchedAt() time.Time { return t.fetchedAt }

// Live holds the table requests resolve against. Store swaps it atomically;
// a request keeps the table it loaded, so a swap never pauses traffic
// (docs/design.md rule 2). The zero value holds no table.
type Live struct {
	p atomic.Pointer[Table]
}

// Load returns the current table, or nil before the first document.
func (l *Live) Load() *Table { return l.p.Load() }

// Store makes t the current table.
func (l *Live) Store(t *Table) { l.p.Store(t) }
