package certs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/libdns/libdns"
	"github.com/mholt/acmez/v3"
	"github.com/mholt/acmez/v3/acme"
)

// dnsProvider is what the DNS-01 solver needs from a libdns provider.
type dnsProvider interface {
	libdns.RecordAppender
	libdns.RecordDeleter
}

// dns01Solver answers DNS-01 challenges through a libdns provider.
//
// certmagic's own DNS01Solver finds the zone by asking resolvers for the SOA
// of the name; this one asks the provider instead (trying the name's parent
// domains, longest first), so it needs no DNS resolution of its own and
// works where the provider's API is the only thing the edge can reach.
type dns01Solver struct {
	provider dnsProvider
	// propagationDelay is waited between creating the record and telling
	// the CA to look; the provider's authoritative servers need a moment.
	propagationDelay time.Duration

	mu sync.Mutex
	// zones remembers the zone found for each domain, and presented the
	// records created per challenge so CleanUp deletes exactly those.
	zones     map[string]string
	presented map[string]presentedRecord
}

type presentedRecord struct {
	zone string
	rec  libdns.TXT
}

var (
	_ acmez.Solver = (*dns01Solver)(nil)
	_ acmez.Waiter = (*dns01Solver)(nil)
)

func newDNS01Solver(p dnsProvider, propagationDelay time.Duration) *dns01Solver {
	return &dns01Solver{provider: p, propagationDelay: propagationDelay, zones: map[string]string{}, presented: map[string]presentedRecord{}}
}

func challengeKey(chal acme.Challenge) string {
	return chal.DNS01TXTRecordName() + " " + chal.DNS01KeyAuthorization()
}

// zoneCandidates lists the parent domains of name that could be its zone,
// longest first, stopping above the top-level label.
func zoneCandidates(domain string) []string {
	domain = strings.TrimSuffix(strings.TrimPrefix(domain, "*."), ".")
	var out []string
	for d := domain; strings.Contains(d, "."); d = d[strings.IndexByte(d, '.')+1:] {
		out = append(out, d)
	}
	return out
}

// Present creates the challenge's TXT record in the first zone the
// provider accepts.
func (s *dns01Solver) Present(ctx context.Context, chal acme.Challenge) error {
	domain := strings.TrimPrefix(chal.Identifier.Value, "*.")
	fqdn := chal.DNS01TXTRecordName()
	candidates := zoneCandidates(domain)
	s.mu.Lock()
	if z, ok := s.zones[domain]; ok {
		candidates = []string{z}
	}
	s.mu.Unlock()
	var errs []error
	for _, zone := range candidates {
		rec := libdns.TXT{Name: libdns.RelativeName(fqdn+".", zone+"."), Text: chal.DNS01KeyAuthorization()}
		if _, err := s.provider.AppendRecords(ctx, zone+".", []libdns.Record{rec}); err != nil {
			errs = append(errs, fmt.Errorf("zone %s: %w", zone, err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		s.mu.Lock()
		s.zones[domain] = zone
		s.presented[challengeKey(chal)] = presentedRecord{zone: zone, rec: rec}
		s.mu.Unlock()
		return nil
	}
	return fmt.Errorf("present dns-01 record %s: %w", fqdn, errors.Join(errs...))
}

// Wait gives the provider's servers time to serve the new record.
func (s *dns01Solver) Wait(ctx context.Context, _ acme.Challenge) error {
	if s.propagationDelay <= 0 {
		return nil
	}
	t := time.NewTimer(s.propagationDelay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// CleanUp deletes the record Present created for chal.
func (s *dns01Solver) CleanUp(ctx context.Context, chal acme.Challenge) error {
	key := challengeKey(chal)
	s.mu.Lock()
	p, ok := s.presented[key]
	delete(s.presented, key)
	s.mu.Unlock()
	if !ok {
		return nil
	}
	if _, err := s.provider.DeleteRecords(ctx, p.zone+".", []libdns.Record{p.rec}); err != nil {
		return fmt.Errorf("delete dns-01 record %s: %w", chal.DNS01TXTRecordName(), err)
	}
	return nil
}
