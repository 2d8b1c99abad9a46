package edge

import (
	"strings"
	"testing"
)

// FuzzResolve checks the two invariants of path-routing-design.md §6 on
// attacker-shaped paths: a path whose normalised first segment is a flipped
// account never resolves to the route it was flipped away from, and Resolve
// never panics.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{"/paulca", "//paulca/foo", "/paulca/../bob", "/%2e%2e/bob", "/paulca%2ffoo", "/paulcarson", "/", "", "/./paulca", "/a/../../paulca"} {
		f.Add("ti.to", s)
	}
	tbl, _ := Compile(testDocument())
	f.Fuzz(func(t *testing.T, host, raw string) {
		decoded, ok := decodeForTest(raw)
		if !ok {
			decoded = raw
		}
		res := tbl.Resolve(host, raw, decoded)
		if res.Outcome == Routed && res.Route == nil {
			t.Fatalf("Resolve(%q, %q) routed to nil", host, raw)
		}
		if res.Outcome != Routed || res.Route.Host != "ti.to" {
			return
		}
		clean := decoded
		if needsClean(clean) {
			clean = cleanForTest(clean)
		}
		if seg := firstSegment(clean); seg == "paulca" || seg == "bob" || seg == "beta" {
			t.Fatalf("Resolve(ti.to, %q) stayed on the legacy route though %q is flipped", raw, seg)
		}
		if seg := firstNonEmptySegment(decoded); seg == "paulca" || seg == "bob" || seg == "beta" {
			t.Fatalf("Resolve(ti.to, %q) stayed on the legacy route though raw %q is flipped", raw, seg)
		}
	})
}

// FuzzDeniedPath checks that no spelling of a denied prefix that a backend
// could read back as the prefix gets through: if the fully decoded, cleaned,
// case-folded path, cut at a NUL, "?" or "#" and with its segments' trailing
// dots and spaces trimmed, lies under a denied prefix, the request is
// denied. It starts from the bypass corpus the tests send.
func FuzzDeniedPath(f *testing.F) {
	for _, s := range []string{"/v1/storage", "//v1/storage", "/v1/./storage", "/v1/x/../storage", "/v1/%73torage", "/v1/storage%2fobjects", "/v1/storagex", "/V1/STORAGE", "/v1;a/storage", "/v1\\storage"} {
		f.Add(s)
	}
	for _, s := range loadBypassCorpus(f, "denied.txt") {
		f.Add(s)
	}
	tbl, _ := Compile(testDocument())
	f.Fuzz(func(t *testing.T, raw string) {
		decoded, ok := decodeForTest(raw)
		if !ok {
			decoded = raw
		}
		denied := tbl.Resolve("apps.example.com", raw, decoded).Outcome == Denied
		once, _ := percentDecode(raw)
		if matchDenied(tbl.denied, canonicalDeniedPath(once)) && !denied {
			t.Fatalf("path %q (decoded %q) reaches a denied prefix but was not denied", raw, once)
		}
		if matchDenied(tbl.denied, canonicalDeniedPath(trimSegmentEnds(cutAtTerminator(once)))) && !denied {
			t.Fatalf("path %q (decoded %q) reaches a denied prefix but was not denied", raw, once)
		}
		if strings.HasPrefix(raw, "/v1/apps") && !strings.ContainsAny(raw, "%.\\;/") && denied {
			t.Fatalf("plain path %q was denied", raw)
		}
	})
}
