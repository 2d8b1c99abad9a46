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

// dns01RecordTTL is the TTL of the challenge records: short, as they live
// for one validation, and no shorter than most providers accept.
const dns01RecordTTL = 60 * time.Second

// dns01Solver answers DNS-01 challenges through a libdns provider.
//
// certmagic's own DNS01Solver finds the zone by asking resolvers for the SOA
// of the name; this one asks the provider instead (trying the name's parent
// domains, longest first), so the zone is the one the provider holds even
// where public DNS says otherwise (split horizon, a primary not in NS).
type dns01Solver struct {
	provider dnsProvider
	// lookup follows a CNAME at the challenge name and checks the record
	// at the zone's authoritative servers; nil does neither (the record
	// goes at the challenge name, the CA is told at once after delay).
	lookup *dnsLookup
	// delay is waited after the record is served (or at once, without
	// lookup): for anycast fleets behind the listed servers.
	delay time.Duration

	mu sync.Mutex
	// zones remembers the zone found for each record name, and presented
	// the records created per challenge so Wait checks and CleanUp deletes
	// exactly those.
	zones     map[string]string
	presented map[string]presentedRecord
}

type presentedRecord struct {
	zone string
	fqdn string // where the record is: the challenge name or its CNAME's target
	rec  libdns.TXT
}

var (
	_ acmez.Solver = (*dns01Solver)(nil)
	_ acmez.Waiter = (*dns01Solver)(nil)
)

func newDNS01Solver(p dnsProvider, lookup *dnsLookup, delay time.Duration) *dns01Solver {
	return &dns01Solver{provider: p, lookup: lookup, delay: delay, zones: map[string]string{}, presented: map[string]presentedRecord{}}
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

// Present creates the challenge's TXT record, at the end of the CNAME
// chain at _acme-challenge.<name> if there is one (delegation into a zone
// the provider manages, as with acme-dns), in the first zone the provider
// accepts.
func (s *dns01Solver) Present(ctx context.Context, chal acme.Challenge) error {
	fqdn := chal.DNS01TXTRecordName()
	if s.lookup != nil {
		target, err := s.lookup.followCNAME(ctx, fqdn)
		if err != nil {
			return fmt.Errorf("present dns-01 record %s: %w", fqdn, err)
		}
		fqdn = target
	}
	// The record's own name comes first: _acme-challenge is sometimes a
	// zone of its own, delegated to a server that takes updates.
	candidates := zoneCandidates(fqdn)
	s.mu.Lock()
	if z, ok := s.zones[fqdn]; ok {
		candidates = []string{z}
	}
	s.mu.Unlock()
	var errs []error
	for _, zone := range candidates {
		rec := libdns.TXT{Name: libdns.RelativeName(fqdn+".", zone+"."), Text: chal.DNS01KeyAuthorization(), TTL: dns01RecordTTL}
		if _, err := s.provider.AppendRecords(ctx, zone+".", []libdns.Record{rec}); err != nil {
			errs = append(errs, fmt.Errorf("zone %s: %w", zone, err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		s.mu.Lock()
		s.zones[fqdn] = zone
		s.presented[challengeKey(chal)] = presentedRecord{zone: zone, fqdn: fqdn, rec: rec}
		s.mu.Unlock()
		return nil
	}
	if len(errs) == 0 {
		errs = append(errs, errors.New("no parent domain to try as its zone"))
	}
	return fmt.Errorf("present dns-01 record %s: %w", fqdn, errors.Join(errs...))
}

// Wait returns once the record is served by every authoritative server of
// its zone (then after delay), or fails when it is not within the lookup's
// timeout, so the CA never looks before it can find the record.
func (s *dns01Solver) Wait(ctx context.Context, chal acme.Challenge) error {
	s.mu.Lock()
	p, ok := s.presented[challengeKey(chal)]
	s.mu.Unlock()
	if ok && s.lookup != nil {
		if err := s.lookup.waitServed(ctx, p.zone, p.fqdn, p.rec.Text); err != nil {
			return fmt.Errorf("wait for dns-01 record %s: %w", p.fqdn, err)
		}
	}
	if s.delay <= 0 {
		return nil
	}
	t := time.NewTimer(s.delay)
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
		return fmt.Errorf("delete dns-01 record %s: %w", p.fqdn, err)
	}
	return nil
}
