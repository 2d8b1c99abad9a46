package edge

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// droppedTotal reads scafo_edge_access_log_dropped_total from reg.
func droppedTotal(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	v, ok := testsupport.MetricValue(t, reg, "scafo_edge_access_log_dropped_total", nil)
	if !ok {
		t.Fatal("scafo_edge_access_log_dropped_total not registered")
	}
	return v
}

// lines decodes the JSON lines written to buf.
func lines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		m := map[string]any{}
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("access log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	buf.Reset()
	return out
}

func TestAccessLogRateLimit(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := func(at time.Time) *Record {
		return &Record{Start: at, Duration: time.Millisecond, Method: "GET", Host: "a", Path: "/", Status: 200}
	}

	t.Run("at most the limit is written in one second and the rest is counted", func(t *testing.T) {
		var buf bytes.Buffer
		reg := prometheus.NewRegistry()
		a := testsupport.Must(NewAccessLog(zerolog.New(&buf), 3, reg))
		for i := 0; i < 5; i++ {
			a.Observe(rec(t0.Add(time.Duration(i) * 100 * time.Millisecond)))
		}
		if got := len(lines(t, &buf)); got != 3 {
			t.Errorf("lines written = %d, want 3", got)
		}
		if got := droppedTotal(t, reg); got != 2 {
			t.Errorf("dropped_total = %v, want 2", got)
		}
	})

	t.Run("the next second writes again and its first line tells the drops", func(t *testing.T) {
		var buf bytes.Buffer
		reg := prometheus.NewRegistry()
		a := testsupport.Must(NewAccessLog(zerolog.New(&buf), 1, reg))
		for i := 0; i < 4; i++ {
			a.Observe(rec(t0))
		}
		lines(t, &buf)
		a.Observe(rec(t0.Add(time.Second)))
		a.Observe(rec(t0.Add(time.Second)))
		got := lines(t, &buf)
		if len(got) != 1 || got[0]["lines_dropped_before"] != float64(3) {
			t.Errorf("lines = %v, want one with lines_dropped_before 3", got)
		}
		if d := droppedTotal(t, reg); d != 4 {
			t.Errorf("dropped_total = %v, want 4", d)
		}
	})

	t.Run("a request ending before the counted second joins it", func(t *testing.T) {
		var buf bytes.Buffer
		a := testsupport.Must(NewAccessLog(zerolog.New(&buf), 1, nil))
		a.Observe(rec(t0.Add(time.Second)))
		a.Observe(rec(t0)) // finished a moment earlier, observed later
		a.Observe(rec(t0.Add(time.Second)))
		if got := len(lines(t, &buf)); got != 1 {
			t.Errorf("lines written = %d, want 1: the window must not move back", got)
		}
	})

	t.Run("no limit writes every line", func(t *testing.T) {
		var buf bytes.Buffer
		a := testsupport.Must(NewAccessLog(zerolog.New(&buf), 0, nil))
		for i := 0; i < 50; i++ {
			a.Observe(rec(t0))
		}
		if got := len(lines(t, &buf)); got != 50 {
			t.Errorf("lines written = %d, want 50", got)
		}
	})

	t.Run("concurrent requests never write more than the limit in a second", func(t *testing.T) {
		var buf testsupport.SyncBuffer
		reg := prometheus.NewRegistry()
		a := testsupport.Must(NewAccessLog(zerolog.New(&buf), 10, reg))
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 100; i++ {
					a.Observe(rec(t0))
				}
			}()
		}
		wg.Wait()
		written := strings.Count(buf.String(), "\n")
		if written != 10 {
			t.Errorf("lines written = %d, want 10", written)
		}
		if d := droppedTotal(t, reg); d != float64(800-written) {
			t.Errorf("dropped_total = %v, want %d", d, 800-written)
		}
	})
}
