package forwarded

import (
	"net/netip"
	"testing"
)

func TestClient(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, tc := range []struct {
		name    string
		xff     []string
		want    string
		vouched bool
		err     bool
	}{
		{"none named", nil, "invalid IP", false, false},
		{"one client", []string{"11.0.0.9"}, "11.0.0.9", true, false},
		{"rightmost untrusted wins over a forged left", []string{"1.2.3.4, 11.0.0.9, 10.0.0.2"}, "11.0.0.9", true, false},
		{"across header lines", []string{"11.0.0.9", "10.0.0.2", "10.0.0.3"}, "11.0.0.9", true, false},
		{"all trusted: the leftmost", []string{"10.0.0.1, 10.0.0.2"}, "10.0.0.1", false, false},
		{"mapped and zoned are plain", []string{"::ffff:11.0.0.9"}, "11.0.0.9", true, false},
		{"a zone is dropped", []string{"fe80::1%eth0"}, "fe80::1", true, false},
		{"garbage", []string{"11.0.0.9, nonsense"}, "", false, true},
		{"an empty entry", []string{"11.0.0.9,"}, "", false, true},
		{"a port is no address", []string{"11.0.0.9:1234"}, "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, vouched, err := Client(tc.xff, trusted)
			if (err != nil) != tc.err {
				t.Fatalf("err = %v, want error %v", err, tc.err)
			}
			if tc.err {
				return
			}
			if got.String() != tc.want || vouched != tc.vouched {
				t.Errorf("Client(%q) = %v, %v; want %s, %v", tc.xff, got, vouched, tc.want, tc.vouched)
			}
		})
	}
}

func TestOrigin(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, tc := range []struct {
		name, remote string
		xff          []string
		want         string
	}{
		{"an untrusted peer is the client, whatever it forwards", "192.0.2.1:5000", []string{"203.0.113.9"}, "192.0.2.1"},
		{"a trusted peer's vouched client", "10.0.0.2:5000", []string{"6.6.6.6, 203.0.113.9"}, "203.0.113.9"},
		{"a trusted peer that names nobody is the client", "10.0.0.2:5000", nil, "10.0.0.2"},
		{"a trusted peer that names only proxies is the client", "10.0.0.2:5000", []string{"10.0.0.3"}, "10.0.0.2"},
		{"a trusted peer that names garbage is the client", "10.0.0.2:5000", []string{"203.0.113.9, nonsense"}, "10.0.0.2"},
		{"a mapped peer is unmapped", "[::ffff:192.0.2.1]:5000", nil, "192.0.2.1"},
		{"a peer that is no address is none", "@", []string{"203.0.113.9"}, "invalid IP"},
		{"an IPv6 peer", "[2001:db8::1]:443", nil, "2001:db8::1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Origin(tc.remote, tc.xff, trusted); got.String() != tc.want {
				t.Errorf("Origin(%q, %q) = %v, want %s", tc.remote, tc.xff, got, tc.want)
			}
		})
	}
}
