// Package certs owns scafo-edge's TLS certificates: certmagic configured for
// on-demand issuance gated by a decision function (a name gets a
// certificate only when the live routing document names it exactly),
// HTTP-01, TLS-ALPN-01 and DNS-01 (Cloudflare) challenges, wildcard
// certificates kept managed by DNS-01, certificate storage in the edge's
// bbolt file (or a shared store handed in, with the ACME account kept
// local), an internal CA mode, and the HTTP-to-HTTPS redirect.
//
// It knows nothing about routing or proxying: the caller hands it the
// decision function and the bbolt database, and wires TLSConfig and
// HTTPHandler into its listeners.
package certs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/scafo/scafo-edge/certs/prefetch"
	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/promreg"
)

// Mode selects where certificates come from.
type Mode string

const (
	// ModeACME obtains certificates from an ACME CA (Let's Encrypt by default).
	ModeACME Mode = "acme"
	// ModeInternal issues certificates from a local CA kept in storage.
	ModeInternal Mode = "internal"
	// ModeOff serves no TLS: the edge listens on HTTP only.
	ModeOff Mode = "off"
)

// Defaults for zero Options fields.
const (
	DefaultMaxIssuancesInFlight = 4
	// The back-off spaces a failing name's attempts out; the hard stop
	// before Let's Encrypt's limit of five failed validations per name
	// per hour is the count of failed validations (validations.go).
	DefaultFailureBackoffBase = 5 * time.Minute
	DefaultFailureBackoffMax  = time.Hour
)

// Options configures a Manager.
type Options struct {
	// Mode is where certificates come from; empty means ModeACME.
	Mode Mode
	// DB is the edge's state database; required unless Mode is ModeOff.
	// The ACME account, and with a nil Storage everything else, is kept in
	// its "certmagic" buckets.
	DB *bolt.DB
	// Storage holds certificates, keys, challenge tokens and issuance locks.
	// Nil means NewBoltStorage(DB). When set (a fleet-shared store), ACME
	// account keys and registrations still go to DB.
	Storage certmagic.Storage
	// Allowed reports whether a certificate may be requested for name: true
	// only when the live routing document names it exactly (a route host or
	// an API host). It is called on every on-demand decision, including
	// before a certificate is loaded from storage, so it must be cheap and
	// safe for concurrent use. Nil refuses every name.
	Allowed func(name string) bool

	// CA is the ACME directory URL; empty means Let's Encrypt production.
	CA string
	// CARoot is extra PEM roots to trust for the ACME server's own TLS
	// (Pebble's), given as PEM text or as the path of a PEM file. Empty
	// trusts the system roots only.
	CARoot string
	// Email is the ACME account's contact; empty registers without one.
	Email string

	// DNSProvider is "" (no DNS-01) or one of DNSProviders, configured by
	// the variables DNSProviderVars lists, read through DNSEnv.
	DNSProvider string
	// DNSEnv reads DNSProvider's variables; nil reads none.
	DNSEnv func(string) string
	// CloudflareToken, when set, stands for CLOUDFLARE_API_TOKEN.
	CloudflareToken string
	// CloudflareHTTPClient carries the Cloudflare API calls; nil means
	// http.DefaultClient. Tests point it at a fake of the API.
	CloudflareHTTPClient *http.Client
	// DNSResolvers (host:port) are asked where a DNS-01 record goes (a
	// CNAME at _acme-challenge.<name> delegates it) and must all serve
	// it before the CA is told to look. Empty means the system's
	// resolvers, and the zone's authoritative servers from its NS
	// records.
	DNSResolvers []string
	// DNSPropagationTimeout bounds the wait for a DNS-01 record to be
	// served; the issuance fails, naming the servers without it, past
	// it. Zero means DefaultDNSPropagationTimeout.
	DNSPropagationTimeout time.Duration
	// DNSPropagationDelay is waited once the record is served, for
	// servers the check does not see (anycast); zero means none.
	// Negative means no DNS look-up at all: the record goes at the
	// challenge name and the CA is told at once (a test whose DNS is a
	// fake provider's).
	DNSPropagationDelay time.Duration
	// WildcardDomains are bases for which "*.<base>" and "<base>" are
	// obtained by DNS-01 at start (or from the internal CA) and kept
	// renewed. Hosts one label under a base are then served with the
	// wildcard certificate without any issuance of their own.
	WildcardDomains []string

	// HTTPPort is the port the plain-HTTP listener is bound to; zero means
	// 80. certmagic would otherwise open its own HTTP-01 listener there.
	HTTPPort int
	// HTTPSPort is the port clients reach HTTPS on, used in redirects (and
	// omitted from them when 443) and as the TLS-ALPN-01 port; zero means 443.
	HTTPSPort int

	// MaxIssuancesInFlight bounds concurrent issuances; further ones wait.
	// Zero means DefaultMaxIssuancesInFlight.
	MaxIssuancesInFlight int
	// FailureBackoffBase and FailureBackoffMax shape the per-name back-off
	// after a failed on-demand issuance: Base, doubling with each failure
	// in a row, capped at Max. Zero means the defaults above.
	FailureBackoffBase, FailureBackoffMax time.Duration

	// Clock is where the Manager reads time for its per-name back-offs and
	// failed validations, and the prefetch queue's clock. Nil means the
	// wall clock. certmagic's renewals keep their own, real timers.
	Clock clock.Clock

	// Prefetch, when not nil, obtains certificates in the background for
	// the names each routing document adds, before anyone asks (Manager.
	// Prefetch, package certs/prefetch); ModeACME only. Its Log and Clock
	// are the Manager's; a nil Registerer means the Manager's. Nil: on
	// demand only.
	Prefetch *prefetch.Options

	// Log receives the package's logs and certmagic's; the zero value logs
	// nothing.
	Log zerolog.Logger
	// Registerer receives the package's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// CertInfo describes one certificate the edge holds in memory.
type CertInfo struct {
	Names    []string
	Issuer   string
	NotAfter time.Time
}

// Manager runs certificate management for one edge process.
type Manager struct {
	mode      Mode
	log       zerolog.Logger
	allowed   func(string) bool
	httpsPort int

	ctx    context.Context
	cancel context.CancelFunc

	cache *certmagic.Cache
	// cfg serves on-demand names; wcfg (nil without WildcardDomains and,
	// in ModeACME, without a DNS provider) keeps the wildcard and base
	// certificates managed, and the held wildcards adopted (held.go).
	cfg, wcfg *certmagic.Config
	// acme answers HTTP-01 challenges; nil in internal mode.
	acme *certmagic.ACMEIssuer
	// pcfg places prefetch's orders: HTTP-01 only (prefetch.go); nil
	// without prefetch.
	pcfg *certmagic.Config
	// validations counts failed validations per name, fleet-wide, and
	// holds back issuances that could reach the CA's limit.
	validations *validations
	ca          *internalCA

	bases   map[string]bool // wildcard bases
	backoff *issuanceBackoff
	slots   chan struct{}
	metrics *metrics
	// prefetch is nil unless Options.Prefetch is set in ModeACME.
	prefetch *prefetch.Queue

	// renewsHeldBy is the DNS provider in ModeACME ("": none), which
	// renews a held "*.<base>" the document names (HeldWildcards);
	// adopted are the bases of those, copy-on-write as handshakes read it.
	renewsHeldBy string
	adopted      atomic.Pointer[map[string]bool]

	mu sync.Mutex
	// held counts the issuance slots taken per name, released when
	// certmagic reports the issuance's outcome.
	held map[string]int
	// pending holds, per name, the cancel functions of handshakes waiting
	// in certmagic, so a failed issuance ends them at once instead of
	// leaving them in certmagic's one-minute retry wait.
	pending map[string]map[uint64]context.CancelFunc
	nextID  uint64
	// known are the SAN sets of certificates certmagic cached.
	known map[string][]string
	// unnamedReads paces the storage reads for HTTP-01 tokens of hosts
	// the document does not name (mayHoldChallenge).
	unnamedReads *rate.Limiter
	// validCerts are the names of certificates certmagic cached, with
	// until when the latest is valid (hasValidCert).
	validCerts map[string]time.Time

	closeOnce sync.Once
}

// New configures certificate management. In ModeACME and ModeInternal it
// loads what storage holds and starts obtaining the wildcard certificates in
// the background. ctx bounds only the start-up work (loading or creating
// the internal CA); the Manager runs until Close.
func New(ctx context.Context, opts Options) (*Manager, error) {
	if opts.Mode == "" {
		opts.Mode = ModeACME
	}
	m := newManager(opts)
	switch opts.Mode {
	case ModeOff:
		return m, nil
	case ModeACME, ModeInternal:
	default:
		return nil, fmt.Errorf("tls mode %q: want acme, internal or off", opts.Mode)
	}
	bases, err := checkOptions(opts)
	if err != nil {
		return nil, err
	}
	m.bases = bases
	if opts.Mode == ModeACME {
		m.renewsHeldBy = opts.DNSProvider
	}
	storage, err := openStorage(opts)
	if err != nil {
		return nil, err
	}

	// Metrics are registered first and other parts can fail after them:
	// what the batch registered is unregistered then, so a failed New
	// leaves the registry as it found it.
	reg, batch := opts.Registerer, promreg.NewBatch(opts.Registerer)
	if batch != nil {
		reg = batch
	}
	fail := func(err error) (*Manager, error) {
		m.Close()
		batch.Undo()
		return nil, err
	}
	m.validations = newValidations(storage, opts.Clock)
	m.metrics, err = newMetrics(reg, m)
	if err != nil {
		return nil, err
	}
	m.validations.log, m.validations.unread = m.log, m.metrics.validationReadErrors

	m.ctx, m.cancel = context.WithCancel(context.WithoutCancel(ctx))
	zl := newZapLogger(opts.Log)
	base := m.newConfigs(storage, zl)
	if opts.Mode == ModeInternal {
		err = m.useInternalCA(ctx, storage)
	} else {
		err = m.useACME(opts, base, zl)
	}
	if err != nil {
		return fail(err)
	}
	if opts.Prefetch != nil && opts.Mode == ModeACME {
		if err := m.startPrefetch(*opts.Prefetch, reg); err != nil {
			return fail(err)
		}
	}
	if err := m.manageWildcards(); err != nil {
		return fail(err)
	}
	return m, nil
}

// newManager is a Manager with opts' settings and empty bookkeeping: all
// that ModeOff needs.
func newManager(opts Options) *Manager {
	return &Manager{
		mode:         opts.Mode,
		log:          opts.Log,
		allowed:      opts.Allowed,
		httpsPort:    orInt(opts.HTTPSPort, 443),
		bases:        map[string]bool{},
		held:         map[string]int{},
		pending:      map[string]map[uint64]context.CancelFunc{},
		known:        map[string][]string{},
		validCerts:   map[string]time.Time{},
		unnamedReads: rate.NewLimiter(unnamedChallengeRate, unnamedChallengeBurst),
		backoff:      newIssuanceBackoff(orDur(opts.FailureBackoffBase, DefaultFailureBackoffBase), orDur(opts.FailureBackoffMax, DefaultFailureBackoffMax), opts.Clock),
		slots:        make(chan struct{}, orInt(opts.MaxIssuancesInFlight, DefaultMaxIssuancesInFlight)),
	}
}

// checkOptions refuses what ModeACME and ModeInternal cannot run with (no
// database, an unknown DNS provider or no token for it, a wildcard base
// that is not a domain or has no way to be validated) and returns the
// wildcard bases, normalised.
func checkOptions(opts Options) (bases map[string]bool, err error) {
	if opts.DB == nil {
		return nil, errors.New("tls mode " + string(opts.Mode) + ": no state database")
	}
	if opts.DNSProvider != "" {
		if err := CheckDNSProvider(opts.DNSProvider, dnsEnv(opts)); err != nil {
			return nil, err
		}
	}
	bases = map[string]bool{}
	for _, b := range opts.WildcardDomains {
		b = strings.TrimSuffix(strings.TrimPrefix(strings.ToLower(strings.TrimSpace(b)), "*."), ".")
		if b == "" || !strings.Contains(b, ".") {
			return nil, fmt.Errorf("wildcard domain %q: want a base such as example.com", b)
		}
		bases[b] = true
	}
	if len(bases) > 0 && opts.Mode == ModeACME && opts.DNSProvider == "" {
		return nil, errors.New("wildcard domains need a dns provider (DNS-01 is the only challenge a wildcard can use)")
	}
	return bases, nil
}

// openStorage is the bbolt storage in opts.DB, or opts.Storage with the
// ACME account kept in opts.DB.
func openStorage(opts Options) (certmagic.Storage, error) {
	local, err := NewBoltStorage(opts.DB)
	if err != nil {
		return nil, err
	}
	if opts.Storage != nil {
		return &accountLocal{shared: opts.Storage, local: local}, nil
	}
	return local, nil
}

// newConfigs makes the certificate cache and the on-demand config, and the
// wildcard config when there are bases or held wildcards may be renewed,
// all without issuers yet. It returns the settings they share, for
// further configs.
func (m *Manager) newConfigs(storage certmagic.Storage, zl *zap.Logger) certmagic.Config {
	m.cache = certmagic.NewCache(certmagic.CacheOptions{GetConfigForCert: m.configFor, Logger: zl})
	base := certmagic.Config{
		Storage:        storage,
		Logger:         zl,
		OnEvent:        m.onEvent,
		ShouldEmitFunc: wantEvent,
		Issuers:        []certmagic.Issuer{},
	}
	onDemand := base
	onDemand.OnDemand = &certmagic.OnDemandConfig{DecisionFunc: m.decide}
	m.cfg = certmagic.New(m.cache, onDemand)
	if len(m.bases) > 0 || m.renewsHeldBy != "" {
		m.wcfg = certmagic.New(m.cache, base)
	}
	return base
}

// manageWildcards starts obtaining and renewing "*.<base>" and "<base>" for
// every wildcard base, in the background.
func (m *Manager) manageWildcards() error {
	if m.wcfg == nil || len(m.bases) == 0 {
		return nil
	}
	var names []string
	for b := range m.bases {
		names = append(names, "*."+b, b)
	}
	sort.Strings(names)
	if err := m.wcfg.ManageAsync(m.ctx, names); err != nil {
		return fmt.Errorf("manage wildcard certificates: %w", err)
	}
	return nil
}

func orInt(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

func orDur(v, def time.Duration) time.Duration {
	if v == 0 {
		return def
	}
	return v
}

// Certificates lists the certificates held in memory, soonest expiry first.
func (m *Manager) Certificates() []CertInfo {
	if m.mode == ModeOff {
		return nil
	}
	m.mu.Lock()
	sets := make([][]string, 0, len(m.known))
	for _, names := range m.known {
		sets = append(sets, names)
	}
	m.mu.Unlock()
	var out []CertInfo
	for _, names := range sets {
		found := false
		for _, c := range m.cache.AllMatchingCertificates(names[0]) {
			if !slices.Equal(c.Names, names) || c.Leaf == nil {
				continue
			}
			out = append(out, CertInfo{Names: slices.Clone(c.Names), Issuer: c.Leaf.Issuer.CommonName, NotAfter: c.Leaf.NotAfter})
			found = true
			break
		}
		if !found {
			// Evicted from certmagic's cache (expired, or replaced).
			m.mu.Lock()
			delete(m.known, strings.Join(names, ","))
			m.mu.Unlock()
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].NotAfter.Before(out[j].NotAfter) })
	return out
}

// FailedValidations lists the names with failed validations at the CA in
// the last hour, as this edge last counted them (every edge's, through the
// certificate storage), most first; Let's Encrypt's limit is
// FailedValidationLimit.
func (m *Manager) FailedValidations() []ValidationCount {
	if m.validations == nil {
		return nil
	}
	return m.validations.counts()
}

// InternalRootPEM returns the internal CA's root certificate, for clients to
// trust; nil unless the mode is ModeInternal.
func (m *Manager) InternalRootPEM() []byte {
	if m.ca == nil {
		return nil
	}
	return slices.Clone(m.ca.rootPEM)
}

// Close ends background maintenance and issuance, and fails handshakes still
// waiting on an issuance. It may be called more than once.
func (m *Manager) Close() {
	if m.mode == ModeOff {
		return
	}
	m.closeOnce.Do(func() {
		if m.prefetch != nil {
			m.prefetch.Stop()
		}
		m.cancel()
		m.mu.Lock()
		for _, ps := range m.pending {
			for _, cancel := range ps {
				cancel()
			}
		}
		m.mu.Unlock()
		m.cache.Stop()
	})
}

// wantEvent limits certmagic's events to those onEvent handles, so it does
// not build a ClientHello copy for every handshake.
func wantEvent(event string) bool {
	switch event {
	case "cert_obtaining", "cert_obtained", "cert_failed", "cached_managed_cert":
		return true
	}
	return false
}
