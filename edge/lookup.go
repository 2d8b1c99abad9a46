package edge

import (
	"path"
	"strings"

	"github.com/scafo/scafo-edge/internal/hostname"
)

// Outcome is what resolving a request found.
type Outcome uint8

const (
	// NoRoute: the host is well formed but nothing names it (404).
	NoRoute Outcome = iota
	// Routed: Resolution.Route serves the request.
	Routed
	// BadHost: the Host header is empty or malformed (400).
	BadHost
	// Denied: an API host and a denied prefix; never proxied (403).
	Denied
)

// Resolution is the answer to Table.Resolve.
type Resolution struct {
	Outcome Outcome
	// Route is the route that serves the request: on a path hit, the
	// target route wholesale (docs/design.md rule 5). Set for Routed and Denied.
	Route *Route
	// Prefix is the prefix that selected Route on a path hit, else "".
	Prefix string
}

// Resolve finds the route for a request. host is the Host header as received
// (any case, optional :port, optional trailing dot). rawPath is the path of the
// request-URI exactly as it arrived (still percent-encoded); decodedPath is
// its percent-decoded form (url.URL.Path).
//
// Host lookup is exact, then the first label replaced by "*", once (docs/design.md
// rule 3). Only a route with a prefix map looks at the path (rule 4). On an API
// host the denied prefixes are checked on every spelling (rule 6).
//
// Resolve does not allocate for a lower- or upper-case host, or for a path hit
// on a path that is already clean.
func (t *Table) Resolve(host, rawPath, decodedPath string) Resolution {
	var buf [hostname.MaxLen]byte
	key, ok := hostname.Append(buf[:0], host)
	if !ok {
		return Resolution{Outcome: BadHost}
	}
	r := t.hosts[string(key)]
	if r == nil {
		if i := wildcardStart(key); i > 0 {
			key[i-1] = '*'
			r = t.hosts[string(key[i-1:])]
		}
	}
	if r == nil {
		return Resolution{Outcome: NoRoute}
	}
	if r.API {
		if deniedPath(t.denied, rawPath, decodedPath) {
			return Resolution{Outcome: Denied, Route: r}
		}
		return Resolution{Outcome: Routed, Route: r}
	}
	if r.paths == nil {
		return Resolution{Outcome: Routed, Route: r}
	}
	if target, prefix := r.matchPath(rawPath, decodedPath); target != nil {
		return Resolution{Outcome: Routed, Route: target, Prefix: prefix}
	}
	return Resolution{Outcome: Routed, Route: r}
}

// ResolveHost is the host-only form: whether some route or API host serves
// host at all, whatever the path. Decisions about a hostname (certificates,
// redirects) use it, so they never depend on which URL happened to ask
// (path-routing-design.md §6, "three call sites").
func (t *Table) ResolveHost(host string) *Route {
	var buf [hostname.MaxLen]byte
	key, ok := hostname.Append(buf[:0], host)
	if !ok {
		return nil
	}
	if r := t.hosts[string(key)]; r != nil {
		return r
	}
	if i := wildcardStart(key); i > 0 {
		key[i-1] = '*'
		return t.hosts[string(key[i-1:])]
	}
	return nil
}

// wildcardStart returns the index of the first '.' in key, where the
// one-label wildcard "*" + key[i:] would be built in place over key[i-1], or
// -1 when key has a single label. The byte before the dot exists because the
// first label is never empty.
func wildcardStart(key []byte) int {
	for i, c := range key {
		if c == '.' {
			if i == 0 || i == len(key)-1 {
				return -1
			}
			return i
		}
	}
	return -1
}

// matchPath looks the first path segment up in every spelling a backend
// might route on (path-routing-design.md §6): the normalised one (path.Clean
// of the decoded path) wins; then the decoded one with dot segments removed
// the RFC 3986 way; then the decoded one as it arrived; then the
// still-encoded one. For the two unnormalised spellings the first non-empty
// segment is taken, so a backend that collapses doubled slashes but keeps dot
// segments ("//paulca/../x") cannot answer a flipped account from the route
// it left; and the still-encoded one is also read with its dot segments
// resolved before it is decoded, as a backend that does so reads it. Taking a hit from any spelling errs toward the target route, the
// benign direction.
func (r *Route) matchPath(rawPath, decodedPath string) (*Route, string) {
	clean := decodedPath
	if needsClean(decodedPath) {
		clean = path.Clean("/" + decodedPath)
	}
	if seg := firstSegment(clean); seg != "" {
		if t := r.paths[seg]; t != nil {
			return t, seg
		}
	}
	if clean != decodedPath {
		// RFC 3986 dot removal keeps empty segments, so it can land on
		// another first segment than path.Clean: "/x/../paulca//.." is
		// "/paulca/" to such a backend and "/" to path.Clean.
		if seg := firstNonEmptySegment(removeDotSegments(decodedPath)); seg != "" {
			if t := r.paths[seg]; t != nil {
				return t, seg
			}
		}
	}
	if seg := firstNonEmptySegment(decodedPath); seg != "" {
		if t := r.paths[seg]; t != nil {
			return t, seg
		}
	}
	if rawPath != decodedPath {
		if seg := firstNonEmptySegment(rawPath); seg != "" {
			if t := r.paths[seg]; t != nil {
				return t, seg
			}
		}
		if needsClean(rawPath) {
			// A backend that resolves dot segments before it decodes:
			// "/./b%65ta%2f.." is "/beta/.." to it.
			for _, p := range [...]string{path.Clean("/" + rawPath), removeDotSegments(rawPath)} {
				d, _ := percentDecode(p)
				if seg := firstNonEmptySegment(d); seg != "" {
					if t := r.paths[seg]; t != nil {
						return t, seg
					}
				}
			}
		}
	}
	return nil, ""
}

// firstSegment returns the first segment of an absolute path at a segment
// boundary: "/paulca/x" and "/paulca" give "paulca", "//x" gives "".
func firstSegment(p string) string {
	if len(p) == 0 || p[0] != '/' {
		return ""
	}
	p = p[1:]
	if i := strings.IndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return p
}

// firstNonEmptySegment is firstSegment after collapsing leading slashes:
// "//x/y" gives "x".
func firstNonEmptySegment(p string) string {
	if len(p) == 0 || p[0] != '/' {
		return ""
	}
	return firstSegment(p[len(p)-len(strings.TrimLeft(p, "/"))-1:])
}

// needsClean reports whether path.Clean would change p, without allocating
// for the common clean path.
func needsClean(p string) bool {
	if len(p) == 0 || p[0] != '/' {
		return true
	}
	for i := 1; i < len(p); i++ {
		if p[i] != '/' && p[i] != '.' {
			continue
		}
		if p[i] == '/' && p[i-1] == '/' {
			return true
		}
		if p[i] == '.' && p[i-1] == '/' {
			// "/." or "/.." as a whole segment.
			j := i + 1
			if j < len(p) && p[j] == '.' {
				j++
			}
			if j == len(p) || p[j] == '/' {
				return true
			}
		}
	}
	return len(p) > 1 && p[len(p)-1] == '/'
}
