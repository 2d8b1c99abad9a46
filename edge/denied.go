package edge

import (
	"path"
	"strings"
)

// maxDecodeRounds bounds how many times a denied-prefix check percent-decodes
// a path: "%2573" is "%73" after one round and "s" after two. A backend that
// double-decodes must not be handed a denied path in disguise.
const maxDecodeRounds = 3

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

// deniedPath reports whether a request path hits a denied prefix in any of
// the spellings a backend might act on: as it arrived and percent-decoded
// (up to maxDecodeRounds times); each of those as sent, with doubled slashes
// merged, with dot segments removed the RFC 3986 way (empty segments kept),
// and cleaned by path.Clean (slashes merged first); always with backslashes
// read as slashes, ";params" dropped from segments and ASCII case folded.
// Denying a spelling the node would not have honoured costs nothing; missing
// one it would have honoured exposes private keys.
func deniedPath(denied []string, rawPath, decodedPath string) bool {
	if len(denied) == 0 {
		return false
	}
	for _, p := range [2]string{rawPath, decodedPath} {
		for range maxDecodeRounds + 1 {
			if deniedAnySpelling(denied, p) {
				return true
			}
			next, changed := percentDecode(p)
			if !changed {
				break
			}
			p = next
		}
	}
	return false
}

// deniedAnySpelling checks one decoding of a path in every normalisation a
// backend might apply to it.
func deniedAnySpelling(denied []string, p string) bool {
	f := foldDeniedPath(p)
	if matchDenied(denied, f) || matchDenied(denied, path.Clean(f)) {
		return true
	}
	merged := mergeSlashes(f)
	if matchDenied(denied, merged) || matchDenied(denied, removeDotSegments(merged)) {
		return true
	}
	// After RFC 3986 dot removal, path.Clean only merges the slashes left.
	dots := removeDotSegments(f)
	return matchDenied(denied, dots) || matchDenied(denied, path.Clean(dots))
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

// foldDeniedPath folds the spelling differences no backend cares about:
// case, backslashes for slashes, ";params" on segments. The result is rooted.
func foldDeniedPath(p string) string {
	p = strings.ToLower(strings.ReplaceAll(p, "\\", "/"))
	if strings.IndexByte(p, ';') >= 0 {
		segs := strings.Split(p, "/")
		for i, s := range segs {
			if j := strings.IndexByte(s, ';'); j >= 0 {
				segs[i] = s[:j]
			}
		}
		p = strings.Join(segs, "/")
	}
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	return p
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
