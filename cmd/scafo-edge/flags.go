package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/scafo/scafo-edge/admission"
	"github.com/scafo/scafo-edge/certs"
	"github.com/scafo/scafo-edge/certs/prefetch"
)

// config is every setting of the serve command. Each field has a flag and an
// environment variable (docs/design.md, "The contract"); a flag given on the
// command line wins over the environment, which wins over the default.
type config struct {
	node              string
	routesFile        string
	operatorRoutes    string
	token             string
	tokenFile         string
	prefer            string
	pollInterval      time.Duration
	httpAddr          string
	httpsAddr         string
	adminAddr         string
	adminAllow        string
	stateDir          string
	tlsMode           string
	acmeCA            string
	acmeCARoot        string
	acmeEmail         string
	dnsProvider       string
	dnsResolvers      string
	dnsTimeout        time.Duration
	wildcardDomains   string
	certStore         string
	certPrefetch      bool
	prefetchPerHour   int
	trustedProxies    string
	dialTimeout       time.Duration
	responseTimeout   time.Duration
	shutdownTimeout   time.Duration
	logLevel          string
	logFormat         string
	accessLog         bool
	accessLogRate     int
	accessLogFormat   string
	accessLogAnon     bool
	errorPages        string
	maxBodyBytes      int64
	readHeaderTimeout time.Duration
	proxyProtocol     string
	sendTimeout       time.Duration
	http3             bool
	compress          bool
	handover          bool
	idleTimeout       time.Duration
	maxHeaderBytes    int

	memoryLimit          string
	maxConns             int
	maxConnsPerClient    int
	maxRequestsPerClient int
	appShare             int
	appQueueTimeout      time.Duration
	clientRate           int
	clientBurst          int
}

// flagDoc is one documented flag: the README's flag table is generated from
// these, and a test keeps the two in sync.
type flagDoc struct {
	Group, Name, Env, Default, Usage string
}

// flagSet is a flag.FlagSet that also reads each flag's environment variable
// and remembers the group each flag belongs to, for --help.
type flagSet struct {
	*flag.FlagSet
	docs  []flagDoc
	group string
}

func newFlagSet(name string) *flagSet {
	fs := &flagSet{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError)}
	fs.Usage = func() { fs.printUsage(fs.Output()) }
	return fs
}

func (fs *flagSet) add(name, env, usage string, def string) {
	fs.docs = append(fs.docs, flagDoc{Group: fs.group, Name: name, Env: env, Default: def, Usage: usage})
}

func (fs *flagSet) stringVar(p *string, name, env, def, usage string) {
	fs.StringVar(p, name, def, usage)
	fs.add(name, env, usage, def)
}

func (fs *flagSet) durationVar(p *time.Duration, name, env string, def time.Duration, usage string) {
	fs.DurationVar(p, name, def, usage)
	fs.add(name, env, usage, def.String())
}

func (fs *flagSet) boolVar(p *bool, name, env string, def bool, usage string) {
	fs.BoolVar(p, name, def, usage)
	fs.add(name, env, usage, fmt.Sprint(def))
}

func (fs *flagSet) intVar(p *int, name, env string, def int, usage string) {
	fs.IntVar(p, name, def, usage)
	fs.add(name, env, usage, fmt.Sprint(def))
}

// parse reads args, then fills every flag not given on the command line from
// its environment variable.
func (fs *flagSet) parse(args []string, getenv func(string) string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, d := range fs.docs {
		if given[d.Name] || d.Env == "" {
			continue
		}
		for _, env := range strings.Split(d.Env, " ") {
			if v := getenv(env); v != "" {
				if err := fs.Set(d.Name, v); err != nil {
					return fmt.Errorf("environment %s=%q: %w", env, v, err)
				}
				break
			}
		}
	}
	return nil
}

func (fs *flagSet) printUsage(w io.Writer) {
	fmt.Fprintf(w, "Usage: scafo-edge [serve] [flags]\n       scafo-edge demo|routes|health|version [flags]\n\nEvery flag can also be set by the environment variable shown.\n")
	group := ""
	for _, d := range fs.docs {
		if d.Group != group {
			group = d.Group
			fmt.Fprintf(w, "\n%s:\n", group)
		}
		def := ""
		if d.Default != "" {
			def = fmt.Sprintf(" (default %s)", d.Default)
		}
		env := ""
		if d.Env != "" {
			env = "  [" + d.Env + "]"
		}
		fmt.Fprintf(w, "  --%s%s%s\n      %s\n", d.Name, env, def, d.Usage)
	}
}

// serveFlags declares the serve command's flags on a new flag set.
func serveFlags(c *config) *flagSet {
	fs := newFlagSet("serve")
	fs.group = "Routing source"
	fs.stringVar(&c.node, "node", "SCAFO_EDGE_NODE", "http://127.0.0.1:7400", "node API base URL to poll for the routing document")
	fs.stringVar(&c.routesFile, "routes-file", "SCAFO_EDGE_ROUTES_FILE", "", "read the routing document from this file instead of a node (re-read when it changes)")
	fs.stringVar(&c.operatorRoutes, "operator-routes", "SCAFO_EDGE_OPERATOR_ROUTES", "", "the operator's own routes file, served beside the node's (or --routes-file's) routes and never overridden by them: the routing document's format plus redirects, allow lists, basic auth and response headers; re-read each second, a broken edit keeps the last good file (see \"Operator routes\")")
	fs.stringVar(&c.token, "ingress-token", "SCAFO_INGRESS_TOKEN", "", "bearer token for the node API")
	fs.stringVar(&c.tokenFile, "ingress-token-file", "SCAFO_INGRESS_TOKEN_FILE", "", "file holding the bearer token (keep it mode 0600)")
	fs.stringVar(&c.prefer, "prefer", "SCAFO_EDGE_PREFER", "self", "upstream order asked of the node: self, a node id, or none")
	fs.durationVar(&c.pollInterval, "poll-interval", "SCAFO_EDGE_POLL_INTERVAL", 5*time.Second, "how often to poll the routing document")

	fs.group = "Listeners"
	fs.stringVar(&c.httpAddr, "http-addr", "SCAFO_EDGE_HTTP_ADDR", ":80", "plain HTTP listener (ACME HTTP-01, redirects, HTTP-only hosts)")
	fs.stringVar(&c.httpsAddr, "https-addr", "SCAFO_EDGE_HTTPS_ADDR", ":443", "HTTPS listener (unused with --tls off)")
	fs.stringVar(&c.adminAddr, "admin-addr", "SCAFO_EDGE_ADMIN_ADDR", ":9180", "admin listener: /metrics, /healthz, /readyz, status page")
	fs.stringVar(&c.adminAllow, "admin-allow", "SCAFO_EDGE_ADMIN_ALLOW", "private", "who reads the admin listener's /metrics without the ingress token as a bearer, besides loopback and --trusted-proxies: comma-separated CIDRs and the words private (RFC 1918, 100.64.0.0/10, IPv6 ULA, link-local), any (everyone) or loopback (no one more); /healthz and /readyz answer everyone, the status page and pprof loopback or the token whatever this says")
	fs.durationVar(&c.shutdownTimeout, "shutdown-timeout", "SCAFO_EDGE_SHUTDOWN_TIMEOUT", 30*time.Second, "how long in-flight requests may run after SIGTERM")
	fs.durationVar(&c.readHeaderTimeout, "read-header-timeout", "SCAFO_EDGE_READ_HEADER_TIMEOUT", 60*time.Second, "time a client has to send its request headers or finish its TLS handshake, stretched for each connection by a factor of its own from 1 to 1.5 so that connections opened together do not time out together; at the connection budget, slow first requests give up their room sooner")
	fs.durationVar(&c.sendTimeout, "send-timeout", "SCAFO_EDGE_SEND_TIMEOUT", 60*time.Second, "close a client connection, or give up on an upstream, when one write to it makes no progress this long (a peer that stopped reading); streams that keep flowing are not cut (0: never)")
	fs.durationVar(&c.idleTimeout, "idle-timeout", "SCAFO_EDGE_IDLE_TIMEOUT", 120*time.Second, "how long an idle keep-alive client connection is kept; over HTTP/1.1 each connection's is stretched by the same factor of its own as its header timeout (1 to 1.5), so that connections opened together do not close together")
	fs.boolVar(&c.compress, "compress", "SCAFO_EDGE_COMPRESS", true, "compress responses with zstd or gzip for clients that accept them: text, JSON, JavaScript, XML, SVG and WebAssembly of 512 bytes or more that the application did not encode, never with Cache-Control: no-transform, a range, HEAD or server-sent events; skipped while memory is past its high-water mark")
	fs.intVar(&c.maxHeaderBytes, "max-header-bytes", "SCAFO_EDGE_MAX_HEADER_BYTES", 64<<10, "largest request header block accepted (431 beyond)")
	fs.bytesVar(&c.maxBodyBytes, "max-body-bytes", "SCAFO_EDGE_MAX_BODY_BYTES", "largest request body forwarded, in bytes or with a unit (10MiB): a larger Content-Length is answered 413 before anything reaches the upstream, a chunked body is cut where it crosses it (413, or a reset once the response has begun); an operator route's max_body_bytes overrides it (0: no limit)")
	fs.dirVar(&c.errorPages, "error-pages", "SCAFO_EDGE_ERROR_PAGES", "directory of HTML pages for the edge's own answers, any of 404.html, 429.html, 502.html, 503.html and 504.html, re-read within seconds of a change; never served in place of an application's response, and clients preferring application/json get a JSON body instead (default: the edge's short text)")
	fs.stringVar(&c.proxyProtocol, "proxy-protocol-from", "SCAFO_EDGE_PROXY_PROTOCOL_FROM", "", "comma-separated CIDRs allowed to send a PROXY protocol v1/v2 header on the HTTP and HTTPS listeners; a header from anywhere else closes the connection")
	fs.stringVar(&c.trustedProxies, "trusted-proxies", "SCAFO_EDGE_TRUSTED_PROXIES", "", "comma-separated CIDRs whose X-Forwarded-* headers are kept (default: none)")

	fs.group = "Overload and fairness"
	fs.stringVar(&c.memoryLimit, "memory-limit", "SCAFO_EDGE_MEMORY_LIMIT", "", "memory the edge keeps under, in bytes or with a unit as GOMEMLIMIT takes (512MiB, 2GiB): the connection budget, the Go memory limit (90 % of it) and the 503s past 75 % live follow it (default: GOMEMLIMIT, else the tightest limit of the edge's cgroup and its parents, else a quarter of the box's memory)")
	fs.intVar(&c.maxConns, "max-conns", "SCAFO_EDGE_MAX_CONNS", 0, "client and upstream connections the edge holds at most; at it, new connections wait in the kernel's backlog (0: the descriptor limit less a reserve for the edge's own work, and at most half the memory limit at 32 KiB each)")
	fs.intVar(&c.maxConnsPerClient, "max-conns-per-client", "SCAFO_EDGE_MAX_CONNS_PER_CLIENT", 0, "connections one client address (IPv4, IPv6 /64) may hold while the edge is under pressure; past it new ones are refused (0: 1/16 of --max-conns, at least 64)")
	fs.intVar(&c.maxRequestsPerClient, "max-requests-per-client", "SCAFO_EDGE_MAX_REQUESTS_PER_CLIENT", 0, "requests one client address may have in flight; past it 429 (0: as --max-conns-per-client)")
	fs.intVar(&c.appShare, "app-share", "SCAFO_EDGE_APP_SHARE", 75, "percent of what other applications leave of the request budget (half of --max-conns) that one application may hold in flight; past it requests queue, then 503")
	fs.durationVar(&c.appQueueTimeout, "app-queue-timeout", "SCAFO_EDGE_APP_QUEUE_TIMEOUT", admission.DefaultQueueTimeout, "how long a request past its application's share waits for a slot before 503")
	fs.intVar(&c.clientRate, "client-rate", "SCAFO_EDGE_CLIENT_RATE", 0, "requests a second one client address may start; past it 429 (0: no rate limit)")
	fs.intVar(&c.clientBurst, "client-burst", "SCAFO_EDGE_CLIENT_BURST", 0, "burst of --client-rate (0: twice the rate)")

	fs.group = "Upstreams"
	fs.durationVar(&c.dialTimeout, "dial-timeout", "SCAFO_EDGE_DIAL_TIMEOUT", 3*time.Second, "connect timeout per upstream before failing over to the next")
	fs.durationVar(&c.responseTimeout, "response-header-timeout", "SCAFO_EDGE_RESPONSE_HEADER_TIMEOUT", 0, "answer 504 when an upstream sends no response headers in this time (0: wait; streams and long polls work)")

	fs.group = "State"
	fs.stringVar(&c.stateDir, "state-dir", "SCAFO_EDGE_STATE_DIR", "/var/lib/scafo-edge", "directory for edge.db (last good document, certificates, ACME account)")
	fs.boolVar(&c.handover, "handover", "SCAFO_EDGE_HANDOVER", true, "take the listening sockets of an edge already running on --state-dir (it drains and exits 0), and offer this edge's to the next one, over <state-dir>/handover.sock: upgrades refuse no connection")

	fs.group = "TLS"
	fs.stringVar(&c.tlsMode, "tls", "SCAFO_EDGE_TLS", "acme", "acme, internal (a local CA kept in state) or off (HTTP only)")
	fs.stringVar(&c.acmeCA, "acme-ca", "SCAFO_EDGE_ACME_CA", "https://acme-v02.api.letsencrypt.org/directory", "ACME directory URL")
	fs.stringVar(&c.acmeCARoot, "acme-ca-root", "SCAFO_EDGE_ACME_CA_ROOT", "", "PEM file of extra roots to trust for the ACME server (e.g. Pebble's)")
	fs.stringVar(&c.acmeEmail, "acme-email", "SCAFO_EDGE_ACME_EMAIL", "", "ACME account email")
	fs.stringVar(&c.dnsProvider, "dns-provider", "SCAFO_EDGE_DNS_PROVIDER", "", "DNS-01 provider for wildcard certificates, configured by its environment variables (README, TLS): "+strings.Join(certs.DNSProviders(), ", "))
	fs.stringVar(&c.dnsResolvers, "dns-resolvers", "SCAFO_EDGE_DNS_RESOLVERS", "", "comma-separated DNS servers (host:port) asked where a DNS-01 record goes (CNAME delegation) and that must serve it before the CA looks (default: the system's resolvers, then the zone's NS)")
	fs.durationVar(&c.dnsTimeout, "dns-propagation-timeout", "SCAFO_EDGE_DNS_PROPAGATION_TIMEOUT", certs.DefaultDNSPropagationTimeout, "how long a DNS-01 record may take to be served by every authoritative server before the issuance fails")
	fs.stringVar(&c.wildcardDomains, "wildcard-domains", "SCAFO_EDGE_WILDCARD_DOMAINS", "", "comma-separated bases to keep *.<base> certificates for (needs --dns-provider)")
	fs.boolVar(&c.http3, "http3", "SCAFO_EDGE_HTTP3", true, "serve HTTP/3 over UDP on the HTTPS port and advertise it with Alt-Svc (only with TLS on)")
	fs.stringVar(&c.certStore, "cert-store", "SCAFO_EDGE_CERT_STORE", "", "local (bbolt only) or fleet (through the node, bbolt as local copy); default fleet with --node, local with --routes-file")
	fs.boolVar(&c.certPrefetch, "cert-prefetch", "SCAFO_EDGE_CERT_PREFETCH", true, "with --tls acme, obtain certificates for names a new document adds before their first visitor, once each name answers a reachability check through its DNS (false: on demand only)")
	fs.intVar(&c.prefetchPerHour, "cert-prefetch-per-hour", "SCAFO_EDGE_CERT_PREFETCH_PER_HOUR", prefetch.DefaultPerHour, "most ACME orders prefetch places an hour (and at most 10 per registered domain a week); the rest wait")

	fs.group = "Logging"
	fs.stringVar(&c.logLevel, "log-level", "SCAFO_EDGE_LOG_LEVEL", "info", "debug, info, warn or error")
	fs.stringVar(&c.logFormat, "log-format", "SCAFO_EDGE_LOG_FORMAT", "json", "json or console")
	fs.boolVar(&c.accessLog, "access-log", "SCAFO_EDGE_ACCESS_LOG", true, "write one line per request")
	fs.intVar(&c.accessLogRate, "access-log-rate", "SCAFO_EDGE_ACCESS_LOG_RATE", 1000, "most access log lines per second; the rest are counted, not written (0: no limit)")
	fs.oneOfVar(&c.accessLogFormat, "access-log-format", "SCAFO_EDGE_ACCESS_LOG_FORMAT", "json", []string{"json", "combined"}, "json (one object a line, among the other logs) or combined (the Apache and nginx format log analysers read, written to standard output)")
	fs.boolVar(&c.accessLogAnon, "access-log-anonymise", "SCAFO_EDGE_ACCESS_LOG_ANONYMISE", false, "log client addresses cut to their network, IPv4 /24 and IPv6 /48 (for operators who may not keep personal data)")
	return fs
}

func getenv(k string) string { return os.Getenv(k) }
