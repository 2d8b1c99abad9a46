package certs

// The DNS-01 providers that are a maintained libdns package each, with the
// adjustments the edge's solver needs where a package falls short of it.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/digitalocean/godo"
	"github.com/libdns/desec"
	"github.com/libdns/gandi"
	"github.com/libdns/hetzner/v2"
	"github.com/libdns/libdns"
	"github.com/libdns/ovh"
	"github.com/libdns/porkbun"
	goovh "github.com/ovh/go-ovh/ovh"
)

// The libdns packages send their requests through http.DefaultClient (or
// a client of their own on http.DefaultTransport) and take no
// *http.Client, so their builds ignore the one newDNSProvider is given.

func buildDesec(env func(string) string, _ *http.Client) (dnsProvider, error) {
	// The package raises the TTL to deSEC's minimum, 3600 s.
	return &desec.Provider{Token: strings.TrimSpace(env("DESEC_TOKEN"))}, nil
}

func buildHetzner(env func(string) string, _ *http.Client) (dnsProvider, error) {
	// The package raises the TTL to the API's minimum, 60 s.
	return hetzner.New(strings.TrimSpace(env("HETZNER_API_TOKEN"))), nil
}

func buildGandi(env func(string) string, _ *http.Client) (dnsProvider, error) {
	return &gandiProvider{p: &gandi.Provider{BearerToken: strings.TrimSpace(env("GANDIV5_PERSONAL_ACCESS_TOKEN"))}}, nil
}

func buildDigitalOcean(env func(string) string, client *http.Client) (dnsProvider, error) {
	return newDigitalOceanProvider(strings.TrimSpace(env("DO_AUTH_TOKEN")), client), nil
}

func buildPorkbun(env func(string) string, _ *http.Client) (dnsProvider, error) {
	return &porkbunProvider{creds: porkbun.ApiCredentials{
		Apikey:       strings.TrimSpace(env("PORKBUN_API_KEY")),
		Secretapikey: strings.TrimSpace(env("PORKBUN_SECRET_API_KEY")),
	}}, nil
}

// ovhEndpointNames lists the names OVH_ENDPOINT accepts besides a URL.
func ovhEndpointNames() string {
	names := make([]string, 0, len(goovh.Endpoints))
	for n := range goovh.Endpoints {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func buildOVH(env func(string) string, _ *http.Client) (dnsProvider, error) {
	endpoint := strings.TrimSpace(env("OVH_ENDPOINT"))
	if _, known := goovh.Endpoints[endpoint]; !known {
		// go-ovh takes anything with a slash for the API's URL.
		u, err := url.Parse(endpoint)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || strings.HasSuffix(endpoint, "/") {
			return nil, fmt.Errorf("OVH_ENDPOINT %q: want one of %s, or the API's URL (https://…/1.0, no trailing slash)", endpoint, ovhEndpointNames())
		}
	}
	return &ovh.Provider{
		Endpoint:          endpoint,
		ApplicationKey:    strings.TrimSpace(env("OVH_APPLICATION_KEY")),
		ApplicationSecret: strings.TrimSpace(env("OVH_APPLICATION_SECRET")),
		ConsumerKey:       strings.TrimSpace(env("OVH_CONSUMER_KEY")),
	}, nil
}

// unquoteTXT is a TXT value as the solver wrote it: APIs hand values back
// in the zone-file form, quoted.
func unquoteTXT(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return s[1 : len(s)-1]
	}
	return s
}

// sameTXT reports whether got (a record an API listed) is want, the record
// the solver created: same name, type TXT, same text.
func sameTXT(got, want libdns.RR) bool {
	return strings.EqualFold(got.Type, "TXT") && strings.EqualFold(strings.TrimSuffix(got.Name, "."), strings.TrimSuffix(want.Name, ".")) &&
		unquoteTXT(got.Data) == want.Data
}

// gandiMinTTL is LiveDNS's smallest rrset_ttl; the package sends the TTL
// it is given, which LiveDNS refuses below this.
const gandiMinTTL = 300 * time.Second

// gandiProvider raises the TTL to LiveDNS's minimum.
type gandiProvider struct {
	p *gandi.Provider
}

func (g *gandiProvider) AppendRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	out := make([]libdns.Record, 0, len(recs))
	for _, r := range recs {
		rr := r.RR()
		rr.TTL = max(rr.TTL, gandiMinTTL)
		out = append(out, rr)
	}
	return g.p.AppendRecords(ctx, zone, out)
}

// DeleteRecords hands the package each record's text as LiveDNS lists it
// where its rrset holds other values too: the package then keeps the
// values not equal to the text it is given, and LiveDNS lists TXT values
// quoted, so given the unquoted text it would keep them all (a domain's
// challenge record deleted with its wildcard's would stay).
func (g *gandiProvider) DeleteRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	have, err := g.p.GetRecords(ctx, zone)
	if err != nil {
		return nil, fmt.Errorf("list records: %w", err)
	}
	var out []libdns.Record
	for _, r := range recs {
		want := r.RR()
		var match *libdns.RR
		values := 0
		for _, h := range have {
			hr := h.RR()
			if strings.EqualFold(hr.Type, want.Type) && strings.EqualFold(hr.Name, want.Name) {
				values++
				if sameTXT(hr, want) {
					match = &hr
				}
			}
		}
		if match == nil {
			continue
		}
		if values > 1 {
			want.Data = match.Data
		}
		if _, err := g.p.DeleteRecords(ctx, zone, []libdns.Record{want}); err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// digitalOceanProvider writes records through godo, DigitalOcean's own
// client, rather than github.com/libdns/digitalocean: that package's
// DeleteRecords deletes only records carrying the ID its AppendRecords
// returned (the solver deletes the record it asked for), and its godo
// client cannot be given an *http.Client. Deleting by the ID found at the
// record's name and text, two challenges at one name (a domain and its
// wildcard) each delete only their own.
type digitalOceanProvider struct {
	c *godo.Client
}

// bearerTransport authorizes each request with a token.
type bearerTransport struct {
	token string
	base  http.RoundTripper
}

func (b *bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

func newDigitalOceanProvider(token string, client *http.Client) *digitalOceanProvider {
	hc := &http.Client{Timeout: 30 * time.Second}
	base := http.DefaultTransport
	if client != nil {
		*hc = *client
		if client.Transport != nil {
			base = client.Transport
		}
	}
	hc.Transport = &bearerTransport{token: token, base: base}
	return &digitalOceanProvider{c: godo.NewClient(hc)}
}

func (d *digitalOceanProvider) AppendRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	domain := strings.TrimSuffix(zone, ".")
	var out []libdns.Record
	for _, r := range recs {
		rr := r.RR()
		_, _, err := d.c.Domains.CreateRecord(ctx, domain, &godo.DomainRecordEditRequest{Type: rr.Type, Name: rr.Name, Data: rr.Data, TTL: int(rr.TTL.Seconds())})
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

func (d *digitalOceanProvider) DeleteRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	domain := strings.TrimSuffix(zone, ".")
	var out []libdns.Record
	for _, r := range recs {
		rr := r.RR()
		fqdn := libdns.AbsoluteName(rr.Name, zone)
		have, _, err := d.c.Domains.RecordsByTypeAndName(ctx, domain, rr.Type, strings.TrimSuffix(fqdn, "."), &godo.ListOptions{PerPage: 200})
		if err != nil {
			return out, fmt.Errorf("list %s records at %s: %w", rr.Type, fqdn, err)
		}
		for _, h := range have {
			if !sameTXT(libdns.RR{Name: h.Name, Type: h.Type, Data: h.Data}, rr) {
				continue
			}
			if _, err := d.c.Domains.DeleteRecord(ctx, domain, h.ID); err != nil {
				return out, fmt.Errorf("delete record %d: %w", h.ID, err)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// porkbunProvider deletes records by ID, through the package's request
// helper: the package deletes every record of the name and type, which
// removes a domain's challenge record with its wildcard's while the CA
// has yet to look at the second. It also stops waiting when ctx ends,
// which the package's requests do not. (The package raises the TTL to
// Porkbun's minimum, 600 s.)
type porkbunProvider struct {
	creds porkbun.ApiCredentials
}

// porkbunRecords is the answer of /dns/retrieveByNameType.
type porkbunRecords struct {
	Status  string `json:"status"`
	Message string `json:"message"`
	Records []struct {
		ID      json.Number `json:"id"`
		Name    string      `json:"name"`
		Type    string      `json:"type"`
		Content string      `json:"content"`
	} `json:"records"`
}

type porkbunStatus struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

// porkbunCall runs fn, returning early with ctx's error if ctx ends
// first (fn then finishes on its own).
func porkbunCall(ctx context.Context, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *porkbunProvider) AppendRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	var out []libdns.Record
	err := porkbunCall(ctx, func() error {
		var err error
		out, err = (&porkbun.Provider{APIKey: p.creds.Apikey, APISecretKey: p.creds.Secretapikey}).AppendRecords(ctx, zone, recs)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (p *porkbunProvider) DeleteRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	var deleted []libdns.Record
	err := porkbunCall(ctx, func() error {
		var err error
		deleted, err = p.deleteRecords(zone, recs)
		return err
	})
	if err != nil {
		return nil, err
	}
	return deleted, nil
}

func (p *porkbunProvider) deleteRecords(zone string, recs []libdns.Record) ([]libdns.Record, error) {
	domain := porkbun.LibdnsZoneToPorkbunDomain(zone)
	creds, err := json.Marshal(p.creds)
	if err != nil {
		return nil, err
	}
	var deleted []libdns.Record
	for _, r := range recs {
		rr := r.RR()
		sub := porkbun.LibdnsNameToPorkbunName(rr.Name, zone)
		list, err := porkbun.MakeApiRequest(fmt.Sprintf("/dns/retrieveByNameType/%s/%s/%s", domain, rr.Type, sub), bytes.NewReader(creds), porkbunRecords{})
		if err != nil {
			return deleted, fmt.Errorf("list %s records at %s: %w", rr.Type, rr.Name, err)
		}
		if list.Status != "SUCCESS" {
			return deleted, fmt.Errorf("list %s records at %s: status %s %s", rr.Type, rr.Name, list.Status, list.Message)
		}
		for _, have := range list.Records {
			if !strings.EqualFold(have.Type, rr.Type) || unquoteTXT(have.Content) != rr.Data {
				continue
			}
			res, err := porkbun.MakeApiRequest(fmt.Sprintf("/dns/delete/%s/%s", domain, have.ID), bytes.NewReader(creds), porkbunStatus{})
			if err != nil {
				return deleted, fmt.Errorf("delete record %s: %w", have.ID, err)
			}
			if res.Status != "SUCCESS" {
				return deleted, fmt.Errorf("delete record %s: status %s %s", have.ID, res.Status, res.Message)
			}
			deleted = append(deleted, r)
		}
	}
	return deleted, nil
}
