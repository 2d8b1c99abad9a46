package main

import (
	"path/filepath"
	"testing"
)

func TestAggregate(t *testing.T) {
	sums := goldenSummaries(t)
	find := func(proxy, cell string) Summary {
		for _, s := range sums {
			if s.Proxy == proxy && s.Cell == cell {
				return s
			}
		}
		t.Fatalf("no summary for %s %s", proxy, cell)
		return Summary{}
	}
	t.Run("medians of an even count are the mean of the middle two", func(t *testing.T) {
		s := find("scafo-edge", "http-1k")
		if *s.RPS != 13500 || *s.CPU != (33.1+36.1)/2 {
			t.Errorf("scafo-edge http-1k: rps %v cpu %v, want 13500 and %v", *s.RPS, *s.CPU, (33.1+36.1)/2)
		}
	})
	t.Run("peak RSS is the largest round's, errors and requests are summed", func(t *testing.T) {
		s := find("direct", "http-1k")
		if *s.Errors != 1 || *s.Requests != 680000 {
			t.Errorf("direct http-1k: errors %d requests %d, want 1 and 680000", *s.Errors, *s.Requests)
		}
		if e := find("scafo-edge", "http-1k"); *e.PeakMiB != 28.1 {
			t.Errorf("peak = %v, want 28.1", *e.PeakMiB)
		}
	})
	t.Run("ratio to direct is taken per round before the median", func(t *testing.T) {
		// Round 1: 15000/38000 = 0.394737; round 2: 12000/30000 = 0.4.
		s := find("scafo-edge", "http-1k")
		if got, want := *s.RatioToDirect, (0.394737+0.4)/2; got-want > 1e-9 || want-got > 1e-9 {
			t.Errorf("ratio = %v, want %v", got, want)
		}
	})
	t.Run("a row that measured in one round is ok, without the failed round's note", func(t *testing.T) {
		s := find("scafo-edge", "h2-1k")
		if s.Status != "ok" || s.Note != "" || s.RoundsOK != 1 || s.RatioToDirect != nil {
			t.Errorf("scafo-edge h2-1k = %+v, want ok, no note, 1 round, no ratio", s)
		}
	})
	t.Run("a row that never measured keeps its status and note", func(t *testing.T) {
		s := find("traefik", "http-1k")
		if s.Status != "skipped" || s.Note == "" || s.RoundsOK != 0 {
			t.Errorf("traefik http-1k = %+v, want skipped with its note", s)
		}
	})
}

func TestFigures(t *testing.T) {
	w := Window{
		Load:       Load{Requests: 1000, RPS: 500, P50: 1.23456, P99: 9.87654, Errors: 2},
		Before:     Sample{CPUTicks: 100, CtxSwitches: 50, RWSyscalls: 4000},
		After:      Sample{CPUTicks: 103, CtxSwitches: 550, RWSyscalls: 11000, HWMKiB: 30 * 1024},
		UpBefore:   Sample{CPUTicks: 10},
		UpAfter:    Sample{CPUTicks: 12},
		IdleKiB:    17 * 1024,
		ClockTicks: 100,
	}
	var r Row
	r.figures(w, false)
	want := map[string]float64{"cpu": 30, "ctx": 0.5, "rw": 7, "peak": 30, "idle": 17, "up": 20}
	got := map[string]float64{"cpu": *r.CPU, "ctx": *r.CtxSwitches, "rw": *r.RWSyscalls, "peak": *r.PeakMiB, "idle": *r.IdleMiB, "up": *r.UpstreamCPU}
	for k := range want {
		if got[k] != want[k] {
			t.Errorf("%s = %v, want %v (3 ticks of 10 ms over 1000 requests is 30 µs each)", k, got[k], want[k])
		}
	}
	if r.Status != "ok" || *r.P50 != 1.235 || *r.P99 != 9.877 || *r.Errors != 2 {
		t.Errorf("row = %+v, want ok, p50 1.235, p99 9.877, 2 errors", r)
	}

	var d Row
	d.figures(w, true)
	if d.CPU != nil || d.PeakMiB != nil || d.UpstreamCPU == nil {
		t.Errorf("direct row = %+v, want no proxy figures but the upstream's CPU", d)
	}
}

func TestRowsRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.jsonl")
	five := int64(5)
	in := []Row{{Round: 1, Summary: Summary{Proxy: "nginx", Cell: "h3-1k", Status: "no HTTP/3 in this build", Note: "no http_v3_module"}},
		{Round: 2, Summary: Summary{Proxy: "direct", Cell: "http-1k", Status: "ok", Requests: &five, RPS: ptr(2.5), UpstreamCPU: ptr(1.5)}}}
	for _, r := range in {
		if err := appendRow(path, r); err != nil {
			t.Fatal(err)
		}
	}
	out, err := readRows(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0].Status != in[0].Status || *out[1].RPS != 2.5 || *out[1].UpstreamCPU != 1.5 || out[1].CPU != nil {
		t.Errorf("readRows = %+v, want what was appended", out)
	}
}
