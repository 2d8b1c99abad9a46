package main

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// goldenMeta is the run the golden files were rendered for. testdata/
// report.md and report.json are what bench/run.sh's awk printed for
// testdata/results.jsonl before the measuring moved here: the move keeps
// every column, note and field.
var goldenMeta = Meta{
	Date: "2026-12-01T11:30:00Z", CPUs: 2, Duration: "3s", Warmup: "1s", Rounds: 2, Conns: 64, Threads: 2, Workers: 2,
	Versions: map[string]string{
		"wrk": "4.1.0", "h2load": "1.52.0", "scafo-edge": "9367f69", "scafo-edge@abc1234": "--baseline-rev abc1234",
		"caddy": "v2.11.9", "nginx": "1.22.1", "direct": "bench/upstream (Go 1.26.8)",
	},
}

func goldenSummaries(t *testing.T) []Summary {
	t.Helper()
	rows, err := readRows("testdata/results.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	return aggregate(rows)
}

func TestMarkdownMatchesTheShellTable(t *testing.T) {
	var b bytes.Buffer
	writeMarkdown(&b, goldenMeta, goldenSummaries(t))
	want := string(mustRead(t, "report.md"))
	if got := b.String(); got != want {
		t.Errorf("writeMarkdown:\n%s\nwant:\n%s", got, want)
	}
}

func TestJSONMatchesTheShellJSON(t *testing.T) {
	var b bytes.Buffer
	if err := writeJSON(&b, goldenMeta, goldenSummaries(t)); err != nil {
		t.Fatal(err)
	}
	var got, want any
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("writeJSON printed invalid JSON: %v\n%s", err, b.String())
	}
	if err := json.Unmarshal(mustRead(t, "report.json"), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("writeJSON:\n%s\nwant the fields and values of testdata/report.json", b.String())
	}
	// The field order is the documented one, not Go's map order.
	if i, j := strings.Index(b.String(), `"requests_per_sec"`), strings.Index(b.String(), `"note"`); i < 0 || j < i {
		t.Errorf("requests_per_sec should come before note:\n%s", b.String())
	}
}

func TestTargetsNeedAnEdgeRow(t *testing.T) {
	var b bytes.Buffer
	writeTargets(&b, []Summary{{Proxy: "caddy", Cell: "http-1k", Status: "ok", RPS: ptr(1)}})
	if b.Len() != 0 {
		t.Errorf("writeTargets without an edge row printed:\n%s", b.String())
	}
}

// TestTargetsSetTheFloorAgainstThemToo: a go-tls row (bench/gotls) gets its
// own line against Caddy and nginx, after the edge's, and the note that says
// what it is.
func TestTargetsSetTheFloorAgainstThemToo(t *testing.T) {
	row := func(proxy string, cpu, rps float64) Summary {
		return Summary{Proxy: proxy, Cell: "https-close", Status: "ok", CPU: ptr(cpu), RPS: ptr(rps), P99: ptr(10)}
	}
	var b bytes.Buffer
	writeTargets(&b, []Summary{row("scafo-edge", 570, 500), row("caddy", 600, 480), row("nginx", 200, 1500), row("go-tls", 450, 700)})
	out := b.String()
	for _, want := range []string{
		"| https-close | scafo-edge | 1.04 (not met) | 0.95 (not met) | 1.00 (met) | 2.85 (not met) |",
		"| https-close | go-tls | 1.46 (not met) | 0.75 (not met) | 1.00 (met) | 2.25 (not met) |",
		"go-tls is no proxy but the floor",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("writeTargets lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, "| go-tls |") < strings.Index(out, "| scafo-edge |") {
		t.Errorf("the floor's line should follow the edge's:\n%s", out)
	}
}

// TestBytesPerResponseColumn: results that counted bytes on the wire
// (testdata/results-html64k.jsonl, a run of the compression cell) get the
// bytes/resp column, between p99 and CPU, and a row without the figure a
// dash; the golden results, from before it was counted, render without it
// (TestMarkdownMatchesTheShellTable).
func TestBytesPerResponseColumn(t *testing.T) {
	rows, err := readRows("testdata/results-html64k.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	rows = append(rows, Row{Round: 1, Summary: Summary{Proxy: "traefik", Cell: "http-html64k", Status: "skipped", Note: "not built"}},
		Row{Round: 1, Summary: Summary{Proxy: "haproxy", Cell: "http-html64k", Status: "n/a", Note: "no"}})
	var b bytes.Buffer
	writeMarkdown(&b, goldenMeta, aggregate(rows))
	out := b.String()
	for _, want := range []string{
		"| cell | proxy | req/s | × direct | p50 ms | p99 ms | bytes/resp | CPU µs/req | ctx switches/req | peak RSS MiB | idle RSS MiB | errors |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
		"| HTTP keep-alive 64 KiB HTML, Accept-Encoding: gzip, zstd | direct | 23927 | 1.00 | 2.04 | 11.16 | 65675 | — | — | — | — | 0 |",
		"| HTTP keep-alive 64 KiB HTML, Accept-Encoding: gzip, zstd | scafo-edge | 4293 | 0.18 | 14.89 | 52.96 | 8849 | 303.4 | 2.60 | 69.8 | 21.4 | 0 |",
		"| HTTP keep-alive 64 KiB HTML, Accept-Encoding: gzip, zstd | traefik | skipped | | | | | | | | | |",
		"| HTTP keep-alive 64 KiB HTML, Accept-Encoding: gzip, zstd | haproxy | — | — | — | — | — | — | — | — | — | — |",
		"- nginx: Accept-Encoding: gzip, zstd: Content-Encoding gzip, 10029 bytes of body",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "| HTTP keep-alive 64 KiB") {
			if n := strings.Count(line, "|"); n != 13 {
				t.Errorf("%d cells in %q, want 12", n-1, line)
			}
		}
	}
	var j bytes.Buffer
	if err := writeJSON(&j, goldenMeta, aggregate(rows)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(j.String(), `"bytes_per_response": 8849`) {
		t.Errorf("the JSON lacks the edge's bytes_per_response:\n%s", j.String())
	}
}
