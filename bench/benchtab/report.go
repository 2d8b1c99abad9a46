package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Meta is what the report says about the run besides its rows.
type Meta struct {
	Date     string // UTC, "2006-01-02T15:04:05Z"
	CPUs     int
	Duration string
	Warmup   string
	Rounds   int
	Conns    int
	Threads  int
	Workers  int
	// Versions maps a row's proxy name (and "wrk", "h2load", "h3load",
	// "direct") to its version. h2load's and h3load's presence says the
	// run had h2 and h3 cells.
	Versions map[string]string
}

// cellNames are the table's words for each cell.
var cellNames = map[string]string{
	"http-1k":      "HTTP keep-alive 1 KiB",
	"http-1m":      "HTTP keep-alive 1 MiB",
	"https-1k":     "HTTPS keep-alive 1 KiB",
	"https-close":  "HTTPS new connection per request 1 KiB",
	"h2-1k":        "h2 (TLS) 1 KiB, 16 conns × 16 streams",
	"h2-1k-1s":     "h2 (TLS) 1 KiB, 64 conns × 1 stream",
	"h2-1m":        "h2 (TLS) 1 MiB, 16 conns × 4 streams",
	"h3-1k":        "HTTP/3 1 KiB, 16 conns × 16 streams",
	"h3-close":     "HTTP/3 new connection per request 1 KiB",
	"http-html64k": "HTTP keep-alive 64 KiB HTML, Accept-Encoding: gzip, zstd",
}

func cellName(c string) string {
	if n, ok := cellNames[c]; ok {
		return n
	}
	return c
}

// edgeRows are the rows set against the targets: scafo-edge and any
// --baseline-rev build of it (scafo-edge@<hash>), in the order they appear.
func edgeRows(sums []Summary) []string {
	var edges []string
	seen := map[string]bool{}
	for _, s := range sums {
		if (s.Proxy == "scafo-edge" || strings.HasPrefix(s.Proxy, "scafo-edge@")) && !seen[s.Proxy] {
			seen[s.Proxy] = true
			edges = append(edges, s.Proxy)
		}
	}
	return edges
}

// writeMarkdown prints the run's header, the table, the notes under it and
// scafo-edge against the targets.
func writeMarkdown(w io.Writer, m Meta, sums []Summary) {
	date := m.Date
	if len(date) >= 16 {
		date = strings.Replace(date[:16], "T", " ", 1) + " UTC"
	}
	v := func(k string) string {
		if s := m.Versions[k]; s != "" {
			return s
		}
		return "?"
	}
	fmt.Fprintf(w, "## scafo-edge benchmark, %s\n\n", date)
	rounds := ""
	if m.Rounds > 1 {
		rounds = fmt.Sprintf("; medians of %d rounds", m.Rounds)
	}
	fmt.Fprintf(w, "%d CPUs shared by wrk, proxy and upstream; wrk %s: %d threads, %d connections, %s per cell after %s warm-up%s; workers %d (GOMAXPROCS = nginx workers = HAProxy threads).\n",
		m.CPUs, v("wrk"), m.Threads, m.Conns, m.Duration, m.Warmup, rounds, m.Workers)
	if _, ok := m.Versions["h2load"]; ok {
		fmt.Fprintf(w, "h2 cells: h2load %s, %d threads, h2 only (ALPN), connections × streams as each cell says, same duration and warm-up; p50/p99 from its per-request log; errors are its failed requests.\n",
			v("h2load"), m.Threads)
	}
	if _, ok := m.Versions["h3load"]; ok {
		fmt.Fprintf(w, "h3 cells: bench/h3load (%s), QUIC connections × streams as the cell says, same duration and a separate warm-up run; p50/p99 from its histogram; errors are its errors plus non-2xx responses.\n",
			v("h3load"))
	}
	var vs []string
	names := append([]string{"scafo-edge"}, edgeRowsOf(m.Versions)...)
	for _, p := range append(names, "caddy", "traefik", "nginx", "haproxy", "go-tls") {
		if s := m.Versions[p]; s != "" {
			vs = append(vs, p+" "+s)
		}
	}
	if len(vs) == 0 {
		vs = []string{"none"}
	}
	fmt.Fprintf(w, "Versions: %s. Ratios within this run are what count; absolute figures move with the machine's other load.\n\n", strings.Join(vs, ", "))

	// bytes/resp, what a response took on the wire, only for results that
	// counted it (wrk's; a results file from before it was counted renders
	// as it always did).
	withBytes := slices.ContainsFunc(sums, func(s Summary) bool { return s.BytesPerResponse != nil })
	bytesHead, bytesRule, bytesNone := "", "", ""
	if withBytes {
		bytesHead, bytesRule, bytesNone = " bytes/resp |", "--:|", " — |"
	}
	fmt.Fprintf(w, "| cell | proxy | req/s | × direct | p50 ms | p99 ms |%s CPU µs/req | ctx switches/req | peak RSS MiB | idle RSS MiB | errors |\n", bytesHead)
	fmt.Fprintf(w, "|---|---|--:|--:|--:|--:|%s--:|--:|--:|--:|--:|\n", bytesRule)
	var notes []string
	said := map[string]bool{}
	for _, s := range sums {
		if s.Note != "" {
			n := s.Proxy + ": " + s.Note
			if s.Status != "ok" {
				n = s.Proxy + ": " + s.Status + ": " + s.Note
			}
			if !said[n] {
				said[n] = true
				notes = append(notes, n)
			}
		}
		bytesCell, bytesEmpty := "", ""
		if withBytes {
			bytesCell, bytesEmpty = " "+orDash(s.BytesPerResponse, 0)+" |", " |"
		}
		switch s.Status {
		case "ok":
			fmt.Fprintf(w, "| %s | %s | %.0f | %s | %.2f | %.2f |%s %s | %s | %s | %s | %d |\n", cellName(s.Cell), s.Proxy,
				val(s.RPS), orDash(s.RatioToDirect, 2), val(s.P50), val(s.P99), bytesCell, orDash(s.CPU, 1), orDash(s.CtxSwitches, 2),
				orDash(s.PeakMiB, 1), orDash(s.IdleMiB, 1), *s.Errors)
		case "n/a":
			fmt.Fprintf(w, "| %s | %s | — | — | — | — |%s — | — | — | — | — |\n", cellName(s.Cell), s.Proxy, bytesNone)
		default:
			fmt.Fprintf(w, "| %s | %s | %s | | | |%s | | | | |\n", cellName(s.Cell), s.Proxy, s.Status, bytesEmpty)
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range notes {
			fmt.Fprintln(w, "- "+n)
		}
	}
	writeTargets(w, sums)
}

// edgeRowsOf returns the --baseline-rev rows (scafo-edge@<hash>) named in
// versions; there is at most one today.
func edgeRowsOf(versions map[string]string) []string {
	var out []string
	for k := range versions {
		if strings.HasPrefix(k, "scafo-edge@") {
			out = append(out, k)
		}
	}
	return out
}

func orDash(v *float64, decimals int) string {
	if v == nil {
		return "—"
	}
	return strconv.FormatFloat(*v, 'f', decimals, 64)
}

// writeTargets sets scafo-edge (and the --baseline-rev row, the same way)
// against Caddy and nginx, per cell: the targets the edge was built to, req/s ≥ 1.5×
// Caddy's, CPU/req ≤ 0.6× Caddy's, p99 ≤ Caddy's; the stretch, CPU/req ≤ 2×
// nginx's. Nothing is printed when no edge row measured.
func writeTargets(w io.Writer, sums []Summary) {
	ok := map[[2]string]Summary{}
	var cells []string
	for _, s := range sums {
		if s.Status != "ok" {
			continue
		}
		if !slices.Contains(cells, s.Cell) {
			cells = append(cells, s.Cell)
		}
		ok[[2]string{s.Proxy, s.Cell}] = s
	}
	verdict := func(met bool) string {
		if met {
			return "met"
		}
		return "not met"
	}
	// go-tls, the floor (bench/gotls), is set against the same targets:
	// what they would ask of Go's crypto/tls and net/http alone.
	rowsFor := edgeRows(sums)
	floor := slices.ContainsFunc(sums, func(s Summary) bool { return s.Proxy == "go-tls" && s.Status == "ok" })
	if floor {
		rowsFor = append(rowsFor, "go-tls")
	}
	var rows []string
	for _, c := range cells {
		for _, e := range rowsFor {
			es, found := ok[[2]string{e, c}]
			if !found {
				continue
			}
			line := fmt.Sprintf("| %s | %s | — | — | — |", c, e)
			if cs, found := ok[[2]string{"caddy", c}]; found {
				ecpu, ccpu := val(es.CPU), val(cs.CPU)
				erps, crps := val(es.RPS), val(cs.RPS)
				ep99, cp99 := val(es.P99), val(cs.P99)
				line = fmt.Sprintf("| %s | %s | %.2f (%s) | %.2f (%s) | %.2f (%s) |", c, e,
					erps/crps, verdict(erps >= 1.5*crps),
					ecpu/ccpu, verdict(ecpu <= 0.6*ccpu),
					ep99/cp99, verdict(ep99 <= cp99))
			}
			if ns, found := ok[[2]string{"nginx", c}]; found && val(ns.CPU) > 0 {
				line += fmt.Sprintf(" %.2f (%s) |", val(es.CPU)/val(ns.CPU), verdict(val(es.CPU) <= 2*val(ns.CPU)))
			} else {
				line += " — |"
			}
			rows = append(rows, line)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "scafo-edge against its targets (ratios of this run):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| cell | proxy | req/s × Caddy (≥ 1.5) | CPU/req × Caddy (≤ 0.6) | p99 × Caddy (≤ 1) | CPU/req × nginx (stretch ≤ 2) |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|")
	for _, r := range rows {
		fmt.Fprintln(w, r)
	}
	if floor {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "go-tls is no proxy but the floor: a bare Go HTTPS (and HTTP/3) server, bench/gotls, with the edge's TLS settings, answering 1 KiB itself. A target it does not meet is beyond Go's crypto/tls (and quic-go) on this machine.")
	}
}

func val(v *float64) float64 {
	if v == nil {
		return 0
	}
	return *v
}

// jsonReport is the --json document (field names: see Summary).
type jsonReport struct {
	Date     string            `json:"date"`
	CPUs     int               `json:"cpus"`
	Settings jsonSettings      `json:"settings"`
	Versions map[string]string `json:"versions"`
	Results  []Summary         `json:"results"`
}

type jsonSettings struct {
	Duration    string `json:"duration"`
	Warmup      string `json:"warmup"`
	Rounds      int    `json:"rounds"`
	Connections int    `json:"connections"`
	WrkThreads  int    `json:"wrk_threads"`
	Workers     int    `json:"workers"`
}

func writeJSON(w io.Writer, m Meta, sums []Summary) error {
	rep := jsonReport{
		Date: m.Date, CPUs: m.CPUs,
		Settings: jsonSettings{Duration: m.Duration, Warmup: m.Warmup, Rounds: m.Rounds,
			Connections: m.Conns, WrkThreads: m.Threads, Workers: m.Workers},
		Versions: m.Versions,
		Results:  []Summary{},
	}
	if rep.Versions == nil {
		rep.Versions = map[string]string{}
	}
	for _, s := range sums {
		for _, f := range []**float64{&s.RPS, &s.RatioToDirect, &s.P50, &s.P99, &s.CPU, &s.CtxSwitches, &s.RWSyscalls, &s.PeakMiB, &s.IdleMiB, &s.UpstreamCPU, &s.BytesPerResponse} {
			*f = sig(*f)
		}
		rep.Results = append(rep.Results, s)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// sig rounds a ratio or median to six significant digits, which is all the
// measurement holds (a median of two rounds can end in a long fraction).
func sig(v *float64) *float64 {
	if v == nil || *v == 0 || math.IsNaN(*v) {
		return v
	}
	f, _ := strconv.ParseFloat(strconv.FormatFloat(*v, 'g', 6, 64), 64)
	return &f
}
