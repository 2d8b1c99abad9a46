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
	// Operator reports whether the operator routes file wrote this route
	// (--operator-routes), rather than the node's document.
	Operator bool

	// paths maps a bare first segment to the target route; nil when the
	// route has no prefix map, so a plain host costs one nil check.
	paths map[string]*Route
	// policy is what the operator file adds (policy.go); nil for every
	// node route, so a node route costs one nil check.
	policy *policy
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

	// conflicts are the hosts both documents name, served by the
	// operator's route (CompileWith).
	conflicts []Conflict

	// Set by Updater.Apply before the table is published.
	fingerprint string
	fetchedAt   time.Time
	operatorFP  string // fingerprint of the operator file; "" without one
}

// Compile builds a Table from a parsed document. Entries that are wrong on
// their own (a bad path prefix, a path target that is not a route of the
// document, prefixes beyond MaxPathsPerRoute, a duplicate host, an API host a
// route also names) are left out and reported as drops; the rest is kept.
func Compile(doc *node.Document) (*Table, []Drop) {
	t, drops, _ := compile(doc, nil, nil)
	return t, drops
}

// CompileWith builds one Table from the node's document and the operator's
// routes file (nil: Compile). The operator's routes are never rewritten by
// the node's (routing-and-ingress.md: "operator-authored routes in the
// ingress configuration are never rewritten"):
//   - for every host key both name (an exact host, or the same "*.<base>"
//     key), the operator's route is served and the node's is left out,
//     reported as a Conflict;
//   - keys that differ are resolved as ever (docs/design.md rule 3): an
//     exact host beats the wildcard enclosing it, whoever wrote either. A
//     node's exact host under an operator's "*.<base>" stays the node's
//     unless the operator names it exactly, and a node's wildcard never
//     reaches an operator's exact host;
//   - the API apex and its denied prefixes stay the node's: an operator
//     route for an API host is refused (a Drop naming it), and a path
//     target is only ever a route, never the apex, so no path map leads
//     into a denied prefix;
//   - path targets of either file may name a route of either: a node's
//     prefix may lead into an operator's host, which then answers as
//     itself (its redirect, allow list and basic auth included).
func CompileWith(doc *node.Document, op *node.OperatorDocument) (*Table, []Drop, []Conflict) {
	return compile(doc, op, newVerifier())
}

// compile is CompileWith with the verifier basic auth checks passwords
// with (nil when op is).
func compile(doc *node.Document, op *node.OperatorDocument, v *verifier) (*Table, []Drop, []Conflict) {
	var opRoutes []node.OperatorRoute
	if op != nil {
		opRoutes = op.Routes
	}
	t := &Table{hosts: make(map[string]*Route, len(doc.Routes)+len(opRoutes)+4)}
	var drops []Drop
	var conflicts []Conflict

	var apiKeys map[string]bool
	if doc.API != nil && len(opRoutes) > 0 {
		apiKeys = make(map[string]bool, len(doc.API.Hosts))
		for _, h := range doc.API.Hosts {
			apiKeys[canonicalKey(h)] = true
		}
	}
	// The operator's routes take their keys first: the node's cannot
	// displace them.
	opKept := make([]*Route, len(opRoutes))
	for i := range opRoutes {
		or := &opRoutes[i]
		key := canonicalKey(or.Host)
		if apiKeys[key] {
			drops = append(drops, Drop{Host: key, Entry: or.Host, Reason: "operator route for an API host refused: the API apex and its denied prefixes are the node's (docs/design.md rule 6)"})
			continue
		}
		if _, dup := t.hosts[key]; dup {
			drops = append(drops, Drop{Host: key, Entry: or.Host, Reason: "duplicate operator host, first wins"})
			continue
		}
		app := or.Application
		if app == "" {
			app = key
		}
		r := &Route{Host: key, Application: app, Upstreams: slices.Clone(or.Upstreams), Operator: true, policy: newPolicy(key, or, v)}
		t.hosts[key] = r
		opKept[i] = r
	}

	kept := make([]*Route, len(doc.Routes)) // nil where a duplicate lost
	for i, dr := range doc.Routes {
		key := canonicalKey(dr.Host)
		if prev, dup := t.hosts[key]; dup {
			if prev.Operator {
				conflicts = append(conflicts, Conflict{Host: key, NodeApplication: dr.Application, OperatorApplication: prev.Application})
				continue
			}
			drops = append(drops, Drop{Host: key, Entry: dr.Host, Reason: "duplicate host, first wins"})
			continue
		}
		r := &Route{Host: key, Application: dr.Application, Upstreams: slices.Clone(dr.Upstreams)}
		t.hosts[key] = r
		t.routes = append(t.routes, r)
		kept[i] = r
	}
	for _, r := range opKept {
		if r != nil {
			t.routes = append(t.routes, r)
		}
	}

	// Targets resolve to routes only (never the API apex, added below); a
	// target's own prefix map is never consulted again, so a hit cannot
	// chain or loop.
	for i, dr := range doc.Routes {
		if kept[i] != nil {
			drops = t.compilePaths(kept[i], dr.Paths, drops)
		}
	}
	for i := range opRoutes {
		if opKept[i] != nil {
			drops = t.compilePaths(opKept[i], opRoutes[i].Paths, drops)
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
	t.conflicts = conflicts
	return t, drops, conflicts
}

// compilePaths gives r the prefix map of its document entry, dropping the
// prefixes that are wrong on their own.
func (t *Table) compilePaths(r *Route, docPaths map[string]string, drops []Drop) []Drop {
	if len(docPaths) == 0 {
		return drops
	}
	prefixes := make([]string, 0, len(docPaths))
	for p := range docPaths {
		prefixes = append(prefixes, p)
	}
	slices.Sort(prefixes)
	paths := make(map[string]*Route, min(len(prefixes), MaxPathsPerRoute))
	for _, p := range prefixes {
		target := docPaths[p]
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
	return drops
}

// Conflict is a host key both the node's document and the operator's file
// name: the operator's route serves it, the node's is left out.
type Conflict struct {
	Host                string // the key both name
	NodeApplication     string // what the node's document wanted there
	OperatorApplication string // what serves it
}

func (c Conflict) String() string {
	return fmt.Sprintf("%s: the operator's route (%s) serves it, not the node's (%s)", c.Host, c.OperatorApplication, c.NodeApplication)
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

// Conflicts returns the host keys both the node's document and the operator
// file name, served by the operator's routes. The slice is shared: callers
// must not modify it.
func (t *Table) Conflicts() []Conflict { return t.conflicts }

// OperatorFingerprint returns the fingerprint of the operator routes file
// the table was built with, or "" when none.
func (t *Table) OperatorFingerprint() string { return t.operatorFP }

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
