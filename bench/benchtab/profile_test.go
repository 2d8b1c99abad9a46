package main

import (
	"bytes"
	"path/filepath"
	"testing"
)

func TestPprofTotal(t *testing.T) {
	tests := []struct {
		name string
		out  string
		want float64
	}{
		{"objects", string(mustRead(t, "pprof-objects.top")), 869078},
		{"bytes with -unit=B", string(mustRead(t, "pprof-bytes.top")), 80154763},
		{"a scaled total", "Showing nodes accounting for 1MB, 50% of 2.5MB total\n", 2.5 * (1 << 20)},
		{"no total line", "File: scafo-edge\n", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pprofTotal([]byte(tt.out)); got != tt.want {
				t.Errorf("pprofTotal = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestProfileLines(t *testing.T) {
	results := filepath.Join(t.TempDir(), "window.jsonl")
	thousand := int64(1000)
	if err := appendRow(results, Row{Round: 1, Summary: Summary{Proxy: "scafo-edge", Cell: "http-1k", Status: "ok",
		Requests: &thousand, CPU: ptr(33.1), CtxSwitches: ptr(0.46), RWSyscalls: ptr(6.9)}}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run("window", []string{"-results", results}, &out, fakeProc); err != nil {
		t.Fatal(err)
	}
	if want := "    CPU 33.1 µs/request; 0.46 context switches/request; 6.90 read+write syscalls/request\n"; out.String() != want {
		t.Errorf("window = %q, want %q", out.String(), want)
	}
	out.Reset()
	err := run("allocs", []string{"-results", results, "-objects", "testdata/pprof-objects.top", "-bytes", "testdata/pprof-bytes.top"}, &out, fakeProc)
	if err != nil {
		t.Fatal(err)
	}
	if want := "About 869 objects and 80155 bytes allocated per request (the heap profile is sampled and ends at the last GC).\n"; out.String() != want {
		t.Errorf("allocs = %q, want %q", out.String(), want)
	}
}
