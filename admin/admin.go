// Package admin serves the edge's admin listener: /healthz and /readyz to
// anyone; /metrics to loopback, the private networks (or the networks the
// operator allows) and a request bearing the ingress token; and the status
// surfaces (the HTML status page, status.json and pprof) that reveal upstream
// addresses, only to loopback clients or a request bearing the token
// (docs/design.md rule 10). It also lays out status.json as the text table of
// the routes command.
//
// status.json's field names are a contract with scripts: add fields, never
// rename them.
package admin

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/scafo/scafo-edge/admission"
	"github.com/scafo/scafo-edge/backhaul"
	"github.com/scafo/scafo-edge/certs"
	"github.com/scafo/scafo-edge/certs/prefetch"
	"github.com/scafo/scafo-edge/edge"
	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/node"
)

// Server is the admin listener's handler: health, readiness, metrics, and
// the surfaces that reveal upstream addresses (only to loopback clients or
// to a request bearing the ingress token, docs/design.md rule 10). Live, Source
// and Registry are required; the other fields may be zero.
type Server struct {
	Live     *edge.Live
	Source   node.Source
	Registry *prometheus.Registry
	// Proxy reports upstream health; nil: every upstream is "untried".
	Proxy *backhaul.Proxy
	// Token is the ingress token that opens /metrics and the private
	// surfaces to any client; empty: no token opens them.
	Token string
	// MetricsFrom lists the networks whose clients may read /metrics
	// without the token, besides loopback (ParseAllow reads the
	// --admin-allow list); empty: loopback only.
	MetricsFrom []netip.Prefix
	// TrustedProxies are the proxies whose X-Forwarded-For the edge
	// believes (--trusted-proxies): a request one relays is judged by the
	// client it names, one it sends for itself may read /metrics. Empty:
	// every request is judged by its TCP peer.
	TrustedProxies []netip.Prefix
	// Certificates lists the managed certificates; nil: TLS is off or not
	// managed by this edge, and the page says so.
	Certificates func() []certs.CertInfo
	// NotRenewed reports whether nothing renews the certificate for names
	// (a wildcard imported without DNS-01): the page says it lapses. Nil:
	// every certificate is renewed.
	NotRenewed func(names []string) bool
	// Prefetch lists the names waiting for a prefetched certificate (and
	// those not reaching the fleet); nil: prefetch is off.
	Prefetch func() []prefetch.Entry
	// FailedValidations lists the names with failed validations at the
	// ACME CA in the last hour; nil: not shown (no ACME).
	FailedValidations func() []certs.ValidationCount
	// Admission reports the connection budget, the pressure state and each
	// application's share in use; nil: not shown.
	Admission func() admission.Status
	// Version is the build's version, reported in status.json.
	Version string
	// Started is when the process started, shown as uptime on the status
	// page; zero: not shown.
	Started time.Time
	// Clock is the clock of the status surfaces; nil: the wall clock.
	Clock clock.Clock
}

// Handler returns the admin listener's routes: /healthz and /readyz open to
// any client, /metrics to loopback, MetricsFrom, trusted proxies and the
// token, the status page, status.json and pprof only to a privileged one
// (access.go).
func (a *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.Handle("GET /metrics", a.scrapers(promhttp.HandlerFor(a.Registry, promhttp.HandlerOpts{Registry: a.Registry})))
	a.registerStatus(mux)
	return mux
}

// readyz answers 200 once a document is loaded. To a privileged client
// (loopback, or the ingress token) the body says whether the table is stale
// (loaded from the state file, source not yet confirmed) and how the source
// fares, so an operator sees it without the logs; to anyone else only
// "ready" or "not ready": the source's URL names the node and the user its
// token belongs to, and an error's text can name internal addresses.
func (a *Server) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	t := a.Live.Load()
	if !a.privileged(r) {
		if t == nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready")
			return
		}
		fmt.Fprintln(w, "ready")
		return
	}
	st := a.Source.Status()
	if t == nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: no routing document yet\nsource: %s\n", st.Source)
		if st.LastError != "" {
			fmt.Fprintf(w, "last error: %s\n", st.LastError)
		}
		return
	}
	state := "fresh"
	if st.Stale {
		state = "stale (persisted document; source not confirmed since start-up)"
	}
	fmt.Fprintf(w, "ready: %s\nfingerprint: %s\nsource: %s\n", state, t.Fingerprint(), st.Source)
	if !st.LastSuccess.IsZero() {
		fmt.Fprintf(w, "last good poll: %s ago\n", time.Since(st.LastSuccess).Round(time.Second))
	}
	if st.LastError != "" {
		fmt.Fprintf(w, "last error: %s (%d consecutive failures)\n", st.LastError, st.ConsecutiveFailures)
	}
}

// registerStatus adds the status page, status.json and pprof to mux, all
// behind private.
func (a *Server) registerStatus(mux *http.ServeMux) {
	mux.Handle("GET /{$}", a.private(http.HandlerFunc(a.statusPage)))
	mux.Handle("GET /status.json", a.private(http.HandlerFunc(a.statusJSON)))

	// Registered here by hand: importing net/http/pprof also adds these to
	// http.DefaultServeMux, but no listener of the edge serves that mux
	// (every http.Server has its own Handler), so only this one answers.
	mux.Handle("GET /debug/pprof/", a.private(http.HandlerFunc(pprof.Index)))
	mux.Handle("GET /debug/pprof/cmdline", a.private(http.HandlerFunc(cmdline)))
	mux.Handle("GET /debug/pprof/profile", a.private(http.HandlerFunc(pprof.Profile)))
	mux.Handle("GET /debug/pprof/symbol", a.private(http.HandlerFunc(pprof.Symbol)))
	mux.Handle("POST /debug/pprof/symbol", a.private(http.HandlerFunc(pprof.Symbol)))
	mux.Handle("GET /debug/pprof/trace", a.private(http.HandlerFunc(pprof.Trace)))
}

// cmdline is pprof.Cmdline with the values of secret flags replaced: a
// token passed as a flag is in the process's arguments, and the page goes
// to anyone holding the token or on loopback, a proxy on the box included.
func cmdline(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprint(w, strings.Join(redactArgs(os.Args), "\x00"))
}

// secretFlags are the flags whose values redactArgs hides.
var secretFlags = []string{"ingress-token"}

// redactArgs returns args with the value of every secret flag replaced by
// "REDACTED", in each of the spellings the flag package reads: -name value,
// --name value, -name=value and --name=value.
func redactArgs(args []string) []string {
	out := slices.Clone(args)
	for i := 0; i < len(out); i++ {
		name, value, hasValue := strings.Cut(strings.TrimLeft(out[i], "-"), "=")
		if !strings.HasPrefix(out[i], "-") || !slices.Contains(secretFlags, name) {
			continue
		}
		if hasValue {
			out[i] = out[i][:len(out[i])-len(value)] + "REDACTED"
		} else if i+1 < len(out) {
			out[i+1] = "REDACTED"
			i++
		}
	}
	return out
}
