package prefetch

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// fakeNet is public DNS and the internet as a reachability check sees
// them: a name's A and AAAA records, and where a connection to each
// address lands (a loopback listener; an address not listed refuses).
type fakeNet struct {
	records map[string][]netip.Addr
	at      map[netip.Addr]string
	// noIPv6: this box has no IPv6 route, so connecting to an IPv6
	// address fails at once, as the kernel fails it (ENETUNREACH).
	noIPv6 bool
	// fail makes the look-up of a family ("ip4", "ip6") fail with its
	// error, as a SERVFAIL or a timeout does.
	fail map[string]error
}

// lookup answers every family with all of a name's records, as a sloppy
// injected look-up may: the check keeps each family's own.
func (f *fakeNet) lookup(_ context.Context, network, host string) ([]netip.Addr, error) {
	if err := f.fail[network]; err != nil {
		return nil, err
	}
	addrs, ok := f.records[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return addrs, nil
}

// dial connects to "<address>:80"; given "<name>:80" it tries the name's
// addresses in turn until one connects, as the system dialer does.
func (f *fakeNet) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return f.dialAddr(ctx, ip)
	}
	addrs, err := f.lookup(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	for _, ip := range addrs {
		if c, e := f.dialAddr(ctx, ip); e == nil {
			return c, nil
		} else {
			err = e
		}
	}
	return nil, err
}

func (f *fakeNet) dialAddr(ctx context.Context, ip netip.Addr) (net.Conn, error) {
	if ip.Is6() && f.noIPv6 {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ENETUNREACH)}
	}
	to, ok := f.at[ip]
	if !ok {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	return (&net.Dialer{}).DialContext(ctx, "tcp", to)
}

// TestReachEveryAddress: a name is ready only when every address it
// publishes, A and AAAA, leads to this fleet, since the CA may validate
// over any of them (Let's Encrypt prefers IPv6 when an AAAA record exists).
func TestReachEveryAddress(t *testing.T) {
	shared := newStorage(t)
	fleet := edgeServer(t, shared)
	oldHost := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(oldHost.Close)
	elsewhere := oldHost.Listener.Addr().String()
	var (
		v4      = netip.MustParseAddr("93.184.215.14")
		v6      = netip.MustParseAddr("2606:2800:21f:cb07:6820:80da:af6b:8b2c")
		v4Other = netip.MustParseAddr("93.184.215.15")
		private = netip.MustParseAddr("10.20.30.40")
		ula     = netip.MustParseAddr("fd00::1")
		mapped  = netip.MustParseAddr("::ffff:10.20.30.40")
	)
	servfail := &net.DNSError{Err: "server misbehaving", Name: "shop.example.com", IsTemporary: true}
	timeout := &net.DNSError{Err: "i/o timeout", Name: "shop.example.com", IsTimeout: true}
	const name = "shop.example.com"
	for _, tc := range []struct {
		name    string
		records []netip.Addr
		at      map[netip.Addr]string
		noIPv6  bool
		fail    map[string]error
		want    error // nil: ready
	}{
		{"A only, reaching the fleet: ready", []netip.Addr{v4}, map[netip.Addr]string{v4: fleet}, false, nil, nil},
		{"A and AAAA both reaching the fleet: ready", []netip.Addr{v4, v6}, map[netip.Addr]string{v4: fleet, v6: fleet}, false, nil, nil},
		{"A reaching, AAAA elsewhere: not ready", []netip.Addr{v4, v6}, map[netip.Addr]string{v4: fleet, v6: elsewhere}, false, nil, ErrUnreachable},
		{"A reaching, AAAA leading nowhere: not ready", []netip.Addr{v4, v6}, map[netip.Addr]string{v4: fleet}, false, nil, ErrUnreachable},
		{"AAAA reaching, A elsewhere: not ready", []netip.Addr{v6, v4}, map[netip.Addr]string{v4: elsewhere, v6: fleet}, false, nil, ErrUnreachable},
		{"two A records, one elsewhere: not ready", []netip.Addr{v4, v4Other}, map[netip.Addr]string{v4: fleet, v4Other: elsewhere}, false, nil, ErrUnreachable},
		{"no IPv6 on this box, A reaching and an AAAA record: reported as such", []netip.Addr{v4, v6}, map[netip.Addr]string{v4: fleet, v6: fleet}, true, nil, ErrNoIPv6},
		{"no IPv6 on this box, A only: ready", []netip.Addr{v4}, map[netip.Addr]string{v4: fleet}, true, nil, nil},
		{"no IPv6 on this box, A elsewhere and an AAAA record: not ready", []netip.Addr{v4, v6}, map[netip.Addr]string{v4: elsewhere, v6: fleet}, true, nil, ErrUnreachable},
		{"no records: not ready", nil, nil, false, nil, ErrUnreachable},
		// Issue 30: what the CA validates at, as Boulder's bdns.LookupHost.
		{"a private A record beside a public one reaching the fleet: ready", []netip.Addr{private, v4}, map[netip.Addr]string{v4: fleet}, false, nil, nil},
		{"a private AAAA record beside a public A reaching the fleet: ready", []netip.Addr{v4, ula}, map[netip.Addr]string{v4: fleet}, false, nil, nil},
		{"an IPv4-mapped AAAA record beside a public A reaching the fleet: ready", []netip.Addr{v4, mapped}, map[netip.Addr]string{v4: fleet}, false, nil, nil},
		{"a private A record beside a public one elsewhere: not ready", []netip.Addr{private, v4}, map[netip.Addr]string{v4: elsewhere, private: fleet}, false, nil, ErrUnreachable},
		{"private addresses only: not ready, not public", []netip.Addr{private, ula}, map[netip.Addr]string{private: fleet, ula: fleet}, false, nil, errNotPublic},
		{"AAAA query failing, A reaching: ready", []netip.Addr{v4, v6}, map[netip.Addr]string{v4: fleet, v6: elsewhere}, false, map[string]error{"ip6": servfail}, nil},
		{"AAAA query timing out, A reaching: ready", []netip.Addr{v4}, map[netip.Addr]string{v4: fleet}, false, map[string]error{"ip6": timeout}, nil},
		{"A query failing, AAAA reaching: ready", []netip.Addr{v4, v6}, map[netip.Addr]string{v6: fleet}, false, map[string]error{"ip4": servfail}, nil},
		{"AAAA query failing, A elsewhere: not ready", []netip.Addr{v4}, map[netip.Addr]string{v4: elsewhere}, false, map[string]error{"ip6": servfail}, ErrUnreachable},
		{"both queries failing: not ready", []netip.Addr{v4, v6}, map[netip.Addr]string{v4: fleet, v6: fleet}, false, map[string]error{"ip4": servfail, "ip6": timeout}, ErrUnreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fn := &fakeNet{records: map[string][]netip.Addr{}, at: tc.at, noIPv6: tc.noIPv6, fail: tc.fail}
			if tc.records != nil {
				fn.records[name] = tc.records
			}
			p := newProber(shared, fn.lookup, fn.dial, 5*time.Second)
			err := p.check(context.Background(), name)
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("check = %v, want nil", err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("check = %v, want %v", err, tc.want)
			}
		})
	}
}

// TestQueueNoIPv6: on a box without IPv6, a name with an AAAA record is
// listed as such and logged once, however often it is checked again, and
// never ordered.
func TestQueueNoIPv6(t *testing.T) {
	clk := newFakeClock()
	storage := newStorage(t)
	v4, v6 := netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr("2606:2800:21f:cb07:6820:80da:af6b:8b2c")
	fleet := edgeServer(t, storage)
	fn := &fakeNet{
		records: map[string][]netip.Addr{"v6.example.com": {v4, v6}},
		at:      map[netip.Addr]string{v4: fleet, v6: fleet},
		noIPv6:  true,
	}
	var logs testsupport.SyncBuffer
	f := newFakeCerts("v6.example.com")
	q := startQueue(t, f, storage, Options{
		Clock: clk, RetryBase: time.Minute, LookupNetIP: fn.lookup, DialContext: fn.dial,
		Log: zerolog.New(&logs),
	})
	q.Update([]string{"v6.example.com"})
	for i := range 3 {
		testsupport.WaitFor(t, 10*time.Second, "a check reporting no IPv6", func() bool {
			st := q.Status()
			return len(st) == 1 && st[0].Failures == i+1 && st[0].State == NoIPv6
		})
		clk.Advance(q.Status()[0].Next.Sub(clk.Now()))
	}
	if got := len(logs.LogEntries("certificate prefetch: the name has an AAAA record and this box has no IPv6 route to check it; no order until it can be checked (a visitor still gets a certificate on demand)")); got != 1 {
		t.Errorf("no-IPv6 warnings after three checks = %d, want 1", got)
	}
	if got := f.ordered(); len(got) != 0 {
		t.Errorf("orders for a name whose AAAA record could not be checked: %q", got)
	}
}
