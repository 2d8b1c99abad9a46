package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParseLoad(t *testing.T) {
	tests := []struct {
		name       string
		tool, file string
		h2log      string
		want       Load
	}{
		{"wrk keep-alive run", "wrk", "wrk-http-1k.txt", "",
			Load{Requests: 56415, RPS: 27419.61, P50: 0.325, P99: 120.62, ReadBytes: 64424509}},
		{"wrk's bytes read of a compressed response", "wrk", "wrk-http-html64k.txt", "",
			Load{Requests: 43075, RPS: 4293.11, P50: 14.89, P99: 52.96, ReadBytes: 381167862}},
		{"wrk counts non-2xx responses as errors", "wrk", "wrk-non2xx.txt", "",
			Load{Requests: 28384, RPS: 13413.41, P50: 0.569, P99: 214.54, Errors: 28384, ReadBytes: 4991222}},
		{"wrk adds every kind of socket error to the non-2xx", "wrk", "wrk-socket-errors.txt", "",
			Load{Requests: 20946, RPS: 6958.80, P50: 6.02, P99: 1020, Errors: 12 + 1 + 3 + 5, ReadBytes: 23907533}},
		{"wrk Connection: close run", "wrk", "wrk-https-close.txt", "",
			Load{Requests: 881, RPS: 414.98, P50: 4.99, P99: 195.93, ReadBytes: 1027604}},
		{"wrk that could not connect measured nothing", "wrk", "wrk-refused.txt", "", Load{}},
		{"h2load takes done, failed and its log's percentiles", "h2load", "h2load-h2-1k.txt", "h2load-h2-1k.log",
			Load{Requests: 16264, RPS: 8132, P50: 2.501, P99: 8.684}}, // as sort -n | awk read them
		{"h2load without its log has no percentiles", "h2load", "h2load-h2-1k.txt", "",
			Load{Requests: 16264, RPS: 8132}},
		{"h2load against a server without h2 measured nothing", "h2load", "h2load-no-h2.txt", "", Load{}},
		{"h3load's JSON line", "h3load", "h3load-h3-1k.txt", "",
			Load{Requests: 2438, RPS: 2438, P50: 1.112, P99: 8.384}},
		{"h3load without a connection measured nothing", "h3load", "h3load-no-connection.txt", "", Load{}},
		{"h3load -close says what its handshakes were", "h3load", "h3load-h3-close.txt", "",
			Load{Requests: 4120, RPS: 412, P50: 101.888, P99: 402.432, Errors: 2,
				Note: "a new QUIC connection per request: 98% of the 4122 handshakes resumed a session, key exchange X25519"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := mustRead(t, tt.file)
			var log []byte
			if tt.h2log != "" {
				log = mustRead(t, tt.h2log)
			}
			got, err := parseLoad(tt.tool, out, log)
			if err != nil {
				t.Fatal(err)
			}
			if !closeLoad(got, tt.want) {
				t.Errorf("parseLoad(%s, %s) = %+v, want %+v", tt.tool, tt.file, got, tt.want)
			}
		})
	}
	if _, err := parseLoad("ab", nil, nil); err == nil {
		t.Error("parseLoad(ab) = nil error, want an unknown tool refused")
	}
}

func closeLoad(a, b Load) bool {
	near := func(x, y float64) bool { return x-y < 1e-9 && y-x < 1e-9 }
	return a.Requests == b.Requests && a.Errors == b.Errors && near(a.RPS, b.RPS) && near(a.P50, b.P50) && near(a.P99, b.P99) && a.Note == b.Note &&
		a.ReadBytes == b.ReadBytes
}

func TestH3loadErrorsIncludeNon2xx(t *testing.T) {
	got := parseH3load([]byte("h3load ...\n{\"requests\":10,\"errors\":2,\"non2xx\":3,\"rps\":5,\"p50_ms\":1,\"p99_ms\":2}\n"))
	if got.Errors != 5 || got.Requests != 10 {
		t.Errorf("parseH3load = %+v, want errors 2+3 and requests 10", got)
	}
}

func TestToMs(t *testing.T) {
	tests := []struct {
		in   string
		want float64
	}{
		{"812.00us", 0.812}, {"1.20ms", 1.2}, {"2.01s", 2010}, {"1.50m", 90000}, {"-", 0}, {"", 0},
	}
	for _, tt := range tests {
		if got := toMs(tt.in); got-tt.want > 1e-9 || tt.want-got > 1e-9 {
			t.Errorf("toMs(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestLastWords(t *testing.T) {
	tests := []struct {
		name, file, want string
	}{
		{"wrk's refusal", "wrk-refused.txt", "unable to connect to localhost:19189 Connection refused"},
		{"h2load's last line, not its progress", "h2load-no-h2.txt", "req/s           :       0.00        0.00        0.00        0.00   100.00%"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := lastWords(mustRead(t, tt.file)); got != tt.want {
				t.Errorf("lastWords(%s) = %q, want %q", tt.file, got, tt.want)
			}
		})
	}
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBinaryBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"512.00B": 512, "8.50KB": 8704, "61.44MB": 64424509, "1.02GB": 1095216660, "1.00TB": 1 << 40,
		"": 0, "B": 0, "12": 0, "3.5XB": 0, "-": 0, "1.5KiB": 0,
	} {
		if got := binaryBytes(in); got != want {
			t.Errorf("binaryBytes(%q) = %d, want %d", in, got, want)
		}
	}
}
