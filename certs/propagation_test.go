package certs

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libdns/libdns"
	"github.com/mholt/acmez/v3/acme"
	"github.com/miekg/dns"
)

// fakeDNS is an authoritative DNS server on loopback answering from a map
// that tests change as they go.
type fakeDNS struct {
	addr string

	mu      sync.Mutex
	txt     map[string][]string // fqdn -> values
	cname   map[string]string   // fqdn -> target fqdn
	queries int
}

func startFakeDNS(t *testing.T) *fakeDNS {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeDNS{addr: pc.LocalAddr().String(), txt: map[string][]string{}, cname: map[string]string{}}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(f.serve)}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })
	return f
}

func (f *fakeDNS) serve(w dns.ResponseWriter, q *dns.Msg) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queries++
	r := new(dns.Msg)
	r.SetReply(q)
	r.Authoritative = true
	name := strings.ToLower(q.Question[0].Name)
	hdr := func(t uint16) dns.RR_Header {
		return dns.RR_Header{Name: q.Question[0].Name, Rrtype: t, Class: dns.ClassINET, Ttl: 60}
	}
	switch q.Question[0].Qtype {
	case dns.TypeTXT:
		for _, v := range f.txt[name] {
			r.Answer = append(r.Answer, &dns.TXT{Hdr: hdr(dns.TypeTXT), Txt: []string{v}})
		}
	case dns.TypeCNAME:
		if c, ok := f.cname[name]; ok {
			r.Answer = append(r.Answer, &dns.CNAME{Hdr: hdr(dns.TypeCNAME), Target: c})
		}
	}
	w.WriteMsg(r)
}

func (f *fakeDNS) setTXT(name string, values ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.txt[dns.Fqdn(name)] = values
}

func TestFollowCNAME(t *testing.T) {
	f := startFakeDNS(t)
	f.mu.Lock()
	f.cname["_acme-challenge.shop.example.test."] = "shop.auth.acme.test."
	f.cname["_acme-challenge.hops.example.test."] = "a.acme.test."
	f.cname["a.acme.test."] = "b.acme.test."
	f.cname["_acme-challenge.loop.example.test."] = "x.acme.test."
	f.cname["x.acme.test."] = "_acme-challenge.loop.example.test."
	name := "_acme-challenge.long.example.test."
	for i := range maxCNAMEHops + 1 {
		next := strings.Repeat("n", i+1) + ".acme.test."
		f.cname[name] = next
		name = next
	}
	f.mu.Unlock()
	l := &dnsLookup{servers: []string{f.addr}}
	for _, tc := range []struct {
		name, fqdn, want, wantErr string
	}{
		{"a name without a CNAME is its own record name", "_acme-challenge.plain.example.test", "_acme-challenge.plain.example.test", ""},
		{"a CNAME into another zone is followed", "_acme-challenge.shop.example.test", "shop.auth.acme.test", ""},
		{"a chain is followed to its end", "_acme-challenge.hops.example.test", "b.acme.test", ""},
		{"a loop is refused", "_acme-challenge.loop.example.test", "", "CNAME loop"},
		{"a chain past the bound is refused", "_acme-challenge.long.example.test", "", "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := l.followCNAME(context.Background(), tc.fqdn)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("followCNAME(%q) = %q, %v; want an error with %q", tc.fqdn, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("followCNAME(%q) = %q, %v; want %q", tc.fqdn, got, err, tc.want)
			}
		})
	}
	t.Run("an unreachable server is an error, not the name itself", func(t *testing.T) {
		pc, _ := net.ListenPacket("udp", "127.0.0.1:0")
		dead := pc.LocalAddr().String()
		pc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if got, err := (&dnsLookup{servers: []string{dead}}).followCNAME(ctx, "_acme-challenge.x.example.test"); err == nil {
			t.Errorf("followCNAME through a dead server = %q, nil; want an error", got)
		}
	})
}

func TestWaitServed(t *testing.T) {
	t.Run("a record already served returns at once", func(t *testing.T) {
		f := startFakeDNS(t)
		f.setTXT("_acme-challenge.example.test", "other", "token")
		l := &dnsLookup{servers: []string{f.addr}, timeout: 5 * time.Second}
		if err := l.waitServed(context.Background(), "example.test", "_acme-challenge.example.test", "token"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a record that appears later is waited for, at every server", func(t *testing.T) {
		a, b := startFakeDNS(t), startFakeDNS(t)
		a.setTXT("_acme-challenge.example.test", "token")
		l := &dnsLookup{servers: []string{a.addr, b.addr}, timeout: 10 * time.Second}
		done := make(chan error, 1)
		go func() {
			done <- l.waitServed(context.Background(), "example.test", "_acme-challenge.example.test", "token")
		}()
		// Let b be asked (and say no) at least once before it has the record.
		deadline := time.Now().Add(5 * time.Second)
		for {
			b.mu.Lock()
			n := b.queries
			b.mu.Unlock()
			if n > 0 || time.Now().After(deadline) {
				break
			}
			select {
			case err := <-done:
				t.Fatalf("waitServed returned %v before the second server had the record", err)
			case <-time.After(10 * time.Millisecond):
			}
		}
		b.setTXT("_acme-challenge.example.test", "token")
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(8 * time.Second):
			t.Fatal("waitServed did not return once every server had the record")
		}
	})
	t.Run("a record never served fails after the timeout naming the server", func(t *testing.T) {
		f := startFakeDNS(t)
		f.setTXT("_acme-challenge.example.test", "stale")
		l := &dnsLookup{servers: []string{f.addr}, timeout: 600 * time.Millisecond}
		start := time.Now()
		err := l.waitServed(context.Background(), "example.test", "_acme-challenge.example.test", "token")
		if !errors.Is(err, ErrNotPropagated) || !strings.Contains(err.Error(), f.addr) || !strings.Contains(err.Error(), `"stale"`) {
			t.Fatalf("waitServed = %v; want ErrNotPropagated naming %s and what it served", err, f.addr)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("waitServed took %v, want about its 600ms timeout", took)
		}
	})
}

// recordingProvider records the records it is asked to add and delete,
// accepting them only in its zone.
type recordingProvider struct {
	zone              string
	mu                sync.Mutex
	added, deleted    []libdns.RR
	addedIn, deleteIn []string
}

func (p *recordingProvider) AppendRecords(_ context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	if zone != p.zone {
		return nil, errors.New("no such zone")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range recs {
		p.added = append(p.added, r.RR())
		p.addedIn = append(p.addedIn, zone)
	}
	return recs, nil
}

func (p *recordingProvider) DeleteRecords(_ context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range recs {
		p.deleted = append(p.deleted, r.RR())
		p.deleteIn = append(p.deleteIn, zone)
	}
	return recs, nil
}

func TestDNS01SolverFollowsDelegationAndWaits(t *testing.T) {
	f := startFakeDNS(t)
	f.mu.Lock()
	f.cname["_acme-challenge.shop.example.test."] = "shop.auth.acme.test."
	f.mu.Unlock()
	prov := &recordingProvider{zone: "auth.acme.test."}
	s := newDNS01Solver(prov, &dnsLookup{servers: []string{f.addr}, timeout: 600 * time.Millisecond}, 0)
	chal := acme.Challenge{Type: acme.ChallengeTypeDNS01, Token: "tok", KeyAuthorization: "tok.thumb",
		Identifier: acme.Identifier{Type: "dns", Value: "shop.example.test"}}
	ctx := context.Background()
	if err := s.Present(ctx, chal); err != nil {
		t.Fatal(err)
	}
	want := libdns.RR{Type: "TXT", Name: "shop", Data: chal.DNS01KeyAuthorization(), TTL: dns01RecordTTL}
	if len(prov.added) != 1 || prov.added[0] != want || prov.addedIn[0] != "auth.acme.test." {
		t.Fatalf("added %v in %v, want %v in auth.acme.test.", prov.added, prov.addedIn, want)
	}
	if err := s.Wait(ctx, chal); !errors.Is(err, ErrNotPropagated) || !strings.Contains(err.Error(), "shop.auth.acme.test") {
		t.Errorf("Wait before the record is served = %v, want ErrNotPropagated naming the delegated name", err)
	}
	f.setTXT("shop.auth.acme.test", chal.DNS01KeyAuthorization())
	if err := s.Wait(ctx, chal); err != nil {
		t.Errorf("Wait once served = %v", err)
	}
	if err := s.CleanUp(ctx, chal); err != nil {
		t.Fatal(err)
	}
	if len(prov.deleted) != 1 || prov.deleted[0] != want || prov.deleteIn[0] != "auth.acme.test." {
		t.Errorf("deleted %v in %v, want %v in auth.acme.test.", prov.deleted, prov.deleteIn, want)
	}
}

func TestDNSProviderConfiguration(t *testing.T) {
	rfc := map[string]string{"RFC2136_NAMESERVER": "ns1.example.net:5353", "RFC2136_TSIG_KEY": "edge", "RFC2136_TSIG_SECRET": "c2VjcmV0"}
	with := func(base map[string]string, k, v string) map[string]string {
		out := map[string]string{}
		for a, b := range base {
			out[a] = b
		}
		if v == "" {
			delete(out, k)
		} else {
			out[k] = v
		}
		return out
	}
	for _, tc := range []struct {
		name, provider string
		env            map[string]string
		wantErr        string // "" for none
	}{
		{"an unknown provider", "route53", nil, "want one of"},
		{"cloudflare with its token", "cloudflare", map[string]string{"CLOUDFLARE_API_TOKEN": "t"}, ""},
		{"cloudflare without its token", "cloudflare", nil, "CLOUDFLARE_API_TOKEN"},
		{"rfc2136 with every variable", "rfc2136", rfc, ""},
		{"rfc2136 with a nameserver without a port", "rfc2136", with(rfc, "RFC2136_NAMESERVER", "192.0.2.1"), ""},
		{"rfc2136 with an IPv6 nameserver", "rfc2136", with(rfc, "RFC2136_NAMESERVER", "[2001:db8::1]:53"), ""},
		{"rfc2136 with an algorithm", "rfc2136", with(rfc, "RFC2136_TSIG_ALGORITHM", "HMAC-SHA512."), ""},
		{"rfc2136 without a nameserver", "rfc2136", with(rfc, "RFC2136_NAMESERVER", ""), "RFC2136_NAMESERVER"},
		{"rfc2136 without a key name", "rfc2136", with(rfc, "RFC2136_TSIG_KEY", ""), "RFC2136_TSIG_KEY"},
		{"rfc2136 without a secret", "rfc2136", with(rfc, "RFC2136_TSIG_SECRET", ""), "RFC2136_TSIG_SECRET"},
		{"rfc2136 with a secret that is not base64", "rfc2136", with(rfc, "RFC2136_TSIG_SECRET", "not base64!"), "RFC2136_TSIG_SECRET"},
		{"rfc2136 with an unknown algorithm", "rfc2136", with(rfc, "RFC2136_TSIG_ALGORITHM", "hmac-md4"), "RFC2136_TSIG_ALGORITHM"},
		{"rfc2136 with a nameserver that is a URL", "rfc2136", with(rfc, "RFC2136_NAMESERVER", "https://ns1.example.net/"), "RFC2136_NAMESERVER"},
		{"rfc2136 with a key name that is not a name", "rfc2136", with(rfc, "RFC2136_TSIG_KEY", "a..b"), "RFC2136_TSIG_KEY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckDNSProvider(tc.provider, func(k string) string { return tc.env[k] })
			if tc.wantErr == "" {
				if err != nil {
					t.Errorf("CheckDNSProvider = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("CheckDNSProvider = %v, want an error naming %s", err, tc.wantErr)
			}
		})
	}
}

func TestRFC2136ErrorsNameServerAndKey(t *testing.T) {
	// A server that answers every update NOTAUTH, as one does for a key
	// it does not know.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		pc.Close()
		t.Skipf("no TCP port beside UDP %s: %v", pc.LocalAddr(), err)
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		r := new(dns.Msg)
		r.SetRcode(q, dns.RcodeNotAuth)
		w.WriteMsg(r)
	})
	accept := func(dns.Header) dns.MsgAcceptAction { return dns.MsgAccept }
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h, MsgAcceptFunc: accept}, {Listener: ln, Handler: h, MsgAcceptFunc: accept}} {
		go srv.ActivateAndServe()
		t.Cleanup(func() { srv.Shutdown() })
	}
	p, err := newDNSProvider("rfc2136", func(k string) string {
		return map[string]string{"RFC2136_NAMESERVER": ln.Addr().String(), "RFC2136_TSIG_KEY": "edge-key", "RFC2136_TSIG_SECRET": "c2VjcmV0"}[k]
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = p.AppendRecords(ctx, "example.test.", []libdns.Record{libdns.TXT{Name: "_acme-challenge", Text: "v", TTL: time.Minute}})
	if err == nil || !strings.Contains(err.Error(), ln.Addr().String()) || !strings.Contains(err.Error(), "edge-key") || !strings.Contains(err.Error(), "RFC2136_TSIG_SECRET") {
		t.Errorf("AppendRecords = %v, want an error naming the server, the key and the variables to check", err)
	}
}
