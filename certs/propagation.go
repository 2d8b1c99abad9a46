package certs

// The DNS look-ups around a DNS-01 challenge: where the record goes (a
// CNAME at _acme-challenge.<name> delegates it, as acme-dns setups do) and
// whether the zone's authoritative servers serve it yet, so the CA is told
// to look only once it can find it.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// DefaultDNSPropagationTimeout bounds the wait for a DNS-01 record to be
// served by every authoritative server of its zone.
const DefaultDNSPropagationTimeout = 2 * time.Minute

// maxCNAMEHops bounds a delegation chain; a longer one is a loop or a
// mistake.
const maxCNAMEHops = 8

// dnsLookup asks DNS servers what DNS-01 needs. The zero value asks the
// system's resolvers (/etc/resolv.conf) and each zone's authoritative
// servers.
type dnsLookup struct {
	// servers, when set (host:port), are asked for CNAMEs and are the
	// servers a record must be served by, in place of the system's
	// resolvers and the zone's NS records: for a split-horizon setup, an
	// RFC 2136 primary that is not listed in NS, or a test's server.
	servers []string
	// timeout bounds waitServed; zero means DefaultDNSPropagationTimeout.
	timeout time.Duration
}

func (l *dnsLookup) exchange(ctx context.Context, q *dns.Msg, server string) (*dns.Msg, error) {
	c := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
	r, _, err := c.ExchangeContext(ctx, q, server)
	if err == nil && r.Truncated {
		c.Net = "tcp"
		r, _, err = c.ExchangeContext(ctx, q, server)
	}
	return r, err
}

// resolvers are the servers asked for CNAMEs and NS records.
func (l *dnsLookup) resolvers() ([]string, error) {
	if len(l.servers) > 0 {
		return l.servers, nil
	}
	cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil {
		return nil, fmt.Errorf("system resolvers: %w", err)
	}
	var out []string
	for _, s := range cc.Servers {
		out = append(out, net.JoinHostPort(s, cc.Port))
	}
	if len(out) == 0 {
		return nil, errors.New("system resolvers: none in /etc/resolv.conf")
	}
	return out, nil
}

// query asks each resolver in turn until one gives an answer that is not
// a server failure; rd sets Recursion Desired.
func (l *dnsLookup) query(ctx context.Context, servers []string, name string, qtype uint16, rd bool) (*dns.Msg, error) {
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	q.RecursionDesired = rd
	var errs []error
	for _, s := range servers {
		r, err := l.exchange(ctx, q, s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s, err))
			continue
		}
		if r.Rcode != dns.RcodeSuccess && r.Rcode != dns.RcodeNameError {
			errs = append(errs, fmt.Errorf("%s: %s", s, dns.RcodeToString[r.Rcode]))
			continue
		}
		return r, nil
	}
	return nil, fmt.Errorf("query %s %s: %w", name, dns.TypeToString[qtype], errors.Join(errs...))
}

// followCNAME returns where the TXT record for fqdn belongs: fqdn itself,
// or the end of the CNAME chain that starts there (RFC 8555 §8.4: the CA
// follows it like any resolver does). The result has no trailing dot.
func (l *dnsLookup) followCNAME(ctx context.Context, fqdn string) (string, error) {
	servers, err := l.resolvers()
	if err != nil {
		return "", err
	}
	name := dns.Fqdn(strings.ToLower(fqdn))
	seen := []string{name}
	for range maxCNAMEHops {
		r, err := l.query(ctx, servers, name, dns.TypeCNAME, true)
		if err != nil {
			return "", fmt.Errorf("look for a CNAME at %s: %w", fqdn, err)
		}
		next := ""
		for _, rr := range r.Answer {
			if c, ok := rr.(*dns.CNAME); ok && strings.EqualFold(c.Hdr.Name, name) {
				next = strings.ToLower(dns.Fqdn(c.Target))
			}
		}
		if next == "" {
			return strings.TrimSuffix(name, "."), nil
		}
		if slices.Contains(seen, next) {
			return "", fmt.Errorf("CNAME loop at %s: %s", fqdn, strings.Join(append(seen, next), " -> "))
		}
		seen = append(seen, next)
		name = next
	}
	return "", fmt.Errorf("CNAME chain at %s longer than %d: %s", fqdn, maxCNAMEHops, strings.Join(seen, " -> "))
}

// authoritative lists the servers that must serve a record of zone: the
// configured servers, or every address of every NS of zone, port 53.
func (l *dnsLookup) authoritative(ctx context.Context, zone string) ([]string, error) {
	if len(l.servers) > 0 {
		return l.servers, nil
	}
	resolvers, err := l.resolvers()
	if err != nil {
		return nil, err
	}
	r, err := l.query(ctx, resolvers, zone, dns.TypeNS, true)
	if err != nil {
		return nil, fmt.Errorf("authoritative servers of %s: %w", zone, err)
	}
	var out []string
	for _, rr := range r.Answer {
		ns, ok := rr.(*dns.NS)
		if !ok {
			continue
		}
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
			ar, err := l.query(ctx, resolvers, ns.Ns, qt, true)
			if err != nil {
				continue
			}
			for _, a := range ar.Answer {
				switch a := a.(type) {
				case *dns.A:
					out = append(out, net.JoinHostPort(a.A.String(), "53"))
				case *dns.AAAA:
					out = append(out, net.JoinHostPort(a.AAAA.String(), "53"))
				}
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("authoritative servers of %s: no NS record with an address", zone)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// ErrNotPropagated is the error waitServed returns, wrapped, when a record
// is still missing at some authoritative server when the wait ends.
var ErrNotPropagated = errors.New("dns-01 record not served by every authoritative server")

// waitServed waits until every authoritative server of zone answers fqdn's
// TXT with value, asking again with a growing interval, and fails after
// the timeout naming the servers that never did.
func (l *dnsLookup) waitServed(ctx context.Context, zone, fqdn, value string) error {
	timeout := l.timeout
	if timeout <= 0 {
		timeout = DefaultDNSPropagationTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	servers, err := l.authoritative(ctx, zone)
	if err != nil {
		return err
	}
	pending := slices.Clone(servers)
	last := map[string]string{}
	interval := 250 * time.Millisecond
	for {
		pending = slices.DeleteFunc(pending, func(s string) bool {
			ok, why := l.serves(ctx, s, fqdn, value)
			last[s] = why
			return ok
		})
		if len(pending) == 0 {
			return nil
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			var why []string
			for _, s := range pending {
				why = append(why, s+": "+last[s])
			}
			return fmt.Errorf("%w: %s TXT after %s: %s", ErrNotPropagated, fqdn, timeout, strings.Join(why, "; "))
		case <-t.C:
		}
		interval = min(2*interval, 4*time.Second)
	}
}

// serves reports whether server answers fqdn's TXT with value, and if not
// what it answered.
func (l *dnsLookup) serves(ctx context.Context, server, fqdn, value string) (bool, string) {
	r, err := l.query(ctx, []string{server}, fqdn, dns.TypeTXT, false)
	if err != nil {
		return false, err.Error()
	}
	var got []string
	for _, rr := range r.Answer {
		if t, ok := rr.(*dns.TXT); ok {
			v := strings.Join(t.Txt, "")
			if v == value {
				return true, ""
			}
			got = append(got, v)
		}
	}
	if len(got) == 0 {
		return false, "no TXT record (" + dns.RcodeToString[r.Rcode] + ")"
	}
	return false, fmt.Sprintf("other TXT values %q", got)
}
