package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// The edge's admin listener and the applications' control listeners.

var shortClient = &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func healthz(base string) bool {
	resp, err := shortClient.Get(base + "/healthz")
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func scrape(base string) (map[string]float64, error) {
	resp, err := shortClient.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	m, err := ParseMetrics(resp.Body, "go_goroutines", "process_open_fds", "scafo_edge_accept_pauses_total")
	if err == nil && len(m) < 2 {
		err = errors.New("no go_goroutines or process_open_fds in /metrics")
	}
	return m, err
}

// controlClient: the upstream processes' control listeners are never
// loaded, but a generous timeout still bounds every call.
var controlClient = &http.Client{Timeout: 5 * time.Second}

func appCall(control []string, path string) (Stats, error) {
	var sum Stats
	var errs []error
	for _, a := range control {
		resp, err := controlClient.Get("http://" + a + path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var s Stats
		err = json.NewDecoder(resp.Body).Decode(&s)
		resp.Body.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sum.Held += s.Held
		sum.PeakHeld += s.PeakHeld
		sum.Slow += s.Slow
		sum.Answered += s.Answered
		sum.Fast += s.Fast
	}
	return sum, errors.Join(errs...)
}

func appStats(control []string) (Stats, error) { return appCall(control, "/stats") }

func appRelease(control []string) error { _, err := appCall(control, "/release"); return err }
