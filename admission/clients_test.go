package admission

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

var testProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00:1::/32")}

func TestAClientIsCountedByItsIPv4AddressOrItsIPv6Slash64(t *testing.T) {
	cases := []struct {
		name string
		peer net.Addr
		want string // "": not counted per client address
	}{
		{"an IPv4 peer is its address", &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 1}, "192.0.2.7"},
		{"an IPv4 peer in net's 16-byte form is its IPv4 address", &net.TCPAddr{IP: net.ParseIP("192.0.2.7").To16(), Port: 1}, "192.0.2.7"},
		{"an IPv4-mapped IPv6 peer is its IPv4 address", net.TCPAddrFromAddrPort(netip.MustParseAddrPort("[::ffff:192.0.2.7]:1")), "192.0.2.7"},
		{"an IPv6 peer is its /64", &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), Port: 1}, "2001:db8:1:2::"},
		{"an IPv6 peer with a zone is its /64 without it", &net.TCPAddr{IP: net.ParseIP("fe80::1:2"), Zone: "eth0", Port: 1}, "fe80::"},
		{"a QUIC peer is counted like a TCP one", &net.UDPAddr{IP: net.ParseIP("2001:db8:1:2::9"), Port: 443}, "2001:db8:1:2::"},
		{"a proxy's IPv4 connection is not a client's", &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 1}, ""},
		{"a proxy's IPv4-mapped connection is not a client's", net.TCPAddrFromAddrPort(netip.MustParseAddrPort("[::ffff:10.1.2.3]:1")), ""},
		{"a proxy's IPv6 connection is not a client's", &net.TCPAddr{IP: net.ParseIP("fd00:1::5"), Port: 1}, ""},
		{"a peer without an address is not counted", &net.TCPAddr{Port: 1}, ""},
		{"a Unix socket peer is not counted", &net.UnixAddr{Name: "/run/edge.sock", Net: "unix"}, ""},
	}
	c := newController(t, Options{Limits: testLimits(100), Proxies: testProxies, TrustedProxies: testProxies})
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			key, ok := c.clientOfPeer(tt.peer)
			got := ""
			if ok {
				got = key.String()
			}
			if got != tt.want {
				t.Errorf("clientOfPeer(%v) = %q (counted %v), want %q", tt.peer, got, ok, tt.want)
			}
		})
	}
}

func TestClientKeyGroupsIPv6BySlash64AndKeepsIPv4Whole(t *testing.T) {
	same := [][2]string{
		{"2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:ffff"},
		{"192.0.2.1", "192.0.2.1"},
	}
	differ := [][2]string{
		{"2001:db8:1:2::1", "2001:db8:1:3::1"},
		{"192.0.2.1", "192.0.2.2"},
		{"192.0.2.1", "2001:db8::1"},
	}
	for _, p := range same {
		if a, b := clientKey(netip.MustParseAddr(p[0])), clientKey(netip.MustParseAddr(p[1])); a != b {
			t.Errorf("clientKey(%s) = %s, clientKey(%s) = %s; want one client", p[0], a, p[1], b)
		}
	}
	for _, p := range differ {
		if a, b := clientKey(netip.MustParseAddr(p[0])), clientKey(netip.MustParseAddr(p[1])); a == b {
			t.Errorf("clientKey(%s) = clientKey(%s) = %s; want two clients", p[0], p[1], a)
		}
	}
}

func TestARequestIsCountedByTheAddressAfterTheLastProxy(t *testing.T) {
	cases := []struct {
		name   string
		remote string
		xff    []string
		want   string // "": not counted per client address
	}{
		{"a direct IPv4 client is its address", "192.0.2.7:4321", nil, "192.0.2.7"},
		{"a direct client's X-Forwarded-For is ignored", "192.0.2.7:4321", []string{"198.51.100.1"}, "192.0.2.7"},
		{"a direct IPv4-mapped client is its IPv4 address", "[::ffff:192.0.2.7]:4321", nil, "192.0.2.7"},
		{"a direct IPv6 client is its /64", "[2001:db8:1:2::7]:4321", nil, "2001:db8:1:2::"},
		{"a direct IPv6 client with a zone is its /64", "[fe80::7%eth0]:4321", nil, "fe80::"},
		{"a proxy's request is the client the header names", "10.0.0.1:80", []string{"198.51.100.1"}, "198.51.100.1"},
		{"the rightmost address that is not a proxy's wins", "10.0.0.1:80", []string{"203.0.113.9, 198.51.100.1, 10.0.0.2"}, "198.51.100.1"},
		{"spaces around the addresses do not matter", "10.0.0.1:80", []string{" 203.0.113.9 ,198.51.100.1 ,  10.0.0.2 "}, "198.51.100.1"},
		{"several header lines are one list, the last line last", "10.0.0.1:80", []string{"203.0.113.9", "198.51.100.1, 10.0.0.2", "10.0.0.3"}, "198.51.100.1"},
		{"an IPv4-mapped address in the header is its IPv4 address", "10.0.0.1:80", []string{"::ffff:198.51.100.1"}, "198.51.100.1"},
		{"an IPv6 address in the header is its /64", "10.0.0.1:80", []string{"2001:db8:5:6::1, 10.0.0.2"}, "2001:db8:5:6::"},
		{"an IPv6 proxy is skipped too", "[fd00:1::1]:80", []string{"198.51.100.1, fd00:1::2"}, "198.51.100.1"},
		{"a proxy that names no client is not counted", "10.0.0.1:80", nil, ""},
		{"a header of proxies only is not counted", "10.0.0.1:80", []string{"10.0.0.2, 10.0.0.3"}, ""},
		{"garbage after the client is not counted", "10.0.0.1:80", []string{"198.51.100.1, garbage"}, ""},
		{"an empty element after the client is not counted", "10.0.0.1:80", []string{"198.51.100.1,"}, ""},
		{"an address with a port is not counted", "10.0.0.1:80", []string{"198.51.100.1:4321"}, ""},
		{"an empty header is not counted", "10.0.0.1:80", []string{""}, ""},
		{"an unparsable peer is not counted", "@pipe", nil, ""},
		{"a PROXY protocol peer that sent no header is not counted, its X-Forwarded-For not believed", "172.16.0.1:80", []string{"198.51.100.1"}, ""},
	}
	proxies := append(slices.Clone(testProxies), netip.MustParsePrefix("172.16.0.0/12"))
	c := newController(t, Options{Limits: testLimits(100), Proxies: proxies, TrustedProxies: testProxies})
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			key, ok := c.clientOfRequest(request(tt.remote, tt.xff...))
			got := ""
			if ok {
				got = key.String()
			}
			if got != tt.want {
				t.Errorf("clientOfRequest(%s, X-Forwarded-For %q) = %q (counted %v), want %q", tt.remote, tt.xff, got, ok, tt.want)
			}
		})
	}
}

// busyRequests admits requests of filler applications, each from an
// address of its own, until the request budget is past its high-water
// mark: requests contend for slots. They are released when the test ends.
func busyRequests(t *testing.T, c *Controller) {
	t.Helper()
	var held []Ticket
	t.Cleanup(func() {
		for _, k := range held {
			k.Release()
		}
	})
	for app := 0; float64(c.apps.total.Load()) < highWater*float64(c.apps.budget); app++ {
		if app == 100 {
			t.Fatal("the request budget never reached its high-water mark")
		}
		for i := 0; ; i++ {
			k, why := c.Admit(probe(fmt.Sprintf("198.51.%d.%d:1", app, i+1)), fmt.Sprintf("filler-%d", app))
			if why != Admitted {
				break
			}
			held = append(held, k)
		}
	}
}

// A client address's share of requests binds only when requests contend
// for their slots: a NAT's browsers, whose requests finish, are not
// refused because connections are short.
func TestAClientAddressPastItsShareOfRequestsIsRefused429WhenRequestsContend(t *testing.T) {
	l := testLimits(100)
	l.RequestsPerClient = 3
	c := newController(t, Options{Limits: l, Proxies: testProxies, TrustedProxies: testProxies})
	var held []Ticket
	defer func() {
		for _, k := range held {
			k.Release()
		}
	}()
	for i := range 3 {
		k, why := c.Admit(request(fmt.Sprintf("192.0.2.7:%d", 1000+i)), "app")
		if why != Admitted {
			t.Fatalf("request %d of the address = %v, want admitted", i+1, why)
		}
		held = append(held, k)
	}
	// On an idle box the share binds nobody.
	k, why := c.Admit(request("192.0.2.7:999"), "app")
	if why != Admitted {
		t.Fatalf("a fourth request of the address on an idle box = %v, want admitted", why)
	}
	k.Release()
	busyRequests(t, c.Controller)
	cases := []struct {
		name   string
		remote string
		xff    []string
		want   Refusal
	}{
		{"another request of the address, from another port", "192.0.2.7:9999", nil, RefusedClientRequests},
		{"the same client behind a proxy", "10.0.0.1:80", []string{"192.0.2.7"}, RefusedClientRequests},
		{"another address", "192.0.2.8:1000", nil, Admitted},
		{"a request a proxy names no client for", "10.0.0.1:80", nil, Admitted},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			k, why := c.Admit(request(tt.remote, tt.xff...), "app")
			k.Release()
			if why != tt.want {
				t.Errorf("Admit = %v, want %v", why, tt.want)
			}
		})
	}
	if got := c.shed(t, "client_requests"); got != 2 {
		t.Errorf("scafo_edge_shed_total{reason=client_requests} = %v, want 2", got)
	}
	if n := len(c.log.LogEntries("has its share in flight")); n != 1 {
		t.Errorf("refusals logged %d times, want once:\n%s", n, c.log.String())
	}

	held[0].Release()
	held = held[1:]
	k, why = c.Admit(request("192.0.2.7:1"), "app")
	if why != Admitted {
		t.Fatalf("Admit after one of the address's requests ended = %v, want admitted", why)
	}
	held = append(held, k)
}

// With connections short and requests not, an address past its share of
// requests is served: its requests finish, and what the box is short of
// is connections, which their own rules hold.
func TestAClientAddressPastItsShareOfRequestsIsServedWhenOnlyConnectionsAreShort(t *testing.T) {
	l := testLimits(100)
	l.RequestsPerClient = 1
	c := newController(t, Options{Limits: l})
	holdUpstreams(t, c.Controller, 90) // connections past the high-water mark
	if !c.contended.Load() {
		t.Fatal("the box is not contended at 90 of 100 connections")
	}
	for i := range 3 {
		k, why := c.Admit(request("192.0.2.7:1"), "app")
		if why != Admitted {
			t.Fatalf("request %d of the address = %v, want admitted", i+1, why)
		}
		defer k.Release()
	}
	// Over HTTP/2 an address holds many requests on few connections, which
	// no connection share bounds: there its share binds.
	r := request("192.0.2.7:1")
	r.ProtoMajor, r.ProtoMinor = 2, 0
	if _, why := c.Admit(r, "app"); why != RefusedClientRequests {
		t.Errorf("an HTTP/2 request of the address past its share, connections short = %v, want %v", why, RefusedClientRequests)
	}
}

func TestAnIPv6ClientsShareOfRequestsIsItsSlash64s(t *testing.T) {
	l := testLimits(100)
	l.RequestsPerClient = 1
	c := newController(t, Options{Limits: l})
	busyRequests(t, c.Controller) // the shares bind
	k, why := c.Admit(request("[2001:db8:1:2::1]:1000"), "app")
	if why != Admitted {
		t.Fatalf("first request = %v, want admitted", why)
	}
	defer k.Release()
	if _, why := c.Admit(request("[2001:db8:1:2:ffff::9]:1000"), "app"); why != RefusedClientRequests {
		t.Errorf("a request from another address of the /64 = %v, want %v", why, RefusedClientRequests)
	}
	k2, why := c.Admit(request("[2001:db8:1:3::1]:1000"), "app")
	if why != Admitted {
		t.Errorf("a request from the next /64 = %v, want admitted", why)
	}
	k2.Release()
}

func TestAClientAddressPastItsRateIsRefused429UntilItsBucketRefills(t *testing.T) {
	l := testLimits(100)
	l.ClientRate, l.ClientBurst = 1, 2
	clk := newFakeClock()
	c := newController(t, Options{Limits: l, Clock: clk})
	admit := func(remote string) Refusal {
		k, why := c.Admit(request(remote), "app")
		k.Release()
		return why
	}
	for i := range 2 {
		if why := admit("192.0.2.7:1"); why != Admitted {
			t.Fatalf("request %d within the burst = %v, want admitted", i+1, why)
		}
	}
	if why := admit("192.0.2.7:1"); why != RefusedClientRate {
		t.Fatalf("request past the burst = %v, want %v", why, RefusedClientRate)
	}
	if why := admit("192.0.2.8:1"); why != Admitted {
		t.Errorf("another address's request = %v, want admitted", why)
	}
	clk.Advance(time.Second)
	if why := admit("192.0.2.7:1"); why != Admitted {
		t.Errorf("a request a second later = %v, want admitted", why)
	}
	if why := admit("192.0.2.7:1"); why != RefusedClientRate {
		t.Errorf("the next one at once = %v, want %v", why, RefusedClientRate)
	}
	if got := c.shed(t, "client_rate"); got != 2 {
		t.Errorf("scafo_edge_shed_total{reason=client_rate} = %v, want 2", got)
	}
}

// The controller's clock is the one its rate is measured by: a test (or a
// caller) that sets Options.Clock must see the rate enforced by that clock.
func TestAClientPastItsRateStaysRefusedWhileTheControllersClockStandsStill(t *testing.T) {
	l := testLimits(100)
	l.ClientRate, l.ClientBurst = 1, 1
	clk := clock.NewFake(time.Now().Add(-time.Hour))
	c := newController(t, Options{Limits: l, Clock: clk})
	k, why := c.Admit(request("192.0.2.7:1"), "app")
	if why != Admitted {
		t.Fatalf("first request = %v, want admitted", why)
	}
	k.Release()
	k, why = c.Admit(request("192.0.2.7:1"), "app")
	k.Release()
	if why != RefusedClientRate {
		t.Errorf("second request at the same instant of the controller's clk = %v, want %v "+
			"(the client table measured the bucket by time.Now, not Options.Clock, found it full and forgot the address)", why, RefusedClientRate)
	}
}

func TestTheClientTableForgetsAnAddressThatHoldsNothing(t *testing.T) {
	t.Run("without a rate, at the sweep after its last request ended", func(t *testing.T) {
		c := newController(t, Options{Limits: testLimits(100)})
		var held []Ticket
		for i := range 10 {
			k, why := c.Admit(request(fmt.Sprintf("192.0.2.%d:1", i%5)), "app")
			if why != Admitted {
				t.Fatalf("request %d = %v", i, why)
			}
			held = append(held, k)
		}
		if n := c.Snapshot().Clients; n != 5 {
			t.Errorf("Clients = %d with five addresses holding requests, want 5", n)
		}
		if v := c.metric(t, "scafo_edge_client_addresses", nil); v != 5 {
			t.Errorf("scafo_edge_client_addresses = %v, want 5", v)
		}
		for _, k := range held {
			k.Release()
		}
		// Kept until the sweep: a client behind a proxy, with no
		// connection entry, would otherwise cost an entry a request.
		if n := c.Snapshot().Clients; n != 5 {
			t.Errorf("Clients = %d as the last requests end, want 5 until the sweep", n)
		}
		c.clients.sweep()
		if n := c.Snapshot().Clients; n != 0 {
			t.Errorf("Clients = %d after the sweep, want 0", n)
		}
	})
	t.Run("with a rate, once its bucket is full again", func(t *testing.T) {
		l := testLimits(100)
		l.ClientRate, l.ClientBurst = 1000, 1 // refills in a millisecond
		c := newController(t, Options{Limits: l})
		k, why := c.Admit(request("192.0.2.1:1"), "app")
		if why != Admitted {
			t.Fatalf("Admit = %v", why)
		}
		k.Release()
		// What Run does every 5s.
		testsupport.WaitFor(t, 5*time.Second, "the address to be forgotten once its bucket refilled", func() bool {
			c.clients.sweep()
			return c.Snapshot().Clients == 0
		})
	})
}

func TestTheClientTableStaysBoundedAndANewAddressIsStillCounted(t *testing.T) {
	l := testLimits(40)
	l.ClientRate, l.ClientBurst = 0.001, 1 // an address is kept for 1000s after a request
	c := newController(t, Options{Limits: l})
	const bound = 1024 // max(4×MaxConns, 1024)
	for i := range bound + 100 {
		remote := fmt.Sprintf("[2001:db8:%x::1]:1", i)
		k, why := c.Admit(request(remote), "app")
		if why != Admitted {
			t.Fatalf("first request of address %d = %v, want admitted", i, why)
		}
		k.Release()
	}
	if n := c.Snapshot().Clients; n != bound {
		t.Errorf("Clients = %d after %d addresses, want the bound %d", n, bound+100, bound)
	}
	// A full table forgets an address that holds nothing to count a new
	// one: spraying addresses does not turn the per-address limits off.
	if _, why := c.Admit(request(fmt.Sprintf("[2001:db8:%x::1]:1", bound+99)), "app"); why != RefusedClientRate {
		t.Errorf("second request of the newest address = %v, want %v", why, RefusedClientRate)
	}
	held := make([]Ticket, 0, 20)
	for range 20 {
		k, why := c.Admit(request("[2001:db8:ffff::1]:1"), "other")
		if why == Admitted {
			held = append(held, k)
		}
	}
	for _, k := range held {
		k.Release()
	}
	if len(held) != 1 {
		t.Errorf("a fresh address with the table full got %d requests admitted, want its burst of 1", len(held))
	}
}
