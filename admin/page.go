package admin

import (
	_ "embed"
	"html/template"
	"net/http"
	"strconv"
	"time"

	"github.com/scafo/scafo-edge/edge"
)

// pagePathLimit is how many path prefixes the status page lists under one
// host before it summarises the rest: a host may carry 10,000 of them, and
// the page must stay usable. "?paths=N" asks for more (status.json and the
// routes command always carry them all).
const pagePathLimit = 50

//go:embed status.html
var statusHTML string

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"ago":   agoText,
	"since": func(now time.Time, t *time.Time) string { return roundDuration(now.Sub(*t)) },
	"secs":  secondsText,
	"upto": func(n int, ps []PathStatus) []PathStatus {
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

func (a *Server) statusPage(w http.ResponseWriter, r *http.Request) {
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
	if err := statusTemplate.Execute(w, pageData{Status: v}); err != nil {
		// Headers are gone; the truncated page shows the failure.
		w.Write([]byte("\n<p>scafo-edge: rendering the status page failed: " + template.HTMLEscapeString(err.Error()) + "</p>"))
	}
}

// pageData gives the template the page-only fields.
type pageData struct{ *Status }

func (p pageData) PathLimit() int           { return p.pathLimit }
func (p pageData) IsRoute(host string) bool { return p.routeIndex[host] }
