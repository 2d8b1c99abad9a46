package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// TestMeasure runs the measure command on this test's own process, against
// the real /proc, with a "load" that prints a recorded wrk run: the window's
// figures come out per request, and the row lands in the results file.
func TestMeasure(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	dir := t.TempDir()
	results := filepath.Join(dir, "results.jsonl")
	self := strconv.Itoa(os.Getpid())

	// bench/upstream's /stats: 100 TLS requests more after the window, 90
	// of them resumed.
	var calls atomic.Int64
	stats := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1) - 1
		fmt.Fprintf(w, "{\"tls_requests\": %d, \"resumed\": %d}\n", 10+100*n, 5+90*n)
	}))
	t.Cleanup(stats.Close)

	tests := []struct {
		name, proxy, tool, file string
		extra                   []string
		check                   func(t *testing.T, r Row)
	}{
		{"a proxy row has per-request figures", "scafo-edge", "wrk", "wrk-http-1k.txt", []string{"-idle-kib", "2048"},
			func(t *testing.T, r Row) {
				if r.Status != "ok" || *r.Requests != 56415 || r.CPU == nil || *r.IdleMiB != 2 || *r.PeakMiB <= 0 {
					t.Errorf("row = %+v, want ok, 56415 requests, CPU, idle 2 MiB, a peak", r)
				}
			}},
		{"the direct row notes TLS resumptions", "direct", "wrk", "wrk-https-close.txt", []string{"-stats-url", stats.URL + "/stats"},
			func(t *testing.T, r Row) {
				if r.CPU != nil || !strings.HasPrefix(r.Note, "90% of the new TLS connections resumed") {
					t.Errorf("row = %+v, want no proxy CPU and a 90%% resumption note", r)
				}
			}},
		{"a load that measured nothing is a failed row saying why", "caddy", "h3load", "h3load-no-connection.txt", nil,
			func(t *testing.T, r Row) {
				if r.Status != "failed" || r.Note != "h3load measured no request: h3load: no connection to 127.0.0.1:19181 could be set up: context deadline exceeded" {
					t.Errorf("row = %+v, want failed with h3load's last words", r)
				}
			}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"-results", results, "-proxy", tt.proxy, "-cell", "c", "-round", "1",
				"-tool", tt.tool, "-pid", self, "-upstream-pid", self, "-out", filepath.Join(dir, "out.txt")}, tt.extra...)
			args = append(args, "--", "cat", filepath.Join("testdata", tt.file))
			if err := run("measure", args, &bytes.Buffer{}, procFS{Dir: "/proc"}); err != nil {
				t.Fatal(err)
			}
			rows, err := readRows(results)
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != i+1 {
				t.Fatalf("%d rows, want %d", len(rows), i+1)
			}
			tt.check(t, rows[i])
		})
	}
}

func TestRowCommandRefusesOK(t *testing.T) {
	results := filepath.Join(t.TempDir(), "r.jsonl")
	err := run("row", []string{"-results", results, "-proxy", "p", "-cell", "c", "-status", "ok"}, &bytes.Buffer{}, fakeProc)
	if err == nil {
		t.Error("row -status ok = nil error, want it refused (measure writes ok rows)")
	}
	if err := run("row", []string{"-results", results, "-proxy", "p", "-cell", "c", "-status", "skipped", "-note", "why"}, &bytes.Buffer{}, fakeProc); err != nil {
		t.Fatal(err)
	}
	rows, _ := readRows(results)
	if len(rows) != 1 || rows[0].Note != "why" {
		t.Errorf("rows = %+v, want one skipped row noting why", rows)
	}
}

func TestTreeCommand(t *testing.T) {
	var out bytes.Buffer
	if err := run("tree", []string{"100"}, &out, fakeProc); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "100\n103\n107\n" {
		t.Errorf("tree 100 = %q, want 100, 103, 107", got)
	}
	out.Reset()
	if err := run("rss", []string{"103"}, &out, fakeProc); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "1536\n" {
		t.Errorf("rss 103 = %q, want 1024+512 KiB", got)
	}
}
