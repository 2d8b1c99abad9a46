package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
)

// Row is one proxy in one cell in one round: a line of the results file
// (JSON lines, appended by the measure and row commands, read by report),
// with the fields of the report's rows. A row that measured has its figures
// and RoundsOK 1.
type Row struct {
	Round int `json:"round"`
	Summary
}

// Window is what one measured window gives: the load tool's report and the
// /proc samples around it, of the proxy's processes and of the upstream's.
type Window struct {
	Load              Load
	Before, After     Sample // the proxy
	UpBefore, UpAfter Sample // the upstream
	IdleKiB           int64  // VmRSS after start-up, before any load
	ClockTicks        int64  // per second (getconf CLK_TCK)
}

// figures sets r's per-request figures from w. Direct rows (the origin
// alone) get only the load's figures and the upstream's CPU: there is no
// proxy to charge. Rounded as the table shows them, so a median of rounds
// is a median of what each round printed.
func (r *Row) figures(w Window, direct bool) {
	n := float64(w.Load.Requests)
	tck := float64(w.ClockTicks)
	r.Status, r.RoundsOK = "ok", 1
	r.Requests, r.Errors = &w.Load.Requests, &w.Load.Errors
	r.RPS, r.P50, r.P99 = ptr(w.Load.RPS), ptr(round(w.Load.P50, 3)), ptr(round(w.Load.P99, 3))
	if w.Load.ReadBytes > 0 {
		r.BytesPerResponse = ptr(round(float64(w.Load.ReadBytes)/n, 0))
	}
	r.UpstreamCPU = ptr(round(float64(w.UpAfter.CPUTicks-w.UpBefore.CPUTicks)*1e6/tck/n, 1))
	if direct {
		return
	}
	r.CPU = ptr(round(float64(w.After.CPUTicks-w.Before.CPUTicks)*1e6/tck/n, 1))
	r.CtxSwitches = ptr(round(float64(w.After.CtxSwitches-w.Before.CtxSwitches)/n, 2))
	r.RWSyscalls = ptr(round(float64(w.After.RWSyscalls-w.Before.RWSyscalls)/n, 2))
	r.PeakMiB = ptr(round(float64(w.After.HWMKiB)/1024, 1))
	r.IdleMiB = ptr(round(float64(w.IdleKiB)/1024, 1))
}

func ptr(v float64) *float64 { return &v }

// round rounds v to d decimals.
func round(v float64, d int) float64 {
	p := math.Pow(10, float64(d))
	return math.Round(v*p) / p
}

// appendRow adds r to the results file at path.
func appendRow(path string, r Row) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("open results: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("write results: %w", err)
	}
	return f.Close()
}

// readRows reads every row of the results file at path, in order.
func readRows(path string) ([]Row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open results: %w", err)
	}
	defer f.Close()
	var rows []Row
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for line := 1; sc.Scan(); line++ {
		var r Row
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("results line %d: %w", line, err)
		}
		rows = append(rows, r)
	}
	return rows, sc.Err()
}

// Summary is one proxy in one cell over every round: a row of the table,
// and of the JSON, whose field names are documented in bench/README.md and
// read by whoever kept earlier runs: never rename them. A figure is nil
// (null) when it does not apply (the direct row's CPU) or was not measured
// (every figure of a row no round measured).
type Summary struct {
	Proxy  string `json:"proxy"`
	Cell   string `json:"cell"`
	Status string `json:"status"`
	// RoundsOK is how many rounds measured it.
	RoundsOK int    `json:"rounds"`
	Requests *int64 `json:"requests"` // summed over the rounds
	// Medians over the rounds that measured it.
	RPS *float64 `json:"requests_per_sec"`
	// RatioToDirect is the median of each round's req/s over the direct
	// row's of the same round and cell; nil without a direct row.
	RatioToDirect *float64 `json:"ratio_to_direct"`
	P50           *float64 `json:"p50_ms"`
	P99           *float64 `json:"p99_ms"`
	CPU           *float64 `json:"cpu_us_per_request"`
	CtxSwitches   *float64 `json:"context_switches_per_request"`
	RWSyscalls    *float64 `json:"rw_syscalls_per_request"`
	PeakMiB       *float64 `json:"peak_rss_mib"` // the largest of the rounds
	IdleMiB       *float64 `json:"idle_rss_mib"`
	Errors        *int64   `json:"errors"` // summed over the rounds
	UpstreamCPU   *float64 `json:"upstream_cpu_us_per_request"`
	Note          string   `json:"note"`
	// BytesPerResponse is what a response took on the wire, headers
	// included (wrk's bytes read over its requests): the size a
	// compressing proxy sends. Absent where the tool does not count it
	// (h2load, h3load) and in results from before it was counted.
	BytesPerResponse *float64 `json:"bytes_per_response,omitempty"`
}

// aggregate folds rows into one Summary per proxy and cell, in the order
// they first appear. The ratio to direct is taken round by round before the
// median, so a slow patch of the machine, which hits both rows of a round,
// cancels out. A pair that never measured keeps the first row's status and
// note; one that measured in some round is "ok", with the note of its last
// measured round that had one.
func aggregate(rows []Row) []Summary {
	type key struct{ proxy, cell string }
	type acc struct {
		s                      Summary
		requests, errors       int64
		rps, p50, p99, ratio   []float64
		cpu, ctx, rw, idle, up []float64
		bytes                  []float64
	}
	type roundCell struct {
		round int
		cell  string
	}
	direct := map[roundCell]float64{}
	for _, r := range rows {
		if r.Proxy == "direct" && r.Status == "ok" {
			direct[roundCell{r.Round, r.Cell}] = val(r.RPS)
		}
	}
	var order []key
	accs := map[key]*acc{}
	for _, r := range rows {
		k := key{r.Proxy, r.Cell}
		a, seen := accs[k]
		if !seen {
			a = &acc{s: Summary{Proxy: r.Proxy, Cell: r.Cell, Status: r.Status, Note: r.Note}}
			accs[k] = a
			order = append(order, k)
		}
		if r.Status != "ok" {
			continue
		}
		if a.s.Status != "ok" {
			a.s.Status, a.s.Note = "ok", ""
		}
		if r.Note != "" {
			a.s.Note = r.Note
		}
		a.s.RoundsOK++
		if r.Requests != nil {
			a.requests += *r.Requests
		}
		if r.Errors != nil {
			a.errors += *r.Errors
		}
		if d := direct[roundCell{r.Round, r.Cell}]; d > 0 && r.RPS != nil {
			// Six significant digits, all a ratio of two measurements holds.
			a.ratio = append(a.ratio, *sig(ptr(*r.RPS / d)))
		}
		add := func(list *[]float64, v *float64) {
			if v != nil {
				*list = append(*list, *v)
			}
		}
		add(&a.rps, r.RPS)
		add(&a.p50, r.P50)
		add(&a.p99, r.P99)
		add(&a.cpu, r.CPU)
		add(&a.ctx, r.CtxSwitches)
		add(&a.rw, r.RWSyscalls)
		add(&a.idle, r.IdleMiB)
		add(&a.up, r.UpstreamCPU)
		add(&a.bytes, r.BytesPerResponse)
		if r.PeakMiB != nil && (a.s.PeakMiB == nil || *r.PeakMiB > *a.s.PeakMiB) {
			a.s.PeakMiB = ptr(*r.PeakMiB)
		}
	}
	out := make([]Summary, 0, len(order))
	for _, k := range order {
		a := accs[k]
		s := a.s
		if s.RoundsOK > 0 {
			s.Requests, s.Errors = &a.requests, &a.errors
			s.RPS, s.P50, s.P99 = median(a.rps), median(a.p50), median(a.p99)
			s.RatioToDirect = median(a.ratio)
			s.CPU, s.CtxSwitches, s.RWSyscalls = median(a.cpu), median(a.ctx), median(a.rw)
			s.IdleMiB, s.UpstreamCPU = median(a.idle), median(a.up)
			s.BytesPerResponse = median(a.bytes)
		}
		out = append(out, s)
	}
	return out
}

// median returns the median of vs (the mean of the middle two for an even
// count), or nil for none.
func median(vs []float64) *float64 {
	if len(vs) == 0 {
		return nil
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return ptr(s[n/2])
	}
	return ptr((s[n/2-1] + s[n/2]) / 2)
}
