package prefetch

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// servfailAAAA is a DNS server that answers A with a public address and
// AAAA with SERVFAIL (an authoritative server timing out on AAAA, a
// broken DNSSEC signature on the AAAA RRset...). Let's Encrypt fails the
// validation on such a name ("DNS problem: SERVFAIL looking up AAAA").
func servfailAAAA(t *testing.T) string {
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
			if q.Type == dnsmessage.TypeAAAA {
				rh.RCode = dnsmessage.RCodeServerFailure
			}
			b := dnsmessage.NewBuilder(nil, rh)
			b.EnableCompression()
			b.StartQuestions()
			b.Question(q)
			b.StartAnswers()
			if q.Type == dnsmessage.TypeA {
				b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: [4]byte{93, 184, 216, 34}})
			}
			out, _ := b.Finish()
			pc.WriteTo(out, from)
		}
	}()
	return pc.LocalAddr().String()
}

// TestAFailedAAAAQueryIsNotHidden: net.DefaultResolver's
// StrictErrors is false, so a failed AAAA sub-query is dropped and the A
// answer returned without an error: the check would test the IPv4 address
// only and pass a name the CA fails to validate. The checks' resolver,
// pointed at a server failing AAAA, must fail the look-up.
func TestAFailedAAAAQueryIsNotHidden(t *testing.T) {
	srv := servfailAAAA(t)
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", srv)
	}
	lookup := publicLookup(newPublicResolver(dial))
	if addrs, err := lookup(context.Background(), "ip", "shop.example.com"); err == nil {
		t.Errorf("look-up with AAAA failing = %v, nil; want an error: not every address the CA may use is known", addrs)
	}
	// The same server's A answer alone is a name with no AAAA record.
	if addrs, err := lookup(context.Background(), "ip4", "shop.example.com"); err != nil || len(addrs) != 1 || addrs[0] != netip.MustParseAddr("93.184.216.34") {
		t.Errorf("A look-up = %v, %v; want 93.184.216.34", addrs, err)
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
