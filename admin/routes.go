package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// terminalWidth is the width the routes table is laid out for.
const terminalWidth = 80

// RoutesOptions say which edge PrintRoutes asks and how it prints.
type RoutesOptions struct {
	// Admin is the edge's admin listener: a listen address (":9180",
	// asked on loopback) or a base URL ("http://edge-1:9180").
	Admin string
	// Token is sent as a bearer token; needed off loopback.
	Token string
	// JSON prints status.json as is, for scripts, instead of the table.
	JSON bool
	// MaxPaths lists at most this many path prefixes per host, then a
	// count; zero lists them all.
	MaxPaths int
	// Timeout bounds the request; zero: no bound beyond ctx.
	Timeout time.Duration
}

// PrintRoutes writes the routing table of a running edge, read from its
// admin listener's /status.json: hosts with their application and upstreams
// in priority order, path prefixes indented under their host, the API hosts
// and their denied prefixes, and the managed certificates.
func PrintRoutes(ctx context.Context, o RoutesOptions, w io.Writer) error {
	u, err := statusURL(o.Admin)
	if err != nil {
		return err
	}
	body, err := fetchStatus(ctx, u, o.Token, o.Timeout)
	if err != nil {
		return err
	}
	if o.JSON {
		_, err := w.Write(body)
		return err
	}
	var v Status
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("decode %s: %w", u, err)
	}
	var buf bytes.Buffer
	writeRoutes(&buf, &v, o.MaxPaths)
	_, err = w.Write(buf.Bytes())
	return err
}

// URL turns a listen address of the admin listener into a URL of path on
// loopback: ":9180" and "0.0.0.0:9180" are asked at 127.0.0.1:9180.
func URL(addr, path string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("admin address %q: %w", addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}

// statusURL accepts a listen address (":9180", probed on loopback) or a base
// URL, and returns the URL of status.json.
func statusURL(admin string) (string, error) {
	if strings.Contains(admin, "://") {
		return strings.TrimSuffix(admin, "/") + "/status.json", nil
	}
	return URL(admin, "/status.json")
}

func fetchStatus(ctx context.Context, u, token string, timeout time.Duration) ([]byte, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("status request: %w", err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", u, err)
	}
	defer resp.Body.Close()
	// A status document of 10,000 prefixes on several hosts is a few MB.
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", u, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return body, nil
	case http.StatusForbidden:
		return nil, fmt.Errorf("fetch %s: %s: off loopback the edge wants its ingress token (--token, SCAFO_INGRESS_TOKEN)", u, resp.Status)
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
	return nil, fmt.Errorf("fetch %s: %s: %s", u, resp.Status, first)
}

// writeRoutes lays v out for a terminal of terminalWidth columns.
func writeRoutes(w io.Writer, v *Status, maxPaths int) {
	kv := func(k, val string) { fmt.Fprintf(w, "%-11s %s\n", k, val) }

	if d := v.Document; d != nil {
		state := "fresh"
		if d.Stale {
			state = "STALE (from the state file, not confirmed by the source)"
		}
		kv("document", shortFingerprint(d.Fingerprint)+"  "+state)
		kv("fetched", d.FetchedAt.Format(time.RFC3339)+" ("+secondsText(d.AgeSeconds)+" ago)")
		kv("contents", fmt.Sprintf("%s, %s, %s", plural(d.Routes, "route"), plural(d.PathPrefixes, "path prefix"), plural(d.APIHosts, "API host")))
	} else {
		kv("document", "NONE: every request is answered 503")
	}
	kv("source", v.Poll.Source)
	kv("last poll", fmt.Sprintf("success %s, %s", agoText(v.GeneratedAt, v.Poll.LastSuccess), plural(v.Poll.ConsecutiveFailures, "consecutive failure")))
	if v.Poll.LastError != "" {
		kv("last error", v.Poll.LastError)
	}
	if o := v.Operator; o != nil {
		state := "valid"
		if !o.Valid {
			state = "REFUSED on disk, the last good file is served"
		}
		kv("operator", fmt.Sprintf("%s  %s, %s, %s", o.File, state, plural(o.Routes, "route"), plural(len(o.Conflicts), "conflict")))
		if o.LastError != "" {
			kv("  error", o.LastError)
		}
		for _, c := range o.Conflicts {
			kv("  conflict", fmt.Sprintf("%s: operator's %s serves it, not the node's %s", c.Host, c.OperatorApplication, c.NodeApplication))
		}
	}

	t := &textTable{caps: []int{24, 14, 26, 10}}
	t.row("HOST", "APPLICATION", "UPSTREAMS", "HEALTH")
	for _, r := range v.Routes {
		upstreamRows(t, []string{r.Host}, r.Application, r.Upstreams)
		if r.Source == sourceOperator {
			t.row("  (operator file)", "", strings.Join(r.Features, ", "), "")
		}
		n := len(r.Paths)
		if maxPaths > 0 {
			n = min(n, maxPaths)
		}
		for _, p := range r.Paths[:n] {
			t.row("  /"+p.Prefix, p.Application, "-> "+p.Target, "")
		}
		if more := r.PathCount - n; more > 0 {
			t.row(fmt.Sprintf("  ... %s (--max-paths 0 lists all)", plural(more, "more prefix")), "", "", "")
		}
	}

	if api := v.API; api != nil {
		t.row()
		t.row("API HOST", "", "UPSTREAMS", "HEALTH")
		upstreamRows(t, api.Hosts, "(api apex)", api.Upstreams)
		for _, d := range api.Denied {
			t.row("  denied "+d, "", "", "")
		}
	}
	fmt.Fprintln(w)
	t.write(w)

	fmt.Fprintln(w)
	if len(v.Certs) == 0 {
		kv("certificates", v.CertsNote)
		return
	}
	ct := &textTable{caps: []int{34, 20, 10, 10}}
	ct.row("CERTIFICATE", "NOT AFTER", "EXPIRES", "ISSUER")
	for _, c := range v.Certs {
		exp := c.ExpiresIn
		if c.Expiring {
			exp += " !"
		}
		for i, name := range c.Names {
			if i == 0 {
				ct.row(name, c.NotAfter.Format(time.RFC3339), exp, c.Issuer)
			} else {
				ct.row(name, "", "", "")
			}
		}
	}
	ct.write(w)
}

// upstreamRows adds a host block: one line per host name or upstream, the
// upstreams numbered in priority order.
func upstreamRows(t *textTable, hosts []string, app string, ups []UpstreamStatus) {
	lines := max(len(hosts), len(ups), 1)
	for i := range lines {
		var host, a, up, health string
		if i < len(hosts) {
			host = hosts[i]
		}
		if i == 0 {
			a = app
		}
		if i < len(ups) {
			up = fmt.Sprintf("%d %s %s", i+1, ups[i].Node, ups[i].Address)
			health = ups[i].Health
		} else if i == 0 {
			up = "(none)"
		}
		t.row(host, a, up, health)
	}
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	if strings.HasSuffix(word, "x") {
		return fmt.Sprintf("%d %ses", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// textTable aligns cells in columns no wider than their caps. A cell longer
// than its column pushes the rest of its row to the next line instead of
// breaking the alignment, and a cell that would run past terminalWidth
// starts a line of its own at a small indent, so rows stay readable at 80
// columns whatever the host names.
type textTable struct {
	caps []int
	rows [][]string
}

func (t *textTable) row(cells ...string) { t.rows = append(t.rows, cells) }

func (t *textTable) write(w io.Writer) {
	const gap, hang = 2, 4
	widths := make([]int, len(t.caps))
	for _, r := range t.rows {
		for i, c := range r {
			widths[i] = max(widths[i], min(utf8.RuneCountInString(c), t.caps[i]))
		}
	}
	starts := make([]int, len(widths))
	for i := 1; i < len(widths); i++ {
		starts[i] = starts[i-1] + widths[i-1] + gap
	}
	for _, r := range t.rows {
		var line strings.Builder
		col := 0 // runes written on the current line
		flush := func() {
			fmt.Fprintln(w, strings.TrimRight(line.String(), " "))
			line.Reset()
			col = 0
		}
		for i, c := range r {
			if c == "" {
				continue
			}
			n := utf8.RuneCountInString(c)
			start := starts[i]
			if col > 0 && col > start-gap {
				flush() // the previous cell overran its column
			}
			if start+n > terminalWidth && start > hang {
				if col > 0 {
					flush()
				}
				start = hang
			}
			line.WriteString(strings.Repeat(" ", start-col))
			line.WriteString(c)
			col = start + n
		}
		flush()
	}
}
