package prefetch

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

func newStorage(t *testing.T) certmagic.Storage {
	return &certmagic.FileStorage{Path: t.TempDir()}
}

// edgeServer is an edge's port 80 as far as reachability goes: it answers
// checks whose tokens storage holds, and 404 otherwise.
func edgeServer(t *testing.T, storage certmagic.Storage) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		if !ServeReach(w, r, storage, host) {
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// dialTo sends every connection to addr: the tests' DNS.
func dialTo(addr string) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}
}

// oneAddress resolves every name to one public-looking address, which
// dialTo then sends where the test wants.
func oneAddress(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("93.184.215.14")}, nil
}

func TestReach(t *testing.T) {
	shared := newStorage(t)
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, path.Base(r.URL.Path))
	}))
	t.Cleanup(echo.Close)
	redirect := httptest.NewServer(http.RedirectHandler("https://elsewhere.test/", http.StatusFound))
	t.Cleanup(redirect.Close)

	for _, tc := range []struct {
		name      string
		to        string
		reachable bool
	}{
		{"an edge reading the same storage answers", edgeServer(t, shared), true},
		{"a server with another storage does not", edgeServer(t, newStorage(t)), false},
		{"a server echoing the request does not", echo.Listener.Addr().String(), false},
		{"a redirect is not followed and does not count", redirect.Listener.Addr().String(), false},
		{"nothing listening does not", testsupport.ClosedAddr(t), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProber(shared, oneAddress, dialTo(tc.to), 5*time.Second)
			err := p.check(context.Background(), "shop.example.test")
			if tc.reachable && err != nil {
				t.Fatalf("check = %v, want nil", err)
			}
			if !tc.reachable && !errors.Is(err, ErrUnreachable) {
				t.Fatalf("check = %v, want ErrUnreachable", err)
			}
			if keys, _ := shared.List(context.Background(), "scafo-edge/reach", false); len(keys) != 0 {
				t.Errorf("tokens left in storage after the check: %q", keys)
			}
		})
	}

	t.Run("a token is answered only for the name it was made for", func(t *testing.T) {
		p := newProber(shared, oneAddress, dialTo(edgeServer(t, shared)), 5*time.Second)
		// The token was stored for shop.example.test; the request arrives
		// with another Host.
		rt := p.client.Transport
		p.client.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Host = "other.example.test"
			return rt.RoundTrip(r)
		})
		if err := p.check(context.Background(), "shop.example.test"); !errors.Is(err, ErrUnreachable) {
			t.Fatalf("check with another Host = %v, want ErrUnreachable", err)
		}
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestServeReachIgnoresOtherPaths(t *testing.T) {
	storage := newStorage(t)
	for _, target := range []string{
		"/", "/.well-known/scafo-edge/reach/", "/.well-known/scafo-edge/reach/../../x",
		"/.well-known/scafo-edge/reach/0123456789ABCDEF0123456789abcdef",
		"/.well-known/scafo-edge/reach/0123456789abcdef0123456789abcdef",
	} {
		w := httptest.NewRecorder()
		if ServeReach(w, httptest.NewRequest(http.MethodGet, target, nil), storage, "example.test") {
			t.Errorf("ServeReach(%q) answered %d", target, w.Code)
		}
	}
}

// TestReachDefaultDialer: a name whose DNS leads to a loopback address
// reaches the edge itself from here, but no public CA can validate it
// there, so the default dialer does not connect.
func TestReachDefaultDialer(t *testing.T) {
	storage := newStorage(t)
	loopback := func(context.Context, string, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}, nil
	}
	p := newProber(storage, loopback, nil, 5*time.Second)
	if err := p.check(context.Background(), "shop.example.com"); !errors.Is(err, ErrUnreachable) || !errors.Is(err, errNotPublic) {
		t.Fatalf("check of a name leading to loopback = %v, want ErrUnreachable for an address not public", err)
	}
}

// TestReachSpecialUseNames: a name under a special-use TLD is not looked
// up at all (a test's names never reach the public DNS through the
// default dialer).
func TestReachSpecialUseNames(t *testing.T) {
	p := newProber(newStorage(t), nil, nil, 5*time.Second)
	for _, name := range []string{"shop.example.test", "first.example", "LOCALHOST", "printer.local", "nas.home.arpa", "x.invalid"} {
		if err := p.check(context.Background(), name); !errors.Is(err, ErrUnreachable) || !errors.Is(err, errNotPublic) {
			t.Errorf("check(%q) = %v, want ErrUnreachable for a special-use name", name, err)
		}
	}
	for _, name := range []string{"example.com", "test.example.org", "internal.example.net", "localhost.example.com"} {
		if isSpecialUse(name) {
			t.Errorf("isSpecialUse(%q) = true, want false", name)
		}
	}
}

func TestIsPublic(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"93.184.215.14", true},
		{"2606:2800:21f:cb07:6820:80da:af6b:8b2c", true},
		{"::ffff:93.184.215.14", true},
		{"127.0.0.1", false},
		{"::1", false},
		{"::ffff:127.0.0.1", false},
		{"10.1.2.3", false},
		{"172.16.0.1", false},
		{"192.168.1.1", false},
		{"fd00::1", false},
		{"169.254.169.254", false},
		{"fe80::1", false},
		{"100.64.0.1", false},
		{"0.0.0.0", false},
		{"::", false},
		{"224.0.0.1", false},
		{"255.255.255.255", false},
		{"192.0.2.1", false},
		{"2001:db8::1", false},
		{"192.88.99.1", false},
		{"2002:5db8:d70e::1", false},
		{"2001:0:4136:e378::1", false},
		{"100::1", false},
	} {
		if got := isPublic(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("isPublic(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}
