package main

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/admin"
	"github.com/scafo/scafo-edge/admission"
	"github.com/scafo/scafo-edge/certs"
)

// settings are what validate derives from the flags: the parsed forms the
// parts and listeners are built from.
type settings struct {
	logLevel     zerolog.Level
	trusted      []netip.Prefix      // --trusted-proxies
	adminAllow   []netip.Prefix      // --admin-allow
	proxyFrom    []netip.Prefix      // --proxy-protocol-from
	wildcards    []string            // --wildcard-domains
	dnsEnv       func(string) string // where --dns-provider reads its variables
	dnsResolvers []string            // --dns-resolvers, host:port
	certStore    string              // --cert-store with its default resolved
	limits       admission.Limits    // the overload flags; zero fields are derived at start
}

// validate checks every flag of the serve command before anything is opened,
// so a bad value stops the process at start-up with an error that names the
// flag at fault ("--flag: reason"). Flags that matter only with TLS on are
// checked only then, as they are used only then.
func validate(c *config, getenv func(string) string) (settings, error) {
	var s settings
	lvl, err := zerolog.ParseLevel(c.logLevel)
	if err != nil || c.logLevel == "" {
		return s, fmt.Errorf("--log-level: %q: want debug, info, warn or error", c.logLevel)
	}
	s.logLevel = lvl
	switch c.logFormat {
	case "json", "console":
	default:
		return s, fmt.Errorf("--log-format: %q: want json or console", c.logFormat)
	}
	if s.trusted, err = parseCIDRs(c.trustedProxies); err != nil {
		return s, fmt.Errorf("--trusted-proxies: %w", err)
	}
	if s.proxyFrom, err = parseCIDRs(c.proxyProtocol); err != nil {
		return s, fmt.Errorf("--proxy-protocol-from: %w", err)
	}
	if s.adminAllow, err = admin.ParseAllow(c.adminAllow); err != nil {
		return s, fmt.Errorf("--admin-allow: %w", err)
	}
	if s.limits, err = admissionLimits(c); err != nil {
		return s, err
	}
	if c.maxHeaderBytes <= 0 {
		// net/http would take it as "its default", 1 MiB: not what was asked.
		return s, fmt.Errorf("--max-header-bytes: %d: want a positive number of bytes", c.maxHeaderBytes)
	}
	switch c.tlsMode {
	case "off":
		return s, nil
	case "acme", "internal":
	default:
		return s, fmt.Errorf("--tls: %q: want acme, internal or off", c.tlsMode)
	}

	for _, d := range strings.Split(c.wildcardDomains, ",") {
		if d = strings.TrimSpace(d); d != "" {
			s.wildcards = append(s.wildcards, d)
		}
	}
	if len(s.wildcards) > 0 && c.tlsMode == "acme" && c.dnsProvider == "" {
		return s, fmt.Errorf("--wildcard-domains: needs --dns-provider (wildcard certificates are DNS-01 only)")
	}
	s.dnsEnv = getenv
	if c.dnsProvider != "" {
		if err := certs.CheckDNSProvider(c.dnsProvider, getenv); err != nil {
			return s, fmt.Errorf("--dns-provider: %w", err)
		}
	}
	if s.dnsResolvers, err = parseHostPorts(c.dnsResolvers, "53"); err != nil {
		return s, fmt.Errorf("--dns-resolvers: %w", err)
	}
	if c.dnsTimeout <= 0 {
		return s, fmt.Errorf("--dns-propagation-timeout: %s: want more than 0", c.dnsTimeout)
	}

	// The fleet store is the default when polling a node; a routes file
	// has no node to share certificates through.
	s.certStore = c.certStore
	if s.certStore == "" {
		s.certStore = "fleet"
		if c.routesFile != "" {
			s.certStore = "local"
		}
	}
	switch s.certStore {
	case "local", "fleet":
	default:
		return s, fmt.Errorf("--cert-store: %q: want local or fleet", c.certStore)
	}
	if s.certStore == "fleet" && c.routesFile != "" {
		return s, fmt.Errorf("--cert-store: fleet needs a node (--node), not --routes-file")
	}
	if c.certPrefetch && c.prefetchPerHour < 1 {
		return s, fmt.Errorf("--cert-prefetch-per-hour: %d: want at least 1 (--cert-prefetch=false turns prefetch off)", c.prefetchPerHour)
	}
	return s, nil
}

// admissionLimits checks the overload flags; what they leave zero is derived
// from the process's limits at start (admission.Derive).
func admissionLimits(c *config) (admission.Limits, error) {
	var l admission.Limits
	for _, f := range []struct {
		name string
		v    int
	}{{"--max-conns", c.maxConns}, {"--max-conns-per-client", c.maxConnsPerClient},
		{"--max-requests-per-client", c.maxRequestsPerClient}, {"--client-rate", c.clientRate}, {"--client-burst", c.clientBurst}} {
		if f.v < 0 {
			return l, fmt.Errorf("%s: %d: want 0 (derived) or more", f.name, f.v)
		}
	}
	if c.appShare < 1 || c.appShare > 100 {
		return l, fmt.Errorf("--app-share: %d: want a percentage from 1 to 100", c.appShare)
	}
	if c.appQueueTimeout <= 0 || c.appQueueTimeout > time.Minute {
		return l, fmt.Errorf("--app-queue-timeout: %s: want more than 0 and at most 1m (a request waits this long before its 503)", c.appQueueTimeout)
	}
	if c.clientBurst > 0 && c.clientRate == 0 {
		return l, fmt.Errorf("--client-burst: needs --client-rate")
	}
	if c.maxConns > 0 && c.maxConnsPerClient > c.maxConns {
		return l, fmt.Errorf("--max-conns-per-client: %d is more than --max-conns %d", c.maxConnsPerClient, c.maxConns)
	}
	memory, err := parseBytes(c.memoryLimit)
	if err != nil {
		return l, fmt.Errorf("--memory-limit: %w", err)
	}
	return admission.Limits{
		MemoryLimit: memory,
		MaxConns:    c.maxConns, ConnsPerClient: c.maxConnsPerClient, RequestsPerClient: c.maxRequestsPerClient,
		AppShare: float64(c.appShare) / 100, QueueTimeout: c.appQueueTimeout,
		ClientRate: float64(c.clientRate), ClientBurst: c.clientBurst,
	}, nil
}

// parseBytes parses a size as GOMEMLIMIT spells one: a whole number of
// bytes with an optional unit B, KiB, MiB, GiB or TiB. "" and "0" are 0.
func parseBytes(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	num, mult := s, int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q: want a number of bytes, with a unit B, KiB, MiB, GiB or TiB if any (512MiB)", s)
	}
	return n * mult, nil
}

// parseCIDRs parses a comma-separated list of CIDRs or bare addresses (a
// bare address is its own /32 or /128).
func parseCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			if a, aerr := netip.ParseAddr(f); aerr == nil {
				p = netip.PrefixFrom(a, a.BitLen())
			} else {
				return nil, fmt.Errorf("parse %q: %w", f, err)
			}
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// parseHostPorts parses a comma-separated list of host:port addresses; a
// bare host or address gets defPort.
func parseHostPorts(s, defPort string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		host, port, err := net.SplitHostPort(f)
		if err != nil {
			host, port = strings.Trim(f, "[]"), defPort
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" || strings.ContainsAny(host, " /[]") {
			return nil, fmt.Errorf("%q: want host:port", f)
		}
		out = append(out, net.JoinHostPort(host, port))
	}
	return out, nil
}
