package admin

import (
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// accessRequest is one request to the admin listener: who sends it (the TCP
// peer), what X-Forwarded-For it carries, and its Authorization header.
type accessRequest struct {
	remote string
	xff    []string
	auth   string
}

func (q accessRequest) serve(t *testing.T, a *Server, path string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest("GET", "http://admin"+path, nil)
	req.RemoteAddr = q.remote
	for _, v := range q.xff {
		req.Header.Add("X-Forwarded-For", v)
	}
	if q.auth != "" {
		req.Header.Set("Authorization", q.auth)
	}
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, req)
	return rec
}

// accessServer is the fixture's admin server with the default allow list
// ("private") and one trusted proxy network, 198.51.100.0/24.
func accessServer(t *testing.T, allow string) *Server {
	t.Helper()
	f := newStatusFixture(t)
	a := *f.admin
	var err error
	if a.MetricsFrom, err = ParseAllow(allow); err != nil {
		t.Fatalf("ParseAllow(%q): %v", allow, err)
	}
	a.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	return &a
}

func TestMetricsGoToPrivateNetworksAndTheToken(t *testing.T) {
	a := accessServer(t, "private")
	bearer := "Bearer " + statusToken
	cases := []struct {
		name string
		req  accessRequest
		want int
	}{
		{"IPv4 loopback", accessRequest{remote: "127.0.0.1:50000"}, 200},
		{"anywhere in 127.0.0.0/8", accessRequest{remote: "127.9.9.9:50000"}, 200},
		{"IPv6 loopback", accessRequest{remote: "[::1]:50000"}, 200},
		{"RFC 1918 10/8", accessRequest{remote: "10.0.0.9:50000"}, 200},
		{"RFC 1918 172.16/12, last address", accessRequest{remote: "172.31.255.255:50000"}, 200},
		{"just past 172.16/12", accessRequest{remote: "172.32.0.1:50000"}, 401},
		{"RFC 1918 192.168/16", accessRequest{remote: "192.168.1.20:50000"}, 200},
		{"CGNAT 100.64/10", accessRequest{remote: "100.100.1.1:50000"}, 200},
		{"just past 100.64/10", accessRequest{remote: "100.128.0.1:50000"}, 401},
		{"IPv4 link-local", accessRequest{remote: "169.254.10.10:50000"}, 200},
		{"IPv6 unique local", accessRequest{remote: "[fd12:3456::9]:50000"}, 200},
		{"IPv6 link-local with a zone", accessRequest{remote: "[fe80::1%eth0]:50000"}, 200},
		{"a private address mapped into IPv6", accessRequest{remote: "[::ffff:10.0.0.9]:50000"}, 200},
		{"a public IPv4 address", accessRequest{remote: "11.0.0.9:50000"}, 401},
		{"a public IPv4 address mapped into IPv6", accessRequest{remote: "[::ffff:11.0.0.9]:50000"}, 401},
		{"a public IPv6 address", accessRequest{remote: "[2001:db8::9]:50000"}, 401},
		{"a public address with the token", accessRequest{remote: "11.0.0.9:50000", auth: bearer}, 200},
		{"a public IPv6 address with the token", accessRequest{remote: "[2001:db8::9]:50000", auth: bearer}, 200},
		{"the scheme in lower case", accessRequest{remote: "11.0.0.9:50000", auth: "bearer " + statusToken}, 200},
		{"a wrong token", accessRequest{remote: "11.0.0.9:50000", auth: "Bearer not-the-token"}, 401},
		{"the token with a suffix", accessRequest{remote: "11.0.0.9:50000", auth: bearer + "x"}, 401},
		{"the token as a Basic password", accessRequest{remote: "11.0.0.9:50000", auth: "Basic c2NyYXBlcjpzM2NyZXQtaW5ncmVzcy10b2tlbg=="}, 401},
		{"the token without a scheme", accessRequest{remote: "11.0.0.9:50000", auth: statusToken}, 401},
		{"an empty bearer", accessRequest{remote: "11.0.0.9:50000", auth: "Bearer "}, 401},
		{"a forged X-Forwarded-For from a peer that is no trusted proxy", accessRequest{remote: "11.0.0.9:50000", xff: []string{"10.0.0.5"}}, 401},
		{"a trusted proxy asking for itself", accessRequest{remote: "198.51.100.7:50000"}, 200},
		{"a trusted proxy relaying a public client", accessRequest{remote: "198.51.100.7:50000", xff: []string{"203.0.113.9"}}, 401},
		{"a trusted proxy relaying a public client with the token", accessRequest{remote: "198.51.100.7:50000", xff: []string{"203.0.113.9"}, auth: bearer}, 200},
		{"a trusted proxy relaying a private client", accessRequest{remote: "198.51.100.7:50000", xff: []string{"10.0.0.5"}}, 200},
		{"a private address forged left of the public client", accessRequest{remote: "198.51.100.7:50000", xff: []string{"10.0.0.5, 203.0.113.9"}}, 401},
		{"a chain of trusted proxies after a public client", accessRequest{remote: "198.51.100.7:50000", xff: []string{"203.0.113.9, 198.51.100.8"}}, 401},
		{"a public client on a second X-Forwarded-For line", accessRequest{remote: "198.51.100.7:50000", xff: []string{"10.0.0.5", "203.0.113.9"}}, 401},
		{"a chain naming trusted proxies only", accessRequest{remote: "198.51.100.7:50000", xff: []string{"198.51.100.9"}}, 200},
		{"an X-Forwarded-For that is not an address", accessRequest{remote: "198.51.100.7:50000", xff: []string{"unknown"}}, 401},
		{"an empty X-Forwarded-For entry", accessRequest{remote: "198.51.100.7:50000", xff: []string{"10.0.0.5, "}}, 401},
		{"a peer address that does not parse", accessRequest{remote: "somewhere"}, 401},
		{"a peer address that does not parse, with the token", accessRequest{remote: "somewhere", auth: bearer}, 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := tc.req.serve(t, a, "/metrics")
			if rec.Code != tc.want {
				t.Fatalf("GET /metrics from %s (X-Forwarded-For %q, Authorization %q) = %d, want %d: %s",
					tc.req.remote, tc.req.xff, tc.req.auth, rec.Code, tc.want, rec.Body)
			}
			if rec.Code == 401 {
				if got := rec.Header().Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer ") {
					t.Errorf("WWW-Authenticate = %q, want a Bearer challenge", got)
				}
				if strings.Contains(rec.Body.String(), "scafo_edge") || strings.Contains(rec.Body.String(), "go_") {
					t.Errorf("the refusal carries metrics: %q", rec.Body)
				}
			}
			// Health checks come from anywhere (docs/design.md rule 10
			// concerns the status surfaces only).
			for _, p := range []string{"/healthz", "/readyz"} {
				if rec := tc.req.serve(t, a, p); rec.Code != 200 {
					t.Errorf("GET %s = %d, want 200", p, rec.Code)
				}
			}
		})
	}

	t.Run("without a configured token no bearer opens it", func(t *testing.T) {
		b := *a
		b.Token = ""
		for _, auth := range []string{"", "Bearer ", "Bearer anything"} {
			if rec := (accessRequest{remote: "11.0.0.9:50000", auth: auth}).serve(t, &b, "/metrics"); rec.Code != 401 {
				t.Errorf("GET /metrics with Authorization %q = %d, want 401", auth, rec.Code)
			}
		}
	})
}

func TestTheAllowListChangesMetricsOnly(t *testing.T) {
	cases := []struct {
		name, allow string
		remote      string
		want        int
	}{
		{"loopback only refuses a private client", "loopback", "10.0.0.9:50000", 401},
		{"loopback only still serves loopback", "loopback", "127.0.0.1:50000", 200},
		{"loopback only still serves a trusted proxy", "loopback", "198.51.100.7:50000", 200},
		{"an empty list is loopback only", "", "192.168.1.1:50000", 401},
		{"a fleet network serves its members", "10.83.0.0/16", "10.83.4.2:50000", 200},
		{"a fleet network refuses the rest of 10/8", "10.83.0.0/16", "10.84.0.1:50000", 401},
		{"a bare address serves that address", "203.0.113.9", "203.0.113.9:50000", 200},
		{"a bare address serves no neighbour", "203.0.113.9", "203.0.113.10:50000", 401},
		{"private plus a public monitoring host", "private, 203.0.113.0/24", "203.0.113.77:50000", 200},
		{"any opens it to a public IPv4 client", "any", "11.0.0.9:50000", 200},
		{"any opens it to a public IPv6 client", "any", "[2001:db8::9]:50000", 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := accessServer(t, tc.allow)
			if rec := (accessRequest{remote: tc.remote}).serve(t, a, "/metrics"); rec.Code != tc.want {
				t.Errorf("--admin-allow %q: GET /metrics from %s = %d, want %d", tc.allow, tc.remote, rec.Code, tc.want)
			}
		})
	}
}

// TestStatusSurfacesStayLoopbackOrToken holds docs/design.md rule 10 against
// the allow list: no network opens the status page, status.json or pprof,
// not even "any", and a trusted proxy cannot relay a client into them.
func TestStatusSurfacesStayLoopbackOrToken(t *testing.T) {
	a := accessServer(t, "any")
	a.TrustedProxies = append(a.TrustedProxies, netip.MustParsePrefix("127.0.0.1/32"))
	cases := []struct {
		name string
		req  accessRequest
		want int
	}{
		{"loopback", accessRequest{remote: "127.0.0.1:50000"}, 200},
		{"a private client, which may scrape", accessRequest{remote: "10.0.0.9:50000"}, 403},
		{"a public client, which may scrape with any", accessRequest{remote: "11.0.0.9:50000"}, 403},
		{"a trusted proxy asking for itself", accessRequest{remote: "198.51.100.7:50000"}, 403},
		{"a remote trusted proxy naming a loopback client", accessRequest{remote: "198.51.100.7:50000", xff: []string{"127.0.0.1"}}, 403},
		{"a proxy on loopback relaying a public client", accessRequest{remote: "127.0.0.1:50000", xff: []string{"203.0.113.9"}}, 403},
		{"a proxy on loopback relaying a loopback client", accessRequest{remote: "127.0.0.1:50000", xff: []string{"127.0.0.1"}}, 200},
		{"a public client with the token", accessRequest{remote: "11.0.0.9:50000", auth: "Bearer " + statusToken}, 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, p := range []string{"/", "/status.json", "/debug/pprof/"} {
				if rec := tc.req.serve(t, a, p); rec.Code != tc.want {
					t.Errorf("GET %s from %s (X-Forwarded-For %q) = %d, want %d", p, tc.req.remote, tc.req.xff, rec.Code, tc.want)
				}
			}
		})
	}
}

func TestParseAllow(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	good := []struct {
		in   string
		want []netip.Prefix
	}{
		{"", nil},
		{" , ,", nil},
		{"loopback", nil},
		{"private", privateNetworks},
		{"any", anyNetwork},
		{"10.83.0.0/16", pfx("10.83.0.0/16")},
		{"10.83.1.7/16", pfx("10.83.0.0/16")},
		{"203.0.113.9", pfx("203.0.113.9/32")},
		{"2001:db8::1", pfx("2001:db8::1/128")},
		{"2001:db8::/32 , 192.0.2.0/24", pfx("2001:db8::/32", "192.0.2.0/24")},
		{"private,203.0.113.0/24", append(slices.Clone(privateNetworks), pfx("203.0.113.0/24")...)},
	}
	for _, tc := range good {
		got, err := ParseAllow(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseAllow(%q) = %v, %v, want %v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"10.0.0.0/33", "10.0.0.300", "privat", "Private", "all", "*", "10.0.0.0/8/8",
		"fe80::1%eth0", "fe80::/10%eth0", "::ffff:10.0.0.0/104", "::ffff:10.0.0.9", "private;any", "10.0.0.0 /8"} {
		if got, err := ParseAllow(in); err == nil {
			t.Errorf("ParseAllow(%q) = %v, want an error", in, got)
		}
	}
}
