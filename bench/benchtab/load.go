package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Load is what a load generator reports about one measured window.
type Load struct {
	// Requests is the number of complete responses: wrk's "N requests in",
	// h2load's "done", h3load's "requests".
	Requests int64
	RPS      float64
	// P50 and P99 are latencies in milliseconds; zero when the tool gave
	// none.
	P50, P99 float64
	// Errors: wrk's non-2xx/3xx responses plus its socket errors; h2load's
	// failed requests (its "errored" ones included); h3load's errors plus
	// its non-2xx responses.
	Errors int64
	// ReadBytes is what the responses took on the wire, status lines,
	// headers and bodies as sent (compressed or not, chunked or not): wrk's
	// "MB read" (to its two decimals); zero when the tool gave none.
	ReadBytes int64
	// Note, for the row: h3load -close's handshakes, how many resumed and
	// their key exchange.
	Note string
}

// parseLoad reads the output of tool ("wrk", "h2load" or "h3load") from
// out; for h2load, latencies come from its per-request log, h2log.
func parseLoad(tool string, out, h2log []byte) (Load, error) {
	switch tool {
	case "wrk":
		return parseWrk(out), nil
	case "h2load":
		l := parseH2load(out)
		l.P50, l.P99 = h2loadPercentiles(h2log)
		return l, nil
	case "h3load":
		return parseH3load(out), nil
	}
	return Load{}, fmt.Errorf("unknown load tool %q (want wrk, h2load or h3load)", tool)
}

// parseWrk reads wrk --latency output:
//
//	  Latency Distribution
//	     50%  325.00us
//	     99%  120.62ms
//	  56415 requests in 2.06s, 61.44MB read
//	  Socket errors: connect 0, read 12, write 0, timeout 3
//	  Non-2xx or 3xx responses: 28384
//	Requests/sec:  27419.61
//
// "61.44MB read" is in units of 1024 (wrk's format_binary).
func parseWrk(out []byte) Load {
	var l Load
	for _, line := range lines(out) {
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
		case f[0] == "Requests/sec:" && len(f) > 1:
			l.RPS, _ = strconv.ParseFloat(f[1], 64)
		case strings.Contains(line, " requests in "):
			l.Requests, _ = strconv.ParseInt(f[0], 10, 64)
			if len(f) > 5 && f[5] == "read" {
				l.ReadBytes = binaryBytes(f[4])
			}
		case f[0] == "50%" && len(f) > 1:
			l.P50 = toMs(f[1])
		case f[0] == "99%" && len(f) > 1:
			l.P99 = toMs(f[1])
		case strings.HasPrefix(strings.TrimSpace(line), "Non-2xx or 3xx responses:"):
			n, _ := strconv.ParseInt(f[len(f)-1], 10, 64)
			l.Errors += n
		case strings.HasPrefix(strings.TrimSpace(line), "Socket errors:"):
			// connect N, read N, write N, timeout N: every number counts.
			for _, w := range f[2:] {
				n, err := strconv.ParseInt(strings.TrimSuffix(w, ","), 10, 64)
				if err == nil {
					l.Errors += n
				}
			}
		}
	}
	return l
}

// binaryBytes converts a wrk byte count ("512.00B", "61.44MB", "1.02GB",
// units of 1024) to bytes; anything else is 0.
func binaryBytes(v string) int64 {
	scale := 1.0
	for i, u := range []string{"B", "KB", "MB", "GB", "TB", "PB"} {
		if i > 0 {
			scale *= 1024
		}
		num, ok := strings.CutSuffix(v, u)
		if !ok || num == "" || strings.ContainsAny(num[len(num)-1:], "KMGTP") {
			continue
		}
		n, err := strconv.ParseFloat(num, 64)
		if err != nil {
			return 0
		}
		return int64(math.Round(n * scale))
	}
	return 0
}

// toMs converts a wrk latency ("812.00us", "1.20ms", "2.01s", "1.50m") to
// milliseconds; anything else ("-") is 0.
func toMs(v string) float64 {
	i := strings.IndexFunc(v, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := v, ""
	if i >= 0 {
		num, unit = v[:i], v[i:]
	}
	n, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0
	}
	switch unit {
	case "us":
		return n / 1000
	case "s":
		return n * 1000
	case "m":
		return n * 60000
	}
	return n
}

// parseH2load reads h2load's summary:
//
//	finished in 3.00s, 15000.00 req/s, 16.03MB/s
//	requests: 45000 total, 45000 started, 45000 done, 45000 succeeded, 0 failed, 0 errored, 0 timeout
//
// "failed" includes the "errored" (below HTTP) ones and non-2xx/3xx.
func parseH2load(out []byte) Load {
	var l Load
	for _, line := range lines(out) {
		f := strings.Fields(line)
		switch {
		case len(f) > 3 && f[0] == "finished" && f[1] == "in":
			l.RPS, _ = strconv.ParseFloat(f[3], 64)
		case len(f) > 0 && f[0] == "requests:":
			for i := 1; i+1 < len(f); i++ {
				n, err := strconv.ParseInt(f[i], 10, 64)
				if err != nil {
					continue
				}
				switch strings.TrimSuffix(f[i+1], ",") {
				case "done":
					l.Requests = n
				case "failed":
					l.Errors = n
				}
			}
		}
	}
	return l
}

// h2loadPercentiles reads h2load's --log-file (tab-separated: start time,
// status, µs from the request's start to the end of its response, ...) and
// returns p50 and p99 in milliseconds, by rank (the ⌊(n-1)·q⌋-th smallest),
// since h2load prints only min/max/mean/sd.
func h2loadPercentiles(log []byte) (p50, p99 float64) {
	var us []float64
	for _, line := range lines(log) {
		f := strings.Split(line, "\t")
		if len(f) < 3 {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(f[2]), 64); err == nil {
			us = append(us, v)
		}
	}
	if len(us) == 0 {
		return 0, 0
	}
	slices.Sort(us)
	at := func(q float64) float64 { return us[int(float64(len(us)-1)*q)] / 1000 }
	return at(0.50), at(0.99)
}

// parseH3load reads the JSON object bench/h3load -json prints as its last
// line. "requests" counts complete responses whatever their status, so
// errors are its errors plus its non-2xx; its latencies are already in ms.
func parseH3load(out []byte) Load {
	var r struct {
		Requests int64   `json:"requests"`
		Errors   int64   `json:"errors"`
		Non2xx   int64   `json:"non2xx"`
		RPS      float64 `json:"rps"`
		P50      float64 `json:"p50_ms"`
		P99      float64 `json:"p99_ms"`
		NewConns *struct {
			Handshakes  int64  `json:"handshakes"`
			Resumed     int64  `json:"resumed"`
			KeyExchange string `json:"key_exchange"`
		} `json:"new_connections"`
	}
	ls := lines(out)
	for i := len(ls) - 1; i >= 0; i-- {
		if strings.HasPrefix(ls[i], "{") {
			if json.Unmarshal([]byte(ls[i]), &r) == nil {
				break
			}
		}
	}
	l := Load{Requests: r.Requests, RPS: r.RPS, P50: r.P50, P99: r.P99, Errors: r.Errors + r.Non2xx}
	if nc := r.NewConns; nc != nil && nc.Handshakes > 0 {
		// What a new-connection cell measured: full handshakes or resumed
		// ones, and with which key exchange.
		l.Note = fmt.Sprintf("a new QUIC connection per request: %.0f%% of the %d handshakes resumed a session, key exchange %s",
			100*float64(nc.Resumed)/float64(nc.Handshakes), nc.Handshakes, nc.KeyExchange)
	}
	return l
}

// lastWords is the last line of out worth quoting when a tool measured
// nothing: not blank, not h2load's "progress:" lines; at most 200 bytes.
func lastWords(out []byte) string {
	ls := lines(out)
	for i := len(ls) - 1; i >= 0; i-- {
		s := strings.TrimSpace(ls[i])
		if s == "" || strings.HasPrefix(strings.ToLower(s), "progress") {
			continue
		}
		if len(s) > 200 {
			s = s[:200]
		}
		return s
	}
	return ""
}

func lines(b []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// readOptional reads path, or returns nil when path is empty or unreadable.
func readOptional(path string) []byte {
	if path == "" {
		return nil
	}
	b, _ := os.ReadFile(path)
	return b
}
