package admin

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/scafo/scafo-edge/admission"
	"github.com/scafo/scafo-edge/backhaul"
	"github.com/scafo/scafo-edge/certs"
	"github.com/scafo/scafo-edge/node"
)

// Upstream health words, shared by the page, status.json and the routes
// command. Health is passive (backhaul sees connect failures), so an upstream
// no request has used yet is "untried", not "ok".
const (
	healthOK      = "ok"
	healthFailing = "failing" // connect failures, ejection over: next request retries it first
	healthEjected = "ejected" // skipped until ejected_until unless nothing else is left
	healthUntried = "untried"
)

// Status is everything the status page shows, and the body of
// /status.json, which the routes command reads. Field names are the JSON
// contract with scripts: add fields, never rename them.
type Status struct {
	Version     string            `json:"version"`
	GeneratedAt time.Time         `json:"generated_at"`
	Started     *time.Time        `json:"started,omitempty"`
	Document    *DocumentStatus   `json:"document"` // null before the first document
	Poll        PollStatus        `json:"poll"`
	Routes      []RouteStatus     `json:"routes"`
	API         *APIStatus        `json:"api,omitempty"`
	Upstreams   []UpstreamStatus  `json:"upstream_health"` // every upstream backhaul has seen, by address
	Certs       []CertStatus      `json:"certificates"`
	CertsNote   string            `json:"certificates_note,omitempty"`
	Prefetch    []PrefetchStatus  `json:"certificate_prefetch,omitempty"` // names waiting; absent when prefetch is off or none wait
	Load        *admission.Status `json:"load,omitempty"`                 // the connection budget, pressure and fair shares in use
	pathLimit   int               // page only: prefixes listed per host
	routeIndex  map[string]bool   // page only: hosts that are routes, for links

	// FailedValidations are the names the ACME CA failed to validate in
	// the last hour; absent when none.
	FailedValidations []ValidationStatus `json:"failed_validations,omitempty"`

	// Operator is the operator routes file (--operator-routes); absent
	// without one.
	Operator *OperatorStatus `json:"operator,omitempty"`
}

// OperatorStatus is the operator routes file: whether the file on disk is
// the one served, and the hosts its routes took from the node's document.
type OperatorStatus struct {
	File        string     `json:"file"`
	Valid       bool       `json:"valid"`                // false while a broken edit is kept out
	LastError   string     `json:"last_error,omitempty"` // why the file on disk is not served
	Fingerprint string     `json:"fingerprint"`          // of the file served
	LastChange  *time.Time `json:"last_change,omitempty"`
	Routes      int        `json:"routes"`
	// Conflicts are the hosts both documents name: the operator's route
	// serves each.
	Conflicts []ConflictStatus `json:"conflicts"`
}

// ConflictStatus is one host both the node's document and the operator
// file name.
type ConflictStatus struct {
	Host                string `json:"host"`
	NodeApplication     string `json:"node_application"`
	OperatorApplication string `json:"operator_application"`
}

// DocumentStatus is the live routing document: where it came from, how old
// it is and what it holds.
type DocumentStatus struct {
	Fingerprint string    `json:"fingerprint"`
	FetchedAt   time.Time `json:"fetched_at"`
	AgeSeconds  float64   `json:"age_seconds"`
	Stale       bool      `json:"stale"`
	Routes      int       `json:"routes"`
	// PathPrefixes counts the path prefixes of the whole document: the sum
	// of every route's PathCount, the scafo_edge_path_prefixes gauge. The
	// two keys count one thing at two levels under two spellings; the
	// contract (contract_test.go) keeps both names as they shipped.
	PathPrefixes int `json:"path_prefixes"`
	APIHosts     int `json:"api_hosts"`
}

// PollStatus is how the routing source fares.
type PollStatus struct {
	Source              string     `json:"source"`
	LastAttempt         *time.Time `json:"last_attempt,omitempty"`
	LastSuccess         *time.Time `json:"last_success,omitempty"`
	LastChange          *time.Time `json:"last_change,omitempty"`
	LastError           string     `json:"last_error,omitempty"`
	ConsecutiveFailures int        `json:"consecutive_failures"`
	Stale               bool       `json:"stale"`
}

// RouteStatus is one route of the document, with its path prefixes.
type RouteStatus struct {
	Host        string           `json:"host"`
	Application string           `json:"application"`
	Wildcard    bool             `json:"wildcard"`
	Upstreams   []UpstreamStatus `json:"upstreams"` // priority order
	// PathCount counts this route's path prefixes, len(Paths) in the JSON
	// (the page lists only the first few); DocumentStatus.PathPrefixes is
	// its sum over the routes.
	PathCount int          `json:"path_count"`
	Paths     []PathStatus `json:"paths,omitempty"` // sorted by prefix
	// Source is where the route came from: "node" (the routing document)
	// or "operator" (the operator routes file).
	Source string `json:"source"`
	// Features are what the operator file adds to the route (a redirect,
	// an allow list, basic auth, header rules); absent for none.
	Features []string `json:"features,omitempty"`
}

// Route sources, the values of RouteStatus.Source.
const (
	sourceNode     = "node"
	sourceOperator = "operator"
)

// PathStatus is one path prefix and the route it selects.
type PathStatus struct {
	Prefix      string `json:"prefix"` // bare first segment, as in the document
	Target      string `json:"target"`
	Application string `json:"application"`
}

// UpstreamStatus is one upstream and the health backhaul has seen.
type UpstreamStatus struct {
	Node         string     `json:"node"`
	Address      string     `json:"address"`
	Health       string     `json:"health"`
	Failures     int        `json:"consecutive_failures"`
	EjectedUntil *time.Time `json:"ejected_until,omitempty"`
}

// APIStatus is the API apex: its hosts, upstreams and denied prefixes.
type APIStatus struct {
	Hosts     []string         `json:"hosts"`
	Upstreams []UpstreamStatus `json:"upstreams"`
	Denied    []string         `json:"denied"`
}

// CertStatus is one managed certificate.
type CertStatus struct {
	Names     []string  `json:"names"`
	Issuer    string    `json:"issuer"`
	NotAfter  time.Time `json:"not_after"`
	ExpiresIn string    `json:"expires_in"` // rounded, for humans
	Expiring  bool      `json:"expiring"`   // within certExpiryWarning
	// NotRenewed: nothing renews it (a wildcard imported, with no
	// --dns-provider or its route key gone from the document); it lapses
	// at NotAfter.
	NotRenewed bool `json:"not_renewed,omitempty"`
}

// PrefetchStatus is one name waiting for a prefetched certificate.
type PrefetchStatus struct {
	Name string `json:"name"`
	// State is waiting, working, budget, unreachable (the name does not
	// reach this fleet yet at one of its addresses), no_ipv6 (it has an
	// AAAA record this box cannot check without IPv6), failed or elsewhere
	// (another edge works on it).
	State    string    `json:"state"`
	Added    time.Time `json:"added"`
	NextTry  time.Time `json:"next_try"`
	Failures int       `json:"failures"`
	Error    string    `json:"error,omitempty"`
}

// ValidationStatus is one name's failed validations at the ACME CA in the
// last hour. Let's Encrypt refuses a name for the rest of the hour after
// Limit; the edge starts no issuance that could reach it.
type ValidationStatus struct {
	Name      string     `json:"name"`
	LastHour  int        `json:"last_hour"`
	Limit     int        `json:"ca_limit"`
	HeldUntil *time.Time `json:"held_until,omitempty"` // no issuance of the name before then
}

// certExpiryWarning is when the page flags a certificate: the same 14 days
// as the ScafoEdgeCertificateExpiring alert in deploy/prometheus/alerts.yaml.
const certExpiryWarning = 14 * 24 * time.Hour

func (a *Server) clock() time.Time {
	if a.Clock != nil {
		return a.Clock.Now()
	}
	return time.Now()
}

// snapshot gathers the status view. It reads the live table once, so the page
// describes one document even if a swap lands meanwhile.
func (a *Server) snapshot() *Status {
	now := a.clock()
	v := &Status{Version: a.Version, GeneratedAt: now.UTC(), Routes: []RouteStatus{}, Certs: []CertStatus{}, Upstreams: []UpstreamStatus{}}
	if !a.Started.IsZero() {
		s := a.Started.UTC()
		v.Started = &s
	}
	if a.Source != nil {
		st := a.Source.Status()
		v.Poll = PollStatus{
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
	if a.Proxy != nil {
		for _, h := range a.Proxy.Health() {
			u := node.Upstream{Node: h.Node, Address: h.Address}
			health[u] = h
			v.Upstreams = append(v.Upstreams, upstreamFrom(u, health, now))
		}
	}
	ups := func(list []node.Upstream) []UpstreamStatus {
		out := make([]UpstreamStatus, 0, len(list))
		for _, u := range list {
			out = append(out, upstreamFrom(u, health, now))
		}
		return out
	}

	t := a.Live.Load()
	if t != nil {
		v.Document = &DocumentStatus{
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
			rv := RouteStatus{Host: r.Host, Application: r.Application, Wildcard: r.Wildcard(), Upstreams: ups(r.Upstreams), Source: sourceNode}
			if r.Operator {
				rv.Source, rv.Features = sourceOperator, r.Features()
			}
			for _, p := range r.Paths() {
				rv.Paths = append(rv.Paths, PathStatus{Prefix: p.Prefix, Target: p.Target.Host, Application: p.Target.Application})
			}
			rv.PathCount = len(rv.Paths)
			v.Routes = append(v.Routes, rv)
		}
		if api := t.APIRoute(); api != nil {
			v.API = &APIStatus{Hosts: t.APIHosts(), Upstreams: ups(api.Upstreams), Denied: t.Denied()}
		}
	}
	if a.Source != nil {
		if o := a.Source.Status().Operator; o != nil {
			v.Operator = &OperatorStatus{File: o.File, Valid: o.Valid, LastError: o.LastError, Fingerprint: o.Fingerprint,
				LastChange: optTime(o.LastChange), Routes: o.Routes, Conflicts: []ConflictStatus{}}
			if t != nil {
				for _, c := range t.Conflicts() {
					v.Operator.Conflicts = append(v.Operator.Conflicts, ConflictStatus{Host: c.Host, NodeApplication: c.NodeApplication, OperatorApplication: c.OperatorApplication})
				}
			}
		}
	}

	if a.Certificates == nil {
		v.CertsNote = "none: TLS is off or certificates are not managed by this edge"
	} else {
		for _, c := range a.Certificates() {
			left := c.NotAfter.Sub(now)
			cv := CertStatus{
				Names: c.Names, Issuer: c.Issuer, NotAfter: c.NotAfter.UTC(),
				ExpiresIn: roundDuration(left), Expiring: left < certExpiryWarning,
				NotRenewed: a.NotRenewed != nil && a.NotRenewed(c.Names),
			}
			v.Certs = append(v.Certs, cv)
		}
		if len(v.Certs) == 0 {
			v.CertsNote = "none yet: certificates are obtained on the first handshake for a name the document allows"
		}
	}
	if a.Admission != nil {
		l := a.Admission()
		slices.SortFunc(l.Apps, func(x, y admission.AppLoad) int { return strings.Compare(x.Application, y.Application) })
		v.Load = &l
	}
	if a.FailedValidations != nil {
		for _, vc := range a.FailedValidations() {
			vs := ValidationStatus{Name: vc.Name, LastHour: vc.Failed, Limit: certs.FailedValidationLimit}
			if !vc.HeldUntil.IsZero() {
				until := vc.HeldUntil.UTC()
				vs.HeldUntil = &until
			}
			v.FailedValidations = append(v.FailedValidations, vs)
		}
	}
	if a.Prefetch != nil {
		for _, e := range a.Prefetch() {
			v.Prefetch = append(v.Prefetch, PrefetchStatus{
				Name: e.Name, State: string(e.State), Added: e.Added.UTC(), NextTry: e.Next.UTC(), Failures: e.Failures, Error: e.Error,
			})
		}
	}
	return v
}

func upstreamFrom(u node.Upstream, health map[node.Upstream]backhaul.UpstreamHealth, now time.Time) UpstreamStatus {
	uv := UpstreamStatus{Node: u.Node, Address: u.Address, Health: healthUntried}
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

func (a *Server) statusJSON(w http.ResponseWriter, r *http.Request) {
	v := a.snapshot()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
