package node

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseAcceptsTestdata(t *testing.T) {
	files, err := filepath.Glob("testdata/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata documents: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			body, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			doc, err := Parse(body)
			if err != nil {
				t.Fatalf("Parse(%s) = %v, want a document", f, err)
			}
			if doc.V != 1 || doc.Routes == nil {
				t.Fatalf("Parse(%s) = %+v, want v 1 and non-nil routes", f, doc)
			}
		})
	}
}

func TestParseSpecExample(t *testing.T) {
	body, err := os.ReadFile("testdata/spec.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := Parse(body)
	if err != nil {
		t.Fatal(err)
	}
	r := doc.Routes[0]
	if r.Host != "shop.apps.example.com" || r.Application != "shop" || len(r.Upstreams) != 2 ||
		r.Upstreams[1] != (Upstream{Node: "vps-b", Address: "10.83.0.2:24902"}) {
		t.Errorf("route = %+v", r)
	}
	if doc.API == nil || doc.API.Hosts[0] != "apps.example.com" || len(doc.API.Denied) != 2 ||
		doc.API.Upstreams[0].Address != "10.83.0.1:7400" {
		t.Errorf("api = %+v", doc.API)
	}
}

// doc builds a one-route document body with the route's fields replaced.
func oneRoute(host, addr string) string {
	return `{"v":1,"routes":[{"host":` + quote(host) + `,"application":"a","upstreams":[{"node":"n","address":` + quote(addr) + `}]}]}`
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

func TestParseAccepts(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"an empty fleet is a valid statement", `{"v":1,"routes":[]}`},
		{"a wildcard key is one leading label", oneRoute("*.tito.page", "10.0.0.1:1")},
		{"upper case and a trailing dot are valid DNS spellings", oneRoute("Shop.Example.COM.", "10.0.0.1:80")},
		{"a single-label host is a valid name", oneRoute("localhost", "127.0.0.1:8080")},
		{"a leading digit is allowed since RFC 1123", oneRoute("1password.example", "10.0.0.1:443")},
		{"an upstream may be named by DNS", oneRoute("a.example", "backend.internal:8080")},
		{"an upstream may be IPv6", oneRoute("a.example", "[fd00::1]:65535")},
		{"a route without upstreams is kept for the edge to answer 502", `{"v":1,"routes":[{"host":"a.example","application":"a","upstreams":[]}]}`},
		{"unknown fields are ignored so the document can grow", `{"v":1,"routes":[],"fleet":"x","routes_extra":[1]}`},
		{"bad path prefixes are left to edge.Compile to drop", `{"v":1,"routes":[{"host":"a.example","application":"a","upstreams":[],"paths":{"/x":"nowhere.example","..":"a.example"}}]}`},
		{"whitespace around the object is not trailing data", " \n{\"v\":1,\"routes\":[]}\n\t "},
		{"api without hosts is valid", `{"v":1,"routes":[],"api":{"hosts":[],"upstreams":[],"denied":[]}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Parse([]byte(tc.body)); err != nil {
				t.Errorf("Parse(%s) = %v, want a document", tc.body, err)
			}
		})
	}
}

func TestParseRefuses(t *testing.T) {
	long := strings.Repeat("a", 64)
	longName := strings.Repeat(strings.Repeat("b", 60)+".", 5) + "example"
	for _, tc := range []struct {
		name, body string
		want       string // a substring the error must contain
	}{
		{"an empty body", ``, "empty body"},
		{"malformed JSON", `{"v":1,"routes":[`, "decode json"},
		{"a JSON array", `[]`, "decode json"},
		{"trailing data after the object", `{"v":1,"routes":[]} {"v":1}`, "trailing data"},
		{"trailing garbage after the object", `{"v":1,"routes":[]}<html>`, "trailing data"},
		{"a missing version", `{"routes":[]}`, "v is 0"},
		{"version 2", `{"v":2,"routes":[]}`, "v is 2"},
		{"a version of the wrong type", `{"v":"1","routes":[]}`, "decode json"},
		{"missing routes", `{"v":1}`, "routes is missing"},
		{"null routes", `{"v":1,"routes":null}`, "routes is missing"},
		{"an empty host", oneRoute("", "10.0.0.1:1"), `routes[0].host ""`},
		{"a host with a space", oneRoute("a b.example", "10.0.0.1:1"), "routes[0].host"},
		{"a host with an underscore", oneRoute("a_b.example", "10.0.0.1:1"), `character '_'`},
		{"a host with an empty label", oneRoute("a..example", "10.0.0.1:1"), "empty label"},
		{"a host starting with a dot", oneRoute(".example", "10.0.0.1:1"), "empty label"},
		{"a host with two trailing dots", oneRoute("a.example..", "10.0.0.1:1"), "empty label"},
		{"a label starting with a hyphen", oneRoute("-a.example", "10.0.0.1:1"), "hyphen"},
		{"a label ending with a hyphen", oneRoute("a-.example", "10.0.0.1:1"), "hyphen"},
		{"a label over 63 characters", oneRoute(long+".example", "10.0.0.1:1"), "over 63"},
		{"a name over 253 characters", oneRoute(longName, "10.0.0.1:1"), "over 253"},
		{"a host with a port", oneRoute("a.example:443", "10.0.0.1:1"), "character ':'"},
		{"a host with a path", oneRoute("a.example/x", "10.0.0.1:1"), "character '/'"},
		{"an IP address as host", oneRoute("10.0.0.1", "10.0.0.1:1"), "numeric"},
		{"a non-ASCII host", oneRoute("bücher.example", "10.0.0.1:1"), "routes[0].host"},
		{"a bare wildcard", oneRoute("*", "10.0.0.1:1"), "routes[0].host"},
		{"a wildcard with nothing after it", oneRoute("*.", "10.0.0.1:1"), "empty name"},
		{"two wildcard labels", oneRoute("*.*.example", "10.0.0.1:1"), "wildcard"},
		{"a wildcard below the first label", oneRoute("a.*.example", "10.0.0.1:1"), "wildcard"},
		{"a partial wildcard label", oneRoute("a*.example", "10.0.0.1:1"), "wildcard"},
		{"an address without a port", oneRoute("a.example", "10.0.0.1"), "upstreams[0].address"},
		{"an address with port 0", oneRoute("a.example", "10.0.0.1:0"), "not 1-65535"},
		{"an address with port 65536", oneRoute("a.example", "10.0.0.1:65536"), "not 1-65535"},
		{"an address with a named port", oneRoute("a.example", "10.0.0.1:http"), "not 1-65535"},
		{"an address with a negative port", oneRoute("a.example", "10.0.0.1:-1"), "not 1-65535"},
		{"an address without a host", oneRoute("a.example", ":8080"), "empty host"},
		{"an empty address", oneRoute("a.example", ""), "upstreams[0].address"},
		{"an address that is a URL", oneRoute("a.example", "http://10.0.0.1:80"), "upstreams[0].address"},
		{"an unbracketed IPv6 address", oneRoute("a.example", "fd00::1:80"), "upstreams[0].address"},
		{"the same host twice", `{"v":1,"routes":[` +
			`{"host":"a.example","application":"a","upstreams":[]},` +
			`{"host":"b.example","application":"b","upstreams":[]},` +
			`{"host":"A.example.","application":"c","upstreams":[]}]}`, `routes[2].host "A.example.": duplicates routes[0]`},
		{"the second upstream of a later route is named", `{"v":1,"routes":[` +
			`{"host":"a.example","application":"a","upstreams":[]},` +
			`{"host":"b.example","application":"b","upstreams":[{"node":"n","address":"10.0.0.1:1"},{"node":"m","address":"nope"}]}]}`,
			`routes[1] (host "b.example"): upstreams[1].address "nope"`},
		{"an invalid API host", `{"v":1,"routes":[],"api":{"hosts":["ok.example","bad host"],"upstreams":[],"denied":[]}}`, `api.hosts[1] "bad host"`},
		{"a wildcard API host", `{"v":1,"routes":[],"api":{"hosts":["*.example.com"],"upstreams":[],"denied":[]}}`, "api.hosts[0]"},
		{"an invalid API upstream", `{"v":1,"routes":[],"api":{"hosts":[],"upstreams":[{"node":"n","address":"x"}],"denied":[]}}`, "api.upstreams[0].address"},
		{"a denied prefix without its slash", `{"v":1,"routes":[],"api":{"hosts":[],"upstreams":[],"denied":["v1/storage"]}}`, `api.denied[0] "v1/storage"`},
		{"routes of the wrong type", `{"v":1,"routes":{}}`, "decode json"},
		{"paths of the wrong type", `{"v":1,"routes":[{"host":"a.example","application":"a","upstreams":[],"paths":["x"]}]}`, "decode json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := Parse([]byte(tc.body))
			if err == nil {
				t.Fatalf("Parse(%s) = %+v, want an error containing %q", tc.body, doc, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse(%s) error = %q, want it to contain %q", tc.body, err, tc.want)
			}
		})
	}
}

func TestParseRefusesOversizedBody(t *testing.T) {
	// Parse refuses on the length alone, before decoding a byte.
	if _, err := Parse(make([]byte, MaxDocumentSize+1)); err == nil || !strings.Contains(err.Error(), "over the 67108864 byte limit") {
		t.Errorf("Parse(MaxDocumentSize+1 bytes) = %v, want the size limit named", err)
	}
	// The limit is inclusive; decoding 64 MiB under -race takes seconds, so
	// the boundary is shown on a small limit. Padding whitespace makes a
	// valid document of any size.
	small := append([]byte(`{"v":1,"routes":[]}`), bytes.Repeat([]byte(" "), 81)...)
	if _, err := parse(small, 100); err != nil {
		t.Errorf("parse(100 bytes, limit 100) = %v, want a document", err)
	}
	if _, err := parse(small, 99); err == nil {
		t.Error("parse(100 bytes, limit 99) succeeded, want a refusal")
	}
}

func TestFingerprintIsSHA256OfTheBytes(t *testing.T) {
	// The well-known SHA-256 of the empty string.
	if got, want := Fingerprint(nil), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"; got != want {
		t.Errorf("Fingerprint(nil) = %s, want %s", got, want)
	}
	if Fingerprint([]byte(`{"v":1,"routes":[]}`)) == Fingerprint([]byte(`{"v":1, "routes":[]}`)) {
		t.Error("Fingerprint ignores a byte of difference")
	}
}

// FuzzParse checks that Parse never panics, and that what it accepts
// survives a marshal and re-parse unchanged (so persisting a parsed
// document, or serving it from nodetest, loses nothing).
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.json")
	for _, file := range files {
		if b, err := os.ReadFile(file); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		doc, err := Parse(body)
		if err != nil {
			return
		}
		again, err := json.Marshal(doc)
		if err != nil {
			t.Fatalf("marshal a parsed document: %v", err)
		}
		doc2, err := Parse(again)
		if err != nil {
			t.Fatalf("re-parse of a marshalled document: %v\n%s", err, again)
		}
		third, _ := json.Marshal(doc2)
		if !bytes.Equal(again, third) {
			t.Fatalf("marshal is not stable:\n%s\n%s", again, third)
		}
	})
}
