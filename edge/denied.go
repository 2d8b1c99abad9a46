package edge

import (
	"path"
	"strings"
	"unicode"
)

// maxSpellings bounds how many readings of one path a denied-prefix check
// explores. A path with more is refused outright: no real API call needs it,
// and stopping the search early must never mean "not denied".
const maxSpellings = 512

// canonicalDenied returns the denied prefixes to enforce: the document's plus
// the mandatory ones, each in canonical form, without duplicates.
func canonicalDenied(doc []string) []string {
	out := make([]string, 0, len(doc)+len(mandatoryDenied))
	add := func(p string) {
		c := canonicalDeniedPath(p)
		if c == "/" {
			return // denying "/" would deny the whole apex; treat it as a typo
		}
		for _, have := range out {
			if have == c {
				return
			}
		}
		out = append(out, c)
	}
	for _, p := range mandatoryDenied {
		add(p)
	}
	for _, p := range doc {
		add(p)
	}
	return out
}

// deniedPath reports whether a request path hits a denied prefix in any
// reading a backend might act on. It explores every combination, in any
// order, of the normalisations backends apply — percent-decoding (again and
// again), backslashes read as slashes, ";params" dropped from segments,
// doubled slashes merged, dot segments removed the RFC 3986 way, and
// path.Clean — on the path as it arrived and as Go decoded it, with ASCII
// case folded. Denying a reading the node would not have made costs nothing;
// missing one it would have made exposes private keys.
func deniedPath(denied []string, rawPath, decodedPath string) bool {
	if len(denied) == 0 {
		return false
	}
	if plainPath(rawPath) && plainPath(decodedPath) {
		// Nothing to normalise: the common case costs no allocation.
		return matchDeniedFold(denied, rawPath) || matchDeniedFold(denied, decodedPath)
	}
	seen := make(map[string]bool, 16)
	queue := []string{strings.ToLower(rawPath), strings.ToLower(decodedPath)}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if seen[p] {
			continue
		}
		if len(seen) == maxSpellings {
			return true
		}
		seen[p] = true
		if matchDenied(denied, rooted(p)) {
			return true
		}
		for _, op := range spellingOps {
			if q := op(p); q != p && !seen[q] {
				queue = append(queue, q)
			}
		}
	}
	return false
}

// spellingOps are the normalisations deniedPath composes.
var spellingOps = [...]func(string) string{
	func(p string) string { d, _ := percentDecode(p); return strings.ToLower(d) },
	func(p string) string { return strings.ReplaceAll(p, "\\", "/") },
	stripParams,
	mergeSlashes,
	func(p string) string { return removeDotSegments(rooted(p)) },
	func(p string) string { return path.Clean(rooted(p)) },
	cutAtTerminator,
	trimSegmentEnds,
}

// cutAtTerminator drops what follows a byte a backend may read as the
// path's end once decoded: a NUL (C strings), or "?" and "#" (a backend
// that decodes before it splits the query or fragment off: %3f, %23).
func cutAtTerminator(p string) string {
	if i := strings.IndexAny(p, "\x00?#"); i >= 0 {
		return p[:i]
	}
	return p
}

// trimSegmentEnds drops the dots and white space that end a segment, as
// Windows file APIs (and IIS) and servers that trim what they decoded do
// (Java's trim, Python's strip, Go's TrimSpace): "storage.", "storage%20"
// and "storage%0d" are "storage" there. A segment that trimming white space
// alone leaves "." or ".." keeps that, for the dot segments to resolve.
func trimSegmentEnds(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if ws := strings.TrimRightFunc(s, isTrimmedSpace); ws == "." || ws == ".." {
			segs[i] = ws
			continue
		}
		segs[i] = strings.TrimRightFunc(s, func(r rune) bool { return r == '.' || isTrimmedSpace(r) })
	}
	return strings.Join(segs, "/")
}

// isTrimmedSpace reports whether some common server trims r from the end
// of what it decoded: control bytes, space, DEL, and Unicode white space.
func isTrimmedSpace(r rune) bool {
	return r <= ' ' || r == 0x7f || unicode.IsSpace(r)
}

// plainPath reports whether no normalisation could change p's segments.
func plainPath(p string) bool {
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c >= 0x7f {
			return false // trimmed, or white space once decoded (trimSegmentEnds)
		}
		switch p[i] {
		case '%', '\\', ';', '.', '?', '#':
			return false
		case '/':
			if i > 0 && p[i-1] == '/' {
				return false
			}
		}
	}
	return true
}

// matchDeniedFold is matchDenied for a plain path, folding ASCII case
// without allocating.
func matchDeniedFold(denied []string, p string) bool {
	rootless := !strings.HasPrefix(p, "/") // read as rooted, as a backend would
	for _, d := range denied {
		if rootless {
			d = d[1:]
		}
		if len(p) >= len(d) && strings.EqualFold(p[:len(d)], d) && (len(p) == len(d) || p[len(d)] == '/') {
			return true
		}
	}
	return false
}

func rooted(p string) string {
	if strings.HasPrefix(p, "/") {
		return p
	}
	return "/" + p
}

// matchDenied reports whether the canonical path c is a denied prefix or lies
// below one, at a segment boundary.
func matchDenied(denied []string, c string) bool {
	for _, d := range denied {
		if c == d || (len(c) > len(d) && c[len(d)] == '/' && c[:len(d)] == d) {
			return true
		}
	}
	return false
}

// foldDeniedPath folds every spelling difference at once: case,
// backslashes for slashes, ";params" on segments. The result is rooted. It is
// the form denied prefixes are stored in.
func foldDeniedPath(p string) string {
	p = stripParams(strings.ToLower(strings.ReplaceAll(p, "\\", "/")))
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	return p
}

// stripParams drops ";params" from every segment, as servlet containers do.
func stripParams(p string) string {
	if strings.IndexByte(p, ';') < 0 {
		return p
	}
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if j := strings.IndexByte(s, ';'); j >= 0 {
			segs[i] = s[:j]
		}
	}
	return strings.Join(segs, "/")
}

// canonicalDeniedPath is the form denied prefixes are stored in: folded and
// cleaned.
func canonicalDeniedPath(p string) string {
	return path.Clean(foldDeniedPath(p))
}

// mergeSlashes replaces every run of slashes with one.
func mergeSlashes(p string) string {
	if !strings.Contains(p, "//") {
		return p
	}
	var b strings.Builder
	b.Grow(len(p))
	for i := 0; i < len(p); i++ {
		if p[i] == '/' && i > 0 && p[i-1] == '/' {
			continue
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

// removeDotSegments resolves "." and ".." segments as RFC 3986 §5.2.4 does:
// unlike path.Clean it keeps empty segments, so "/v1//../storage" is
// "/v1/storage" rather than "/storage". Backends that resolve references the
// RFC's way (url.ResolveReference, Jetty) read paths like this.
func removeDotSegments(p string) string {
	if !strings.Contains(p, ".") {
		return p
	}
	segs := strings.Split(p, "/")
	out := make([]string, 0, len(segs))
	for i, s := range segs {
		last := i == len(segs)-1
		switch s {
		case ".":
			if last {
				out = append(out, "")
			}
		case "..":
			if len(out) > 1 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, s)
		}
	}
	return strings.Join(out, "/")
}

// percentDecode decodes every valid %XX escape of s and leaves invalid ones
// as they are (url.PathUnescape would refuse the whole string, and a refusal
// must not turn into "not denied").
func percentDecode(s string) (string, bool) {
	if strings.IndexByte(s, '%') < 0 {
		return s, false
	}
	var b strings.Builder
	b.Grow(len(s))
	changed := false
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
			changed = true
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String(), changed
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

// DeniedPath reports whether a request path on an API host is refused by t.
// It exists for tests and surfaces; Resolve applies it on the request path.
func (t *Table) DeniedPath(rawPath, decodedPath string) bool {
	return deniedPath(t.denied, rawPath, decodedPath)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
