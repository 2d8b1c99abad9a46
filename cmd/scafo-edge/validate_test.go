package main

import (
	"strings"
	"testing"
)

func TestValidateNamesTheFlagAtFault(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string // prefix of the error; "" for none
	}{
		{"the defaults are valid", nil, nil, ""},
		{"an unknown log level", []string{"--log-level", "loud"}, nil, "--log-level: "},
		{"an empty log level", []string{"--log-level", ""}, nil, "--log-level: "},
		{"an unknown log format", []string{"--log-format", "xml"}, nil, "--log-format: "},
		{"a malformed trusted proxy", []string{"--trusted-proxies", "10.0.0.0/8,nope"}, nil, "--trusted-proxies: "},
		{"a malformed PROXY protocol source", []string{"--proxy-protocol-from", "300.1.1.1"}, nil, "--proxy-protocol-from: "},
		{"a malformed admin allow list", []string{"--admin-allow", "private,nope"}, nil, "--admin-allow: "},
		{"an admin listener open to all", []string{"--admin-allow", "any"}, nil, ""},
		{"an admin allow list with a zone", []string{"--admin-allow", "fe80::1%eth0"}, nil, "--admin-allow: "},
		{"an admin allow list of networks and words", []string{"--admin-allow", "10.83.0.0/16, 203.0.113.9, private"}, nil, ""},
		{"an unknown TLS mode", []string{"--tls", "maybe"}, nil, "--tls: "},
		{"a header limit of zero", []string{"--max-header-bytes", "0"}, nil, "--max-header-bytes: "},
		{"a negative header limit", []string{"--max-header-bytes", "-1"}, nil, "--max-header-bytes: "},
		{"wildcards without a DNS provider", []string{"--wildcard-domains", "example.com"}, nil, "--wildcard-domains: "},
		{"an unknown DNS provider", []string{"--dns-provider", "route53"}, nil, "--dns-provider: "},
		{"cloudflare without its token", []string{"--dns-provider", "cloudflare"}, nil, "--dns-provider: "},
		{"cloudflare with its token", []string{"--dns-provider", "cloudflare", "--wildcard-domains", "example.com"},
			map[string]string{"CLOUDFLARE_API_TOKEN": "t"}, ""},
		{"rfc2136 with its variables", []string{"--dns-provider", "rfc2136", "--wildcard-domains", "example.com"}, map[string]string{"RFC2136_NAMESERVER": "192.0.2.53:53", "RFC2136_TSIG_KEY": "edge", "RFC2136_TSIG_SECRET": "c2VjcmV0"}, ""},
		{"rfc2136 without its nameserver", []string{"--dns-provider", "rfc2136"}, map[string]string{"RFC2136_TSIG_KEY": "edge", "RFC2136_TSIG_SECRET": "c2VjcmV0"}, "--dns-provider: dns provider rfc2136 needs RFC2136_NAMESERVER"},
		{"rfc2136 without its key name", []string{"--dns-provider", "rfc2136"}, map[string]string{"RFC2136_NAMESERVER": "ns:53", "RFC2136_TSIG_SECRET": "c2VjcmV0"}, "--dns-provider: dns provider rfc2136 needs RFC2136_TSIG_KEY"},
		{"rfc2136 without its secret", []string{"--dns-provider", "rfc2136"}, map[string]string{"RFC2136_NAMESERVER": "ns:53", "RFC2136_TSIG_KEY": "edge"}, "--dns-provider: dns provider rfc2136 needs RFC2136_TSIG_SECRET"},
		{"rfc2136 with a secret that is not base64", []string{"--dns-provider", "rfc2136"}, map[string]string{"RFC2136_NAMESERVER": "ns:53", "RFC2136_TSIG_KEY": "edge", "RFC2136_TSIG_SECRET": "%%%"}, "--dns-provider: dns provider rfc2136: RFC2136_TSIG_SECRET"},
		{"rfc2136 with an unknown algorithm", []string{"--dns-provider", "rfc2136"}, map[string]string{"RFC2136_NAMESERVER": "ns:53", "RFC2136_TSIG_KEY": "edge", "RFC2136_TSIG_SECRET": "c2VjcmV0", "RFC2136_TSIG_ALGORITHM": "md5"}, "--dns-provider: dns provider rfc2136: RFC2136_TSIG_ALGORITHM"},
		{"hetzner without its token", []string{"--dns-provider", "hetzner", "--wildcard-domains", "example.com"}, map[string]string{}, "--dns-provider: dns provider hetzner needs HETZNER_API_TOKEN"},
		{"ovh with an unknown endpoint", []string{"--dns-provider", "ovh"}, map[string]string{"OVH_ENDPOINT": "ovh-mars", "OVH_APPLICATION_KEY": "k", "OVH_APPLICATION_SECRET": "s", "OVH_CONSUMER_KEY": "c"}, "--dns-provider: dns provider ovh: OVH_ENDPOINT"},
		{"DNS resolvers with and without ports", []string{"--dns-resolvers", "192.0.2.53, ns.example.net:5353,[2001:db8::53]:53"}, nil, ""},
		{"a DNS resolver with a bad port", []string{"--dns-resolvers", "192.0.2.53:99999"}, nil, "--dns-resolvers: "},
		{"a DNS resolver that is a URL", []string{"--dns-resolvers", "https://dns.example/"}, nil, "--dns-resolvers: "},
		{"no propagation timeout", []string{"--dns-propagation-timeout", "0s"}, nil, "--dns-propagation-timeout: "},
		{"an unknown cert store", []string{"--cert-store", "s3"}, nil, "--cert-store: "},
		{"a fleet store without a node", []string{"--cert-store", "fleet", "--routes-file", "r.json"}, nil, "--cert-store: "},
		{"a prefetch budget under one order an hour", []string{"--cert-prefetch-per-hour", "0"}, nil, "--cert-prefetch-per-hour: "},
		{"no prefetch budget with prefetch off", []string{"--cert-prefetch=false", "--cert-prefetch-per-hour", "0"}, nil, ""},
		{"a negative connection budget", []string{"--max-conns", "-1"}, nil, "--max-conns: "},
		{"a negative per-client connection share", []string{"--max-conns-per-client", "-5"}, nil, "--max-conns-per-client: "},
		{"a negative per-client request share", []string{"--max-requests-per-client", "-5"}, nil, "--max-requests-per-client: "},
		{"a per-client share above the budget", []string{"--max-conns", "100", "--max-conns-per-client", "101"}, nil, "--max-conns-per-client: "},
		{"an application share of nothing", []string{"--app-share", "0"}, nil, "--app-share: "},
		{"an application share above the whole", []string{"--app-share", "101"}, nil, "--app-share: "},
		{"no queue timeout", []string{"--app-queue-timeout", "0"}, nil, "--app-queue-timeout: "},
		{"a queue timeout that is a hang", []string{"--app-queue-timeout", "5m"}, nil, "--app-queue-timeout: "},
		{"a negative client rate", []string{"--client-rate", "-1"}, nil, "--client-rate: "},
		{"a burst without a rate", []string{"--client-burst", "10"}, nil, "--client-burst: "},
		{"a rate with its burst", []string{"--client-rate", "50", "--client-burst", "100", "--app-share", "100"}, nil, ""},
		{"a memory limit with a unit", []string{"--memory-limit", "512MiB"}, nil, ""},
		{"a memory limit from the environment", nil, map[string]string{"SCAFO_EDGE_MEMORY_LIMIT": "2GiB"}, ""},
		{"a memory limit in plain words", []string{"--memory-limit", "lots"}, nil, "--memory-limit: "},
		{"a negative memory limit", []string{"--memory-limit", "-1GiB"}, nil, "--memory-limit: "},
		{"a memory limit in decimal units", []string{"--memory-limit", "512MB"}, nil, "--memory-limit: "},
		{"the overload flags are checked with TLS off", []string{"--tls", "off", "--app-share", "0"}, nil, "--app-share: "},
		{"TLS flags are not checked with TLS off", []string{"--tls", "off", "--cert-store", "s3", "--dns-provider", "route53"}, nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c config
			if err := serveFlags(&c).parse(tc.args, func(string) string { return "" }); err != nil {
				t.Fatal(err)
			}
			_, err := validate(&c, func(k string) string { return tc.env[k] })
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("validate(%q) = %v, want nil", tc.args, err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Errorf("validate(%q) = %v, want an error starting %q", tc.args, err, tc.want)
			}
		})
	}
}

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"", 0, true}, {"0", 0, true}, {"1073741824", 1 << 30, true}, {"1024B", 1024, true},
		{"64KiB", 64 << 10, true}, {"512MiB", 512 << 20, true}, {"2GiB", 2 << 30, true}, {"1TiB", 1 << 40, true},
		{"1.5GiB", 0, false}, {"512MB", 0, false}, {"512mib", 0, false}, {"GiB", 0, false}, {"-1", 0, false},
		{" 512MiB", 0, false}, {"9223372036854775807TiB", 0, false}, {"max", 0, false},
	} {
		got, err := parseBytes(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestValidateResolvesTheCertStoreDefault(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "fleet"},
		{[]string{"--routes-file", "r.json"}, "local"},
		{[]string{"--cert-store", "local"}, "local"},
	} {
		var c config
		if err := serveFlags(&c).parse(tc.args, func(string) string { return "" }); err != nil {
			t.Fatal(err)
		}
		s, err := validate(&c, func(string) string { return "" })
		if err != nil || s.certStore != tc.want {
			t.Errorf("validate(%q).certStore = %q, %v; want %q", tc.args, s.certStore, err, tc.want)
		}
	}
}
