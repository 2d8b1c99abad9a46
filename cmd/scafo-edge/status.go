package main

import (
	_ "embed"
	"encoding/json"
	"html/template"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/scafo/scafo-edge/backhaul"
	"github.com/scafo/scafo-edge/edge"
	"github.com/scafo/scafo-edge/node"
)

// pagePathLimit is how many path prefixes the status page lists under one
// host before it summarises the rest: a host may carry 10,000 of them, and
// the page must stay usable. "?paths=N" asks for more (status.json and the
// routes command always carry them all).
const pagePathLimit = 50

// Upstream health words, shared by the page, status.json and the routes
// command. Health is passive (backhaul sees connect failures), so an upstream
// no request has used yet is "untried", not "ok".
const (
	healthOK      = "ok"
	healthFailing = "failing" // connect failures, ejection over: next request retries it first
	healthEjected = "ejected" // skipped until ejected_until unless nothing else is left
	healthUntried = "untried"
)

// statusView is everything the status page shows, and the body of
// /status.json, which the routes command reads. Field names are the JSON
// contract with scripts: add fields, never rename them.
type statusView struct {
	Version     string          `json:"version"`
	GeneratedAt time.Time       `json:"generated_at"`
	Started     *time.Time      `json:"started,omitempty"`
	Document    *documentView   `json:"document"` // null before the first document
	Poll        pollView        `json:"poll"`
	Routes      []routeView     `json:"routes"`
	API         *apiView        `json:"api,omitempty"`
	Upstreams   []upstreamView  `json:"upstream_health"` // every upstream backhaul has seen, by address
	Certs       []certView      `json:"certificates"`
	CertsNote   string          `json:"certificates_note,omitempty"`
	pathLimit   int             // page only: prefixes listed per host
	routeIndex  map[string]bool // page only: hosts that are routes, for links
}

type documentView struct {
	Fingerprint  string    `json:"fingerprint"`
	FetchedAt    time.Time `json:"fetched_at"`
	AgeSeconds   float64   `json:"age_seconds"`
	Stale        bool      `json:"stale"`
	Routes       int       `json:"routes"`
	PathPrefixes int       `json:"path_prefixes"`
	APIHosts     int       `json:"api_hosts"`
}

type pollView struct {
	Source              string     `json:"source"`
	LastAttempt         *time.Time `json:"last_attempt,omitempty"`
	LastSuccess         *time.Time `json:"last_success,omitempty"`
	LastChange          *time.Time `json:"last_change,omitempty"`
	LastError           string     `json:"last_error,omitempty"`
	ConsecutiveFailures int        `json:"consecutive_failures"`
	Stale               bool       `json:"stale"`
}

type routeView struct {
	Host        string         `json:"host"`
	Application string         `json:"application"`
	Wildcard    bool           `json:"wildcard"`
	Upstreams   []upstreamView `json:"upstreams"` // priority order
	PathCount   int            `json:"path_count"`
	Paths       []pathView     `json:"paths,omitempty"` // sorted by prefix
}

type pathView struct {
	Prefix      string `json:"prefix"` // bare first segment, as in the document
	Target      string `json:"target"`
	Application string `json:"application"`
}

type upstreamView struct {
	Node         string     `json:"node"`
	Address      string     `json:"address"`
	Health       string     `json:"health"`
	Failures     int        `json:"consecutive_failures"`
	EjectedUntil *time.Time `json:"ejected_until,omitempty"`
}

type apiView struct {
	Hosts     []string       `json:"hosts"`
	Upstreams []upstreamView `json:"upstreams"`
	Denied    []string       `json:"denied"`
}

type certView struct {
	Names     []string  `json:"names"`
	Issuer    string    `json:"issuer"`
	NotAfter  time.Time `json:"not_after"`
	ExpiresIn string    `json:"expires_in"` // rounded, for humans
	Expiring  bool      `json:"expiring"`   // within certExpiryWarning
}

// certExpiryWarning is when the page flags a certificate: the same 14 days
// as the ScafoEdgeCertificateExpiring alert in deploy/prometheus/alerts.yaml.
const certExpiryWarning = 14 * 24 * time.Hour

func (a *adminServer) clock() time.Time {
	if a.now != nil {
		return a.now()
	}
	return time.Now()
}

// snapshot gathers the status view. It reads the live table once, so the page
// describes one document even if a swap lands meanwhile.
func (a *adminServer) snapshot() *statusView {
	now := a.clock()
	v := &statusView{Version: version, GeneratedAt: now.UTC(), Routes: []routeView{}, Certs: []certView{}, Upstreams: []upstreamView{}}
	if !a.started.IsZero() {
		s := a.started.UTC()
		v.Started = &s
	}
	if a.source != nil {
		st := a.source.Status()
		v.Poll = pollView{
			Source:              st.Source,
			LastAttempt:         optTime(st.LastAttempt),
			LastSuccess:         optTime(st.LastSuccess),
			LastChange:          optTime(st.LastChange),
			LastError:           st.LastError,
			ConsecutiveFailures: st.ConsecutiveFailures,
			Stale:               st.Stale,
		}
	}

	health := map[node.Upstream]backhaul.UpstreamHealth{}
	if a.proxy != nil {
		for _, h := range a.proxy.Health() {
			u := node.Upstream{Node: h.Node, Address: h.Address}
			health[u] = h
			v.Upstreams = append(v.Upstreams, upstreamFrom(u, health, now))
		}
	}
	ups := func(list []node.Upstream) []upstreamView {
		out := make([]upstreamView, 0, len(list))
		for _, u := range list {
			out = append(out, upstreamFrom(u, health, now))
		}
		return out
	}

	if t := a.live.Load(); t != nil {
		v.Document = &documentView{
			Fingerprint: t.Fingerprint(),
			FetchedAt:   t.FetchedAt().UTC(),
			AgeSeconds:  now.Sub(t.FetchedAt()).Seconds(),
			// The source knows whether it confirmed the document since
			// start-up; the table only knows where it was built from.
			Stale:        v.Poll.Stale,
			Routes:       len(t.Routes()),
			PathPrefixes: t.PrefixCount(),
			APIHosts:     len(t.APIHosts()),
		}
		for _, r := range t.Routes() {
			rv := routeView{Host: r.Host, Application: r.Application, Wildcard: r.Wildcard(), Upstreams: ups(r.Upstreams)}
			for _, p := range r.Paths() {
				rv.Paths = append(rv.Paths, pathView{Prefix: p.Prefix, Target: p.Target.Host, Application: p.Target.Application})
			}
			rv.PathCount = len(rv.Paths)
			v.Routes = append(v.Routes, rv)
		}
		if api := t.APIRoute(); api != nil {
			v.API = &apiView{Hosts: t.APIHosts(), Upstreams: ups(api.Upstreams), Denied: t.Denied()}
		}
	}

	if a.certs == nil {
		v.CertsNote = "none: TLS is off or certificates are not managed by this edge"
	} else {
		for _, c := range a.certs() {
			left := c.NotAfter.Sub(now)
			cv := certView{
				Names: c.Names, Issuer: c.Issuer, NotAfter: c.NotAfter.UTC(),
				ExpiresIn: roundDuration(left), Expiring: left < certExpiryWarning,
			}
			v.Certs = append(v.Certs, cv)
		}
		if len(v.Certs) == 0 {
			v.CertsNote = "none yet: certificates are obtained on the first handshake for a name the document allows"
		}
	}
	return v
}

func upstreamFrom(u node.Upstream, health map[node.Upstream]backhaul.UpstreamHealth, now time.Time) upstreamView {
	uv := upstreamView{Node: u.Node, Address: u.Address, Health: healthUntried}
	h, seen := health[u]
	if !seen {
		return uv
	}
	uv.Failures = h.Failures
	switch {
	case h.EjectedUntil.After(now):
		uv.Health = healthEjected
		until := h.EjectedUntil.UTC()
		uv.EjectedUntil = &until
	case h.Failures > 0:
		uv.Health = healthFailing
	default:
		uv.Health = healthOK
	}
	return uv
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// roundDuration renders d for a human: "3d4h", "5h12m", "42s". Negative
// durations (an expired certificate) keep their sign.
func roundDuration(d time.Duration) string {
	sign := ""
	if d < 0 {
		sign, d = "-", -d
	}
	switch {
	case d >= 48*time.Hour:
		days := d / (24 * time.Hour)
		return sign + strconv.Itoa(int(days)) + "d" + strconv.Itoa(int((d-days*24*time.Hour)/time.Hour)) + "h"
	case d >= time.Hour:
		return sign + d.Truncate(time.Minute).String()
	case d >= time.Second:
		return sign + d.Round(time.Second).String()
	}
	return sign + d.Round(time.Millisecond).String()
}

// private serves h only to a privileged request (loopback, or the ingress
// token): the status surfaces and pprof reveal upstream addresses and
// internals (DESIGN.md rule 10).
func (a *adminServer) private(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.privileged(r) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusForbidden)
			w.Write([]byte("scafo-edge: forbidden: this page reveals upstream addresses; ask from loopback or send Authorization: Bearer <ingress token>\n"))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// registerStatus adds the status page, status.json and pprof to mux, all
// behind private.
func (a *adminServer) registerStatus(mux *http.ServeMux) {
	mux.Handle("GET /{$}", a.private(http.HandlerFunc(a.statusPage)))
	mux.Handle("GET /status.json", a.private(http.HandlerFunc(a.statusJSON)))

	// Registered here by hand: importing net/http/pprof also adds these to
	// http.DefaultServeMux, but no listener of the edge serves that mux
	// (every http.Server has its own Handler), so only this one answers.
	mux.Handle("GET /debug/pprof/", a.private(http.HandlerFunc(pprof.Index)))
	mux.Handle("GET /debug/pprof/cmdline", a.private(http.HandlerFunc(pprof.Cmdline)))
	mux.Handle("GET /debug/pprof/profile", a.private(http.HandlerFunc(pprof.Profile)))
	mux.Handle("GET /debug/pprof/symbol", a.private(http.HandlerFunc(pprof.Symbol)))
	mux.Handle("POST /debug/pprof/symbol", a.private(http.HandlerFunc(pprof.Symbol)))
	mux.Handle("GET /debug/pprof/trace", a.private(http.HandlerFunc(pprof.Trace)))
}

func (a *adminServer) statusJSON(w http.ResponseWriter, r *http.Request) {
	v := a.snapshot()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

//go:embed status.html
var statusHTML string

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"ago":   agoText,
	"since": func(now time.Time, t *time.Time) string { return roundDuration(now.Sub(*t)) },
	"secs":  secondsText,
	"upto": func(n int, ps []pathView) []pathView {
		if len(ps) > n {
			return ps[:n]
		}
		return ps
	},
	"sub":    func(a, b int) int { return a - b },
	"plural": plural,
	"short":  shortFingerprint,
	"ts": func(t any) string {
		switch t := t.(type) {
		case time.Time:
			return t.UTC().Format("2006-01-02 15:04:05Z")
		case *time.Time:
			if t != nil {
				return t.UTC().Format("2006-01-02 15:04:05Z")
			}
		}
		return "never"
	},
}).Parse(statusHTML))

// agoText is how long before now t was, for a human; nil is "never".
func agoText(now time.Time, t *time.Time) string {
	if t == nil {
		return "never"
	}
	return roundDuration(now.Sub(*t)) + " ago"
}

// secondsText renders a JSON seconds figure as roundDuration does.
func secondsText(s float64) string { return roundDuration(time.Duration(s * float64(time.Second))) }

func shortFingerprint(fp string) string {
	if len(fp) > 12 {
		return fp[:12]
	}
	return fp
}

func (a *adminServer) statusPage(w http.ResponseWriter, r *http.Request) {
	v := a.snapshot()
	v.pathLimit = pagePathLimit
	if s := r.URL.Query().Get("paths"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n >= 0 {
			v.pathLimit = min(n, edge.MaxPathsPerRoute)
		}
	}
	v.routeIndex = make(map[string]bool, len(v.Routes))
	for _, rt := range v.Routes {
		v.routeIndex[rt.Host] = true
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	// No scripts, no external assets: inline styles only.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'")
	if err := statusTemplate.Execute(w, pageData{statusView: v}); err != nil {
		// Headers are gone; the truncated page shows the failure.
		w.Write([]byte("\n<p>scafo-edge: rendering the status page failed: " + template.HTMLEscapeString(err.Error()) + "</p>"))
	}
}

// pageData gives the template the page-only fields.
type pageData struct{ *statusView }

func (p pageData) PathLimit() int           { return p.pathLimit }
func (p pageData) IsRoute(host string) bool { return p.routeIndex[host] }
