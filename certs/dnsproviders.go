package certs

// The DNS-01 providers the edge can write challenge records through, each
// configured by the environment variables its own documentation (or lego's,
// which Traefik operators know) names.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/libdns/cloudflare"
	"github.com/libdns/libdns"
	"github.com/libdns/rfc2136"
	"github.com/miekg/dns"
)

// DNSVar is one environment variable a DNS provider reads.
type DNSVar struct {
	Name string
	// Optional variables have a default, given in Doc.
	Optional bool
	// Doc says what the value is, for errors and the README.
	Doc string
}

// dnsProviderSpec is one provider: the variables it reads and how it is
// built from them. build may assume every required variable is set; it
// checks their form. client carries HTTP API calls (nil: the provider's
// default); providers that speak DNS ignore it.
type dnsProviderSpec struct {
	vars  []DNSVar
	build func(env func(string) string, client *http.Client) (dnsProvider, error)
}

// dnsProviders are the providers --dns-provider accepts, by name.
var dnsProviders = map[string]dnsProviderSpec{
	"cloudflare": {
		vars: []DNSVar{{Name: "CLOUDFLARE_API_TOKEN", Doc: "an API token with Zone:DNS:Edit on the zones"}},
		build: func(env func(string) string, client *http.Client) (dnsProvider, error) {
			p := &cloudflare.Provider{APIToken: env("CLOUDFLARE_API_TOKEN")}
			if client != nil {
				p.HTTPClient = client
			}
			return p, nil
		},
	},
	"rfc2136": {
		vars: []DNSVar{
			{Name: "RFC2136_NAMESERVER", Doc: "the primary server's host:port (port 53 when omitted)"},
			{Name: "RFC2136_TSIG_KEY", Doc: "the TSIG key's name"},
			{Name: "RFC2136_TSIG_SECRET", Doc: "the TSIG key's secret, base64"},
			{Name: "RFC2136_TSIG_ALGORITHM", Optional: true, Doc: "hmac-sha256 (default), hmac-sha1, hmac-sha224, hmac-sha384 or hmac-sha512"},
		},
		build: buildRFC2136,
	},
	"desec": {
		vars:  []DNSVar{{Name: "DESEC_TOKEN", Doc: "a deSEC API token (one without token management rights will do)"}},
		build: buildDesec,
	},
	"digitalocean": {
		vars:  []DNSVar{{Name: "DO_AUTH_TOKEN", Doc: "a DigitalOcean personal access token with read and write access to the domains"}},
		build: buildDigitalOcean,
	},
	"gandi": {
		vars:  []DNSVar{{Name: "GANDIV5_PERSONAL_ACCESS_TOKEN", Doc: "a Gandi personal access token allowed to manage the domains' DNS records"}},
		build: buildGandi,
	},
	"hetzner": {
		vars:  []DNSVar{{Name: "HETZNER_API_TOKEN", Doc: "a Hetzner Cloud API token with read & write permission, from the project holding the zones"}},
		build: buildHetzner,
	},
	"ovh": {
		vars: []DNSVar{
			{Name: "OVH_ENDPOINT", Doc: "ovh-eu, ovh-ca, ovh-us (or another go-ovh endpoint name), or the API's URL"},
			{Name: "OVH_APPLICATION_KEY", Doc: "the application key"},
			{Name: "OVH_APPLICATION_SECRET", Doc: "the application secret"},
			{Name: "OVH_CONSUMER_KEY", Doc: "a consumer key allowed GET, POST, PUT and DELETE on /domain/zone/*/record* and POST on /domain/zone/*/refresh"},
		},
		build: buildOVH,
	},
	"porkbun": {
		vars: []DNSVar{
			{Name: "PORKBUN_API_KEY", Doc: "the API key (pk1_…), with API access turned on for the domains"},
			{Name: "PORKBUN_SECRET_API_KEY", Doc: "the secret API key (sk1_…)"},
		},
		build: buildPorkbun,
	},
}

// DNSProviders lists the names --dns-provider accepts, sorted.
func DNSProviders() []string {
	names := make([]string, 0, len(dnsProviders))
	for n := range dnsProviders {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// DNSProviderVars lists the environment variables provider reads, or nil
// for a provider the edge does not know.
func DNSProviderVars(provider string) []DNSVar {
	return dnsProviders[provider].vars
}

// CheckDNSProvider reports what is wrong with provider's configuration as
// env reads it: an unknown provider, a required variable unset, or one
// whose value the provider cannot use; nil when it can be built.
func CheckDNSProvider(provider string, env func(string) string) error {
	_, err := newDNSProvider(provider, env, nil)
	return err
}

func newDNSProvider(provider string, env func(string) string, client *http.Client) (dnsProvider, error) {
	spec, ok := dnsProviders[provider]
	if !ok {
		return nil, fmt.Errorf("dns provider %q: want one of %s", provider, strings.Join(DNSProviders(), ", "))
	}
	if env == nil {
		env = func(string) string { return "" }
	}
	var missing []string
	for _, v := range spec.vars {
		if !v.Optional && strings.TrimSpace(env(v.Name)) == "" {
			missing = append(missing, fmt.Sprintf("%s (%s)", v.Name, v.Doc))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("dns provider %s needs %s", provider, strings.Join(missing, ", "))
	}
	p, err := spec.build(env, client)
	if err != nil {
		return nil, fmt.Errorf("dns provider %s: %w", provider, err)
	}
	return p, nil
}

// tsigAlgorithms maps the names RFC2136_TSIG_ALGORITHM accepts (as lego
// and BIND spell them, with or without the trailing dot) to miekg/dns's.
var tsigAlgorithms = map[string]string{
	"hmac-sha1":   dns.HmacSHA1,
	"hmac-sha224": dns.HmacSHA224,
	"hmac-sha256": dns.HmacSHA256,
	"hmac-sha384": dns.HmacSHA384,
	"hmac-sha512": dns.HmacSHA512,
}

func buildRFC2136(env func(string) string, _ *http.Client) (dnsProvider, error) {
	server := strings.TrimSpace(env("RFC2136_NAMESERVER"))
	if _, _, err := net.SplitHostPort(server); err != nil {
		// lego's default port.
		server = net.JoinHostPort(strings.Trim(server, "[]"), "53")
	}
	host, port, err := net.SplitHostPort(server)
	if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 1 || n > 65535 || host == "" || strings.ContainsAny(host, " /") {
		return nil, fmt.Errorf("RFC2136_NAMESERVER %q: want host:port", env("RFC2136_NAMESERVER"))
	}
	secret := strings.TrimSpace(env("RFC2136_TSIG_SECRET"))
	if _, err := base64.StdEncoding.DecodeString(secret); err != nil {
		return nil, fmt.Errorf("RFC2136_TSIG_SECRET: not base64: %w", err)
	}
	alg := strings.ToLower(strings.TrimSuffix(strings.TrimSpace(env("RFC2136_TSIG_ALGORITHM")), "."))
	if alg == "" {
		alg = "hmac-sha256"
	}
	fqAlg, ok := tsigAlgorithms[alg]
	if !ok {
		return nil, fmt.Errorf("RFC2136_TSIG_ALGORITHM %q: want hmac-sha256, hmac-sha1, hmac-sha224, hmac-sha384 or hmac-sha512", env("RFC2136_TSIG_ALGORITHM"))
	}
	key := strings.TrimSpace(env("RFC2136_TSIG_KEY"))
	if _, ok := dns.IsDomainName(key); !ok {
		return nil, fmt.Errorf("RFC2136_TSIG_KEY %q: not a key name", key)
	}
	return &rfc2136Provider{p: &rfc2136.Provider{Server: server, KeyName: key, Key: secret, KeyAlg: fqAlg}}, nil
}

// rfc2136Provider names the server and the TSIG key in its errors: the
// library's say only "NOTAUTH" or "bad signature", which does not tell an
// operator which of several servers or keys was refused.
type rfc2136Provider struct {
	p *rfc2136.Provider
}

var _ dnsProvider = (*rfc2136Provider)(nil)

func (r *rfc2136Provider) AppendRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	out, err := r.p.AppendRecords(ctx, zone, recs)
	return out, r.wrap("add to", zone, err)
}

func (r *rfc2136Provider) DeleteRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	out, err := r.p.DeleteRecords(ctx, zone, recs)
	return out, r.wrap("delete from", zone, err)
}

func (r *rfc2136Provider) wrap(op, zone string, err error) error {
	if err == nil {
		return nil
	}
	hint := ""
	if errors.Is(err, dns.ErrAuth) || errors.Is(err, dns.ErrSig) || errors.Is(err, dns.ErrSecret) || strings.Contains(err.Error(), "NOTAUTH") {
		// RFC 2845 §4.3 / RFC 8945 §5.3: a key the server does not know,
		// or a signature that does not verify, is answered NOTAUTH (the
		// same answer as for a zone the server is not primary for).
		hint = " (the server refused the update: check RFC2136_TSIG_KEY, RFC2136_TSIG_SECRET and RFC2136_TSIG_ALGORITHM against its key, and that it is primary for the zone)"
	}
	return fmt.Errorf("rfc2136 update to %s, TSIG key %s: %s %s: %w%s", r.p.Server, r.p.KeyName, op, zone, err, hint)
}

// dnsEnv is where opts's DNS provider reads its variables: opts.DNSEnv,
// with opts.CloudflareToken standing for CLOUDFLARE_API_TOKEN.
func dnsEnv(opts Options) func(string) string {
	return func(k string) string {
		if k == "CLOUDFLARE_API_TOKEN" && opts.CloudflareToken != "" {
			return opts.CloudflareToken
		}
		if opts.DNSEnv == nil {
			return ""
		}
		return opts.DNSEnv(k)
	}
}

// newDNS01SolverFor builds the DNS-01 solver opts configure.
func newDNS01SolverFor(opts Options) (*dns01Solver, error) {
	var client *http.Client
	if opts.DNSProvider == "cloudflare" {
		client = opts.CloudflareHTTPClient
	}
	p, err := newDNSProvider(opts.DNSProvider, dnsEnv(opts), client)
	if err != nil {
		return nil, err
	}
	if opts.DNSPropagationDelay < 0 {
		return newDNS01Solver(p, nil, 0), nil
	}
	lookup := &dnsLookup{servers: opts.DNSResolvers, timeout: orDur(opts.DNSPropagationTimeout, DefaultDNSPropagationTimeout)}
	return newDNS01Solver(p, lookup, opts.DNSPropagationDelay), nil
}
