package hostname

import (
	"strings"
	"testing"
)

func TestNormalise(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		ok             bool
	}{
		{"upper case is folded", "Example.COM", "example.com", true},
		{"a port is dropped", "example.com:8080", "example.com", true},
		{"one trailing dot is dropped", "example.com.", "example.com", true},
		{"a trailing dot before a port is dropped", "example.com.:443", "example.com", true},
		{"an underscore is kept, as some hosts carry one", "a_b.example", "a_b.example", true},
		{"an IPv6 literal keeps its brackets and loses its port", "[::1]:443", "[::1]", true},
		{"an IPv6 literal is folded to lower case", "[::A]", "[::a]", true},
		{"empty is malformed", "", "", false},
		{"a lone dot is malformed", ".", "", false},
		{"two trailing dots are malformed", "a.b..", "", false},
		{"an empty label is malformed", "a..b", "", false},
		{"a wildcard key is no client's host", "*.example.com", "", false},
		{"a port of letters is malformed", "example.com:https", "", false},
		{"a second colon is malformed", "a:b:c", "", false},
		{"an unclosed bracket is malformed", "[::1", "", false},
		{"a label over 63 characters is malformed", strings.Repeat("a", 64) + ".example", "", false},
		{"a name over 253 characters is malformed", strings.Repeat("a.", 127) + "ab", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Normalise(tc.in)
			if got != tc.want || ok != tc.ok {
				t.Errorf("Normalise(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestAppendAllocatesNothing(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() {
		var buf [MaxLen]byte
		Append(buf[:0], "Shop.Example.COM.:443")
	}); n != 0 {
		t.Errorf("Append allocated %v times, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { Normalise("shop.example.com") }); n != 0 {
		t.Errorf("Normalise of a normal host allocated %v times, want 0", n)
	}
}

func FuzzNormalise(f *testing.F) {
	for _, s := range []string{"shop.apps.example.com", "SHOP.example.com:443", "a.b.", "[::1]:80", "", ".", "a..b", "*.x", "a:b:c", "xn--bcher-kva.example"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		key, ok := Normalise(host)
		if !ok {
			return
		}
		if key != strings.ToLower(key) {
			t.Fatalf("Normalise(%q) = %q, not lower-case", host, key)
		}
		if strings.HasSuffix(key, ".") || strings.Contains(key, "*") {
			t.Fatalf("Normalise(%q) = %q, trailing dot or wildcard", host, key)
		}
		if again, ok := Normalise(key); !ok || again != key {
			t.Fatalf("Normalise is not idempotent: %q -> %q -> %q (%v)", host, key, again, ok)
		}
	})
}
