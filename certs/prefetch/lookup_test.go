package prefetch

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsServer is a DNS server on loopback that answers A and AAAA queries
// with records[type], or SERVFAIL for the types in servfail (an
// authoritative server timing out on AAAA, a broken DNSSEC signature on
// the AAAA RRset...). It returns its address.
func dnsServer(t *testing.T, records map[dnsmessage.Type][]netip.Addr, servfail ...dnsmessage.Type) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionAvailable: true}
			if slices.Contains(servfail, q.Type) {
				rh.RCode = dnsmessage.RCodeServerFailure
			}
			b := dnsmessage.NewBuilder(nil, rh)
			b.EnableCompression()
			b.StartQuestions()
			b.Question(q)
			b.StartAnswers()
			if rh.RCode == dnsmessage.RCodeSuccess {
				rr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}
				for _, a := range records[q.Type] {
					switch q.Type {
					case dnsmessage.TypeA:
						b.AResource(rr, dnsmessage.AResource{A: a.As4()})
					case dnsmessage.TypeAAAA:
						b.AAAAResource(rr, dnsmessage.AAAAResource{AAAA: a.As16()})
					}
				}
			}
			out, _ := b.Finish()
			pc.WriteTo(out, from)
		}
	}()
	return pc.LocalAddr().String()
}

// TestReachLooksUpAsTheCA: the checks' default resolver, against a DNS
// server, finds the addresses Let's Encrypt's resolver would validate at
// (Boulder's bdns.LookupHost): every public address; no private or
// reserved one; a failed query for one family with the other answering is
// not an error, and validation goes to the family that answered.
func TestReachLooksUpAsTheCA(t *testing.T) {
	var (
		v4      = netip.MustParseAddr("93.184.216.34")
		v6      = netip.MustParseAddr("2606:2800:21f:cb07:6820:80da:af6b:8b2c")
		private = netip.MustParseAddr("10.20.30.40")
		ula     = netip.MustParseAddr("fd00::1")
	)
	A, AAAA := dnsmessage.TypeA, dnsmessage.TypeAAAA
	for _, tc := range []struct {
		name     string
		records  map[dnsmessage.Type][]netip.Addr
		servfail []dnsmessage.Type
		want     []netip.Addr // nil: an error wrapping ErrUnreachable
	}{
		{"A and AAAA: both", map[dnsmessage.Type][]netip.Addr{A: {v4}, AAAA: {v6}}, nil, []netip.Addr{v6, v4}},
		{"A only (AAAA answers empty): the A address", map[dnsmessage.Type][]netip.Addr{A: {v4}}, nil, []netip.Addr{v4}},
		{"AAAA query failing, A answering: the A address", map[dnsmessage.Type][]netip.Addr{A: {v4}, AAAA: {v6}}, []dnsmessage.Type{AAAA}, []netip.Addr{v4}},
		{"A query failing, AAAA answering: the AAAA address", map[dnsmessage.Type][]netip.Addr{A: {v4}, AAAA: {v6}}, []dnsmessage.Type{A}, []netip.Addr{v6}},
		{"a private address beside a public one: the public one", map[dnsmessage.Type][]netip.Addr{A: {private, v4}, AAAA: {ula}}, nil, []netip.Addr{v4}},
		{"private addresses only: none", map[dnsmessage.Type][]netip.Addr{A: {private}, AAAA: {ula}}, nil, nil},
		{"AAAA query failing, private A only: none", map[dnsmessage.Type][]netip.Addr{A: {private}}, []dnsmessage.Type{AAAA}, nil},
		{"both queries failing: none", map[dnsmessage.Type][]netip.Addr{A: {v4}, AAAA: {v6}}, []dnsmessage.Type{A, AAAA}, nil},
		{"no records: none", nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := dnsServer(t, tc.records, tc.servfail...)
			dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "udp", srv)
			}
			p := newProber(newStorage(t), publicLookup(newPublicResolver(dial)), nil, 5*time.Second)
			got, err := p.addresses(context.Background(), "shop.example.com")
			if tc.want == nil {
				if !errors.Is(err, ErrUnreachable) {
					t.Fatalf("addresses = %v, %v; want ErrUnreachable", got, err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("addresses = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestReachLookupIsBounded: a resolver that never answers ends the check
// at its timeout, as a request that never answers does, rather than
// holding the check (and its prefetch slot) for good.
func TestReachLookupIsBounded(t *testing.T) {
	hang := func(ctx context.Context, _, _ string) ([]netip.Addr, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	p := newProber(newStorage(t), hang, nil, 50*time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- p.check(context.Background(), "shop.example.com") }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("check with a resolver that never answers = %v, want ErrUnreachable at the deadline", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("check with a resolver that never answers did not end at its timeout")
	}
}
