package main

import (
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/scafo/scafo-edge/backhaul"
	"github.com/scafo/scafo-edge/edge"
	"github.com/scafo/scafo-edge/node"
)

// adminServer serves the admin listener: health, readiness, metrics, and
// the surfaces that reveal upstream addresses (only to loopback clients or
// to a request bearing the ingress token, DESIGN.md rule 10).
type adminServer struct {
	live   *edge.Live
	source node.Source
	reg    *prometheus.Registry
	proxy  *backhaul.Proxy
	token  string
	certs  func() []certSummary
	// started is when the process started, shown as uptime on the status
	// page; zero: not shown.
	started time.Time
	// now is the clock of the status surfaces; nil: time.Now.
	now func() time.Time
}

func (a *adminServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg}))
	a.registerStatus(mux)
	return mux
}

// readyz answers 200 once a document is loaded. The body says whether the
// table is stale (loaded from the state file, source not yet confirmed) and
// how the source fares, so an operator sees it without the logs.
func (a *adminServer) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	t := a.live.Load()
	st := a.source.Status()
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

// privileged reports whether r may see upstream addresses: it comes from
// loopback, or it carries the ingress token.
func (a *adminServer) privileged(r *http.Request) bool {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
			return true
		}
	}
	if a.token == "" {
		return false
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(a.token)) == 1
}
