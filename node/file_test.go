package node_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// writeFile replaces path atomically, as an operator's tooling should.
func writeFile(t *testing.T, path string, body []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, body, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func mustJSON(t *testing.T, d *node.Document) []byte {
	t.Helper()
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFileSource(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.json")
	writeFile(t, path, mustJSON(t, testDoc("a.example")))
	logs := &testsupport.SyncBuffer{}
	reg := prometheus.NewPedanticRegistry()
	fs, err := node.NewFileSource(node.FileSourceOptions{Path: path, Interval: interval, Log: zerolog.New(logs), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	updates := run(t, fs, nil)
	polls := func() int {
		v, _ := testsupport.MetricValue(t, reg, "scafo_edge_routing_polls_total", testsupport.Labels{"result": "unchanged"})
		return int(v)
	}

	u := next(t, updates)
	if !slices.Equal(hosts(u.Doc), []string{"a.example"}) || u.Stale {
		t.Fatalf("first update hosts = %v, stale %v", hosts(u.Doc), u.Stale)
	}
	if st := fs.Status(); st.Source != "file "+path {
		t.Errorf("status source = %q", st.Source)
	}

	t.Run("an unchanged file is not applied again", func(t *testing.T) {
		testsupport.WaitFor(t, 10*time.Second, "unchanged polls", func() bool { return polls() >= 3 })
		none(t, updates)
	})
	t.Run("a changed file is applied", func(t *testing.T) {
		writeFile(t, path, mustJSON(t, testDoc("a.example", "b.example")))
		u := next(t, updates)
		if !slices.Equal(hosts(u.Doc), []string{"a.example", "b.example"}) {
			t.Errorf("hosts = %v", hosts(u.Doc))
		}
	})
	good := fs.Status().Fingerprint
	for _, tc := range []struct {
		name, errContain string
		fail             func()
	}{
		{"a half-written file keeps the last good document", "decode json", func() { writeFile(t, path, []byte(`{"v":1,"routes":[{"ho`)) }},
		{"an invalid document keeps the last good document", "v is 3", func() { writeFile(t, path, []byte(`{"v":3,"routes":[]}`)) }},
		{"a removed file keeps the last good document", "no such file", func() { os.Remove(path) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.fail()
			testsupport.WaitFor(t, 10*time.Second, "failed polls", func() bool { return fs.Status().ConsecutiveFailures >= 3 })
			none(t, updates)
			st := fs.Status()
			if st.Fingerprint != good || !strings.Contains(st.LastError, tc.errContain) {
				t.Errorf("status = %+v, want fingerprint %.12s kept and an error containing %q", st, good, tc.errContain)
			}
			if n := len(logs.LogEntries("poll failed")); n != 1 {
				t.Errorf("%d failure lines, want 1:\n%s", n, logs)
			}

			writeFile(t, path, mustJSON(t, testDoc("a.example", "b.example")))
			testsupport.WaitFor(t, 10*time.Second, "recovery", func() bool { return fs.Status().ConsecutiveFailures == 0 })
			none(t, updates) // the same document as before the failure: nothing to apply
			if n := len(logs.LogEntries("recovered")); n != 1 {
				t.Errorf("%d recovery lines, want 1:\n%s", n, logs)
			}
			logs.Reset()
		})
	}
}

func TestFileSourceStartsWithoutTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.json")
	fs, err := node.NewFileSource(node.FileSourceOptions{Path: path, Interval: interval, Log: zeroLog()})
	if err != nil {
		t.Fatal(err)
	}
	updates := run(t, fs, nil)
	testsupport.WaitFor(t, 10*time.Second, "failed polls", func() bool { return fs.Status().ConsecutiveFailures >= 2 })
	none(t, updates)
	writeFile(t, path, mustJSON(t, testDoc("a.example")))
	next(t, updates)
}
