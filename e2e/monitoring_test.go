package e2e

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/admin"
	"github.com/scafo/scafo-edge/backhaul"
	"github.com/scafo/scafo-edge/edge"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

const (
	dashboardFile = "../deploy/grafana/scafo-edge.json"
	alertsFile    = "../deploy/prometheus/alerts.yaml"
	alertTestFile = "../deploy/prometheus/alerts_test.yaml"
)

// exportedFamilies is every scafo_edge_* metric family a running edge
// exports once it has served traffic and held a certificate: the README's
// Monitoring section lists the same. The test fails both ways, so a new
// metric gets documented and a renamed one does not leave the dashboard
// pointing at nothing.
var exportedFamilies = map[string]string{
	"scafo_edge_build_info":                       "gauge",
	"scafo_edge_requests_total":                   "counter",
	"scafo_edge_request_duration_seconds":         "histogram",
	"scafo_edge_request_bytes_total":              "counter",
	"scafo_edge_response_bytes_total":             "counter",
	"scafo_edge_requests_in_flight":               "gauge",
	"scafo_edge_self_answered_total":              "counter",
	"scafo_edge_tls_handshake_errors_total":       "counter",
	"scafo_edge_tls_tickets_presented_total":      "counter",
	"scafo_edge_request_failovers_total":          "counter",
	"scafo_edge_access_log_dropped_total":         "counter",
	"scafo_edge_upstream_connect_failures_total":  "counter",
	"scafo_edge_upstream_failovers_total":         "counter",
	"scafo_edge_upstreams_ejected":                "gauge",
	"scafo_edge_routing_polls_total":              "counter",
	"scafo_edge_routing_document_changes_total":   "counter",
	"scafo_edge_routing_document_info":            "gauge",
	"scafo_edge_routing_seconds_since_last_good":  "gauge",
	"scafo_edge_routing_stale":                    "gauge",
	"scafo_edge_routing_consecutive_failures":     "gauge",
	"scafo_edge_document_changes_total":           "counter",
	"scafo_edge_table_compile_seconds":            "histogram",
	"scafo_edge_routes":                           "gauge",
	"scafo_edge_path_prefixes":                    "gauge",
	"scafo_edge_dropped_entries":                  "gauge",
	"scafo_edge_dropped_entries_total":            "counter",
	"scafo_edge_tls_issuances_total":              "counter",
	"scafo_edge_tls_on_demand_refusals_total":     "counter",
	"scafo_edge_tls_issuances_in_flight":          "gauge",
	"scafo_edge_tls_handshake_certificates_total": "counter",
	"scafo_edge_tls_backoff_names":                "gauge",
	"scafo_edge_tls_certificate_expiry_seconds":   "gauge",
	"scafo_edge_tls_certificates":                 "gauge",
	"scafo_edge_handovers_total":                  "counter",
	"scafo_edge_conns":                            "gauge",
	"scafo_edge_conns_limit":                      "gauge",
	"scafo_edge_idle_conns":                       "gauge",
	"scafo_edge_memory_limit_bytes":               "gauge",
	"scafo_edge_pressure":                         "gauge",
	"scafo_edge_pressure_episodes_total":          "counter",
	"scafo_edge_accept_pauses_total":              "counter",
	"scafo_edge_paced_heads_total":                "counter",
	"scafo_edge_waiting_heads":                    "gauge",
	"scafo_edge_shed_total":                       "counter",
	"scafo_edge_app_in_flight":                    "gauge",
	"scafo_edge_app_queued":                       "gauge",
	"scafo_edge_client_addresses":                 "gauge",
}

// unobservedValues are label values the assets match on that this test's
// traffic does not produce (nothing fails to issue against the internal CA).
// Each is a value the exporting package documents.
var unobservedValues = map[string]bool{
	`scafo_edge_tls_issuances_total{result="failed"}`: true,
}

// selector is one metric reference in a PromQL expression.
type selector struct {
	name     string
	matchers [][3]string // label, op, value
	expr     string
}

var (
	metricRef = regexp.MustCompile(`\b((?:scafo_edge|go|process)_[a-zA-Z0-9_]+)\b(\{[^}]*\})?`)
	matcherRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
)

func parseSelectors(expr string) []selector {
	var out []selector
	for _, m := range metricRef.FindAllStringSubmatch(expr, -1) {
		s := selector{name: m[1], expr: expr}
		for _, mm := range matcherRE.FindAllStringSubmatch(m[2], -1) {
			s.matchers = append(s.matchers, [3]string{mm[1], mm[2], mm[3]})
		}
		out = append(out, s)
	}
	return out
}

// dashboardExprs returns every query of the dashboard: panel targets and
// template variable queries.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s is not JSON: %v", dashboardFile, err)
	}
	var exprs []string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				if s, ok := c.(string); ok && (k == "expr" || k == "definition") {
					exprs = append(exprs, s)
					continue
				}
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(dash)
	return exprs
}

// ruleExprs returns each alert's name and expression from the rule file.
// The file is YAML; this reads the subset it uses (expr: on one line or as
// a "|" block) so the test needs no YAML module.
func ruleExprs(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	var alert string
	blockIndent := -1
	var block strings.Builder
	indent := func(l string) int { return len(l) - len(strings.TrimLeft(l, " ")) }
	flush := func() {
		if blockIndent >= 0 {
			out[alert] = strings.TrimSpace(block.String())
			block.Reset()
			blockIndent = -1
		}
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		trim := strings.TrimSpace(l)
		if blockIndent >= 0 {
			if trim == "" || indent(l) > blockIndent {
				block.WriteString(trim + "\n")
				continue
			}
			flush()
		}
		switch {
		case strings.HasPrefix(trim, "- alert:"):
			alert = strings.TrimSpace(strings.TrimPrefix(trim, "- alert:"))
		case strings.HasPrefix(trim, "expr:"):
			v := strings.TrimSpace(strings.TrimPrefix(trim, "expr:"))
			if v == "|" || v == "|-" {
				blockIndent = indent(l)
				continue
			}
			out[alert] = v
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestAlertRulesCoverTheIssue(t *testing.T) {
	rules := ruleExprs(t)
	for _, name := range []string{
		"ScafoEdgeRoutingDocumentStale", "ScafoEdgeNoRoutingDocument", "ScafoEdgeApplicationUnreachable",
		"ScafoEdgeCertificateExpiringSoon", "ScafoEdgeCertificateIssuanceFailing", "ScafoEdgeHigh5xxRatio",
	} {
		if rules[name] == "" {
			t.Errorf("%s has no alert %s with an expression", alertsFile, name)
		}
	}
	if e := rules["ScafoEdgeCertificateExpiringSoon"]; !strings.Contains(e, "14 * 86400") {
		t.Errorf("certificate expiry alert %q does not use the 14-day threshold the status page flags", e)
	}
}

// TestAlertRulesPassPromtool checks the rule file, its unit tests and the
// example scrape config with promtool (Debian package "prometheus") when the
// machine has it.
func TestAlertRulesPassPromtool(t *testing.T) {
	promtool := testsupport.NeedTool(t, "promtool", "prometheus")
	for _, args := range [][]string{
		{"check", "rules", alertsFile},
		{"test", "rules", alertTestFile},
		{"check", "config", "../deploy/prometheus/prometheus.yml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// scrape is a parsed /metrics exposition.
type scrape struct {
	types  map[string]string              // family → type, as the text format names it
	series map[string][]map[string]string // sample name → label sets
}

// parseScrape reads a /metrics response with Prometheus's own parser and
// indexes its samples by the names a query uses: a histogram's samples are
// name_bucket (with le, +Inf included), name_sum and name_count, a summary's name (with
// quantile), name_sum and name_count.
func parseScrape(body string) (scrape, error) {
	mfs, err := testsupport.ParseScrape(body)
	if err != nil {
		return scrape{}, err
	}
	s := scrape{types: map[string]string{}, series: map[string][]map[string]string{}}
	add := func(name string, m *dto.Metric, extra ...string) {
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		for i := 0; i+1 < len(extra); i += 2 {
			labels[extra[i]] = extra[i+1]
		}
		s.series[name] = append(s.series[name], labels)
	}
	for name, mf := range mfs {
		s.types[name] = strings.ToLower(mf.GetType().String())
		for _, m := range mf.GetMetric() {
			switch {
			case m.Histogram != nil:
				for _, b := range m.Histogram.GetBucket() {
					add(name+"_bucket", m, "le", strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64))
				}
				add(name+"_sum", m)
				add(name+"_count", m)
			case m.Summary != nil:
				for _, q := range m.Summary.GetQuantile() {
					add(name, m, "quantile", strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64))
				}
				add(name+"_sum", m)
				add(name+"_count", m)
			default:
				add(name, m)
			}
		}
	}
	return s, nil
}

// resolve reports whether name is exported, as a family or as a histogram's
// _bucket, _sum or _count series.
func (s scrape) resolve(name string) bool {
	if _, ok := s.types[name]; ok {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if typ := s.types[base]; typ == "histogram" || typ == "summary" {
				return true
			}
		}
	}
	return false
}

// check returns what is wrong with sel against the scrape, or "".
func (s scrape) check(sel selector) string {
	if !s.resolve(sel.name) {
		return fmt.Sprintf("metric %s is not exported", sel.name)
	}
	sets := s.series[sel.name]
	for _, m := range sel.matchers {
		label, op, value := m[0], m[1], m[2]
		if label == "instance" || label == "job" {
			continue // target labels Prometheus adds at scrape time
		}
		has, hasValue := false, false
		for _, ls := range sets {
			if v, ok := ls[label]; ok {
				has = true
				hasValue = hasValue || v == value
			}
		}
		if !has {
			return fmt.Sprintf("metric %s has no label %q", sel.name, label)
		}
		key := fmt.Sprintf("%s{%s=%q}", sel.name, label, value)
		if op == "=" && !hasValue && !unobservedValues[key] {
			return fmt.Sprintf("no series %s", key)
		}
	}
	return ""
}

// monitoringDocument is the demo document with its upstreams pointed at
// this test's servers (demo-down at a closed port) and one application whose
// only upstream is down, so every figure the assets plot has a series.
func monitoringDocument(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../testdata/demo/routes.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc node.Document
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	a, bb, down := hostOf(app(t, "A")), hostOf(app(t, "B")), fmt.Sprintf("127.0.0.1:%d", testsupport.FreePort(t))
	addr := map[string]string{"127.0.0.1:9101": a, "127.0.0.1:9102": bb, "127.0.0.1:9109": down}
	fix := func(ups []node.Upstream) {
		for i := range ups {
			if n, ok := addr[ups[i].Address]; ok {
				ups[i].Address = n
			}
		}
	}
	for i := range doc.Routes {
		fix(doc.Routes[i].Upstreams)
	}
	fix(doc.API.Upstreams)
	doc.Routes = append(doc.Routes, node.Route{Host: "down.localhost", Application: "down",
		Upstreams: []node.Upstream{{Node: "demo-down", Address: down}}})
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "routes.json")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// driveTraffic sends requests that exercise every metric family: proxied,
// failed over, with a body, path-routed, denied, unrouted, unreachable; over
// HTTPS (which issues a certificate from the internal CA) and for a name the
// document does not allow (a refused handshake).
func driveTraffic(t *testing.T, e *runningEdge) {
	t.Helper()
	base, client := "http://"+e.HTTPAddr, http.DefaultClient
	if e.HTTPSAddr != "" {
		base = "https://" + e.HTTPSAddr
	}
	do := func(method, host, path, body string, want int) {
		t.Helper()
		c := client
		if e.HTTPSAddr != "" {
			// Certificate validity is certs' tests' concern; this one
			// needs the handshake to pick the name.
			tr := &http.Transport{TLSClientConfig: &tls.Config{ServerName: host, InsecureSkipVerify: true}}
			defer tr.CloseIdleConnections()
			c = &http.Client{Transport: tr, Timeout: 30 * time.Second}
		}
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s%s: %v", method, host, path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s %s%s = %d, want %d", method, host, path, resp.StatusCode, want)
		}
	}
	do("GET", "shop.localhost", "/", "", 200) // demo-down refuses, demo-a answers
	do("POST", "go.ti.localhost", "/form", "a=1&b=2", 200)
	do("GET", "ti.localhost", "/paulca/x", "", 200)
	do("GET", "api.localhost", "/v1/storage/x", "", 403)
	do("GET", "down.localhost", "/", "", 502)

	if code, _ := e.get(t, "nothing.localhost", "/"); code != 404 {
		t.Errorf("GET nothing.localhost = %d, want 404", code)
	}
	if e.HTTPSAddr != "" {
		conn, err := tls.Dial("tcp", e.HTTPSAddr, &tls.Config{ServerName: "nothing.localhost", InsecureSkipVerify: true})
		if err == nil {
			conn.Close()
			t.Error("a handshake for a name the document does not name succeeded")
		}
	}
}

// TestMonitoringAssetsMatchARunningEdge starts the edge binary on the demo
// document with TLS from the internal CA, drives traffic through it, and
// checks that every metric the Grafana dashboard and the alert rules use is
// exported, with the labels and label values they match on, and that the
// exported families are exactly the documented ones.
func TestMonitoringAssetsMatchARunningEdge(t *testing.T) {
	e := startEdge(t, "--routes-file", monitoringDocument(t), "--tls", "internal", "--poll-interval", "1s")
	testsupport.WaitForNil(t, 10*time.Second, "edge ready", func() error {
		if code, body := e.admin(t, "/readyz"); code != 200 {
			return fmt.Errorf("/readyz = %d %s", code, body)
		}
		return nil
	})
	driveTraffic(t, e)

	var sels []selector
	for _, x := range dashboardExprs(t) {
		sels = append(sels, parseSelectors(x)...)
	}
	for _, x := range ruleExprs(t) {
		sels = append(sels, parseSelectors(x)...)
	}
	if len(sels) < 40 {
		t.Fatalf("found only %d metric references in the dashboard and rules; is the parsing broken?", len(sels))
	}

	// Expiry and issuance figures land when certmagic has finished with
	// the certificate, a moment after the handshake that asked for it.
	var sc scrape
	testsupport.WaitForNil(t, 20*time.Second, "every referenced metric exported", func() error {
		code, body := e.admin(t, "/metrics")
		if code != 200 {
			return fmt.Errorf("/metrics = %d", code)
		}
		var err error
		if sc, err = parseScrape(body); err != nil {
			return err
		}
		var problems []string
		for _, s := range sels {
			if p := sc.check(s); p != "" && !slices.Contains(problems, p) {
				problems = append(problems, p)
			}
		}
		if len(problems) > 0 {
			return fmt.Errorf("%d problems:\n  %s", len(problems), strings.Join(problems, "\n  "))
		}
		return nil
	})

	t.Run("the exported families are the documented ones", func(t *testing.T) {
		var extra, missing []string
		for name, typ := range sc.types {
			if !strings.HasPrefix(name, "scafo_edge_") {
				continue
			}
			want, ok := exportedFamilies[name]
			switch {
			case !ok:
				extra = append(extra, name+" ("+typ+")")
			case want != typ:
				t.Errorf("%s is a %s, documented as a %s", name, typ, want)
			}
		}
		for name := range exportedFamilies {
			if _, ok := sc.types[name]; !ok {
				missing = append(missing, name)
			}
		}
		sort.Strings(extra)
		sort.Strings(missing)
		if len(extra) > 0 {
			t.Errorf("exported but not documented (add to exportedFamilies and the README): %v", extra)
		}
		if len(missing) > 0 {
			t.Errorf("documented but not exported: %v", missing)
		}
	})
	t.Run("the Go and process collectors are there", func(t *testing.T) {
		for _, name := range []string{"go_goroutines", "go_memstats_heap_inuse_bytes", "process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} {
			if !sc.resolve(name) {
				t.Errorf("%s not exported", name)
			}
		}
	})
	t.Run("labels come from bounded sets", func(t *testing.T) {
		// The raw Host, path and client address are attacker-chosen: none
		// may appear as a label value.
		for name, sets := range sc.series {
			for _, ls := range sets {
				for k, v := range ls {
					if strings.Contains(v, "nothing.localhost") || strings.Contains(v, "/form") || strings.Contains(v, "/paulca") {
						t.Errorf("%s{%s=%q}: a request's host or path became a label", name, k, v)
					}
				}
			}
		}
	})
	t.Run("pprof is not reachable through the traffic listener", func(t *testing.T) {
		code, body := e.get(t, "127.0.0.1", "/debug/pprof/")
		if code == 200 || strings.Contains(body, "goroutine") {
			t.Errorf("GET /debug/pprof/ on the HTTP listener = %d %q", code, body)
		}
	})
	t.Run("the status page lists the managed certificate", func(t *testing.T) {
		code, body := e.admin(t, "/status.json")
		if code != 200 {
			t.Fatalf("/status.json = %d", code)
		}
		var v admin.Status
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range v.Certs {
			names = append(names, c.Names...)
		}
		if !slices.Contains(names, "shop.localhost") {
			t.Errorf("certificates on the status page = %v, want shop.localhost among them", names)
		}
	})
	t.Run("the routes command reads the running edge", func(t *testing.T) {
		out, err := runRoutes(t, "--admin", e.AdminAddr)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"shop.localhost", "  /paulca", "down.localhost", "  denied /v1/storage", "shop.localhost"} {
			if !strings.Contains(out, want) {
				t.Errorf("routes output lacks %q:\n%s", want, out)
			}
		}
	})
}

func TestMetricReferenceChecker(t *testing.T) {
	sc, err := parseScrape(`# HELP scafo_edge_requests_total x
# TYPE scafo_edge_requests_total counter
scafo_edge_requests_total{application="shop",code="2xx",method="GET"} 3
# TYPE scafo_edge_request_duration_seconds histogram
scafo_edge_request_duration_seconds_bucket{application="shop",le="0.1"} 3
scafo_edge_request_duration_seconds_sum{application="shop"} 0.2
scafo_edge_request_duration_seconds_count{application="shop"} 3
`)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, expr, want string
	}{
		{"a family with a matching label value passes", `rate(scafo_edge_requests_total{code="2xx"}[5m])`, ""},
		{"a histogram's bucket series resolves to its family", `scafo_edge_request_duration_seconds_bucket{application=~"$application"}`, ""},
		{"target labels are not looked for on the scrape", `scafo_edge_requests_total{instance=~"$instance", job="scafo-edge"}`, ""},
		{"an unknown metric is reported", `scafo_edge_requests_totals`, "metric scafo_edge_requests_totals is not exported"},
		{"a counter has no _count series", `scafo_edge_requests_total_count`, "metric scafo_edge_requests_total_count is not exported"},
		{"a label the metric lacks is reported", `scafo_edge_requests_total{reason="x"}`, `metric scafo_edge_requests_total has no label "reason"`},
		{"a label value no series has is reported", `scafo_edge_requests_total{code="2XX"}`, `no series scafo_edge_requests_total{code="2XX"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sels := parseSelectors(tc.expr)
			if len(sels) != 1 {
				t.Fatalf("parseSelectors(%q) = %d selectors, want 1", tc.expr, len(sels))
			}
			if got := sc.check(sels[0]); got != tc.want {
				t.Errorf("check(%q) = %q, want %q", tc.expr, got, tc.want)
			}
		})
	}
}

// BenchmarkObservability measures what request metrics and the access log
// cost on a loopback load run: the same handler, upstream and client, with
// no observer, with metrics, and with metrics plus an unlimited access log
// (written to io.Discard, so the figure is the formatting, not the disk).
//
//	go test -run '^$' -bench Observability -benchtime 3s ./cmd/scafo-edge
func BenchmarkObservability(b *testing.B) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	}))
	defer upstream.Close()
	live := &edge.Live{}
	testsupport.Must(edge.NewUpdater(live, zerolog.Nop(), nil)).Apply(node.Update{Doc: &node.Document{V: 1, Routes: []node.Route{
		{Host: "app.test", Application: "app", Upstreams: []node.Upstream{{Node: "n1", Address: upstream.Listener.Addr().String()}}},
	}}, Fingerprint: "f", FetchedAt: time.Now()})

	variants := []struct {
		name     string
		observer func(reg prometheus.Registerer) edge.Observer
	}{
		{"none", func(prometheus.Registerer) edge.Observer { return nil }},
		{"metrics", func(reg prometheus.Registerer) edge.Observer { return testsupport.Must(edge.NewMetrics(reg)) }},
		{"metrics+access_log", func(reg prometheus.Registerer) edge.Observer {
			return edge.Observers{testsupport.Must(edge.NewMetrics(reg)), testsupport.Must(edge.NewAccessLog(zerolog.New(io.Discard).With().Timestamp().Logger(), 0, reg))}
		}},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			proxy := testsupport.Must(backhaul.New(backhaul.Options{}))
			defer proxy.Close()
			h := &edge.Handler{Table: live, Forwarder: proxy, Observer: v.observer(prometheus.NewRegistry())}
			front := httptest.NewServer(h)
			defer front.Close()
			tr := &http.Transport{MaxIdleConnsPerHost: 256}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest("GET", front.URL+"/", nil)
					req.Host = "app.test"
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		})
	}
}

// BenchmarkObserve is the per-request cost of each observer alone, which the
// loopback run above cannot resolve from its own noise.
func BenchmarkObserve(b *testing.B) {
	route := &edge.Route{Host: "app.test", Application: "app"}
	rec := &edge.Record{Start: time.Now(), Duration: 3 * time.Millisecond, Method: "GET", Host: "app.test",
		Path: "/some/path", Proto: "HTTP/1.1", Route: route, Status: 200, Node: "n1", BytesOut: 1234}
	for _, v := range []struct {
		name string
		o    edge.Observer
	}{
		{"metrics", testsupport.Must(edge.NewMetrics(prometheus.NewRegistry()))},
		{"access_log", testsupport.Must(edge.NewAccessLog(zerolog.New(io.Discard).With().Timestamp().Logger(), 0, prometheus.NewRegistry()))},
		{"access_log_rate_limited_away", func() edge.Observer {
			a := testsupport.Must(edge.NewAccessLog(zerolog.New(io.Discard), 1, prometheus.NewRegistry()))
			a.Observe(rec) // spend the burst: every further line is dropped and counted
			return a
		}()},
	} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				v.o.Observe(rec)
			}
		})
	}
}
