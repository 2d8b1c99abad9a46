package node_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/scafo/scafo-edge/node"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// run starts src.Run in a goroutine and returns the channel apply feeds;
// the test's cleanup stops it and waits for Run to return.
func run(t *testing.T, src node.Source, seed *node.Update) <-chan node.Update {
	t.Helper()
	updates := make(chan node.Update, 100)
	runApply(t, src, seed, func(u node.Update) { updates <- u })
	return updates
}

// runApply starts src.Run with apply in a goroutine; the test's cleanup
// stops it and waits for Run to return.
func runApply(t *testing.T, src node.Source, seed *node.Update, apply func(node.Update)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		src.Run(ctx, seed, apply)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
}

// next waits for one update.
func next(t *testing.T, updates <-chan node.Update) node.Update {
	t.Helper()
	select {
	case u := <-updates:
		return u
	case <-time.After(10 * time.Second):
		t.Fatal("no document was applied within 10s")
		return node.Update{}
	}
}

// none fails if an update is waiting.
func none(t *testing.T, updates <-chan node.Update) {
	t.Helper()
	select {
	case u := <-updates:
		t.Fatalf("a document was applied (fingerprint %.12s), want none", u.Fingerprint)
	default:
	}
}

func testDoc(hosts ...string) *node.Document {
	d := &node.Document{V: 1, Routes: []node.Route{}}
	for _, h := range hosts {
		d.Routes = append(d.Routes, node.Route{
			Host: h, Application: strings.Split(h, ".")[0],
			Upstreams: []node.Upstream{
				{Node: "vps-a", Address: "10.83.0.1:24417"},
				{Node: "vps-b", Address: "10.83.0.2:24902"},
				{Node: "vps-c", Address: "10.83.0.3:24000"},
			},
		})
	}
	d.API = &node.API{
		Hosts:     []string{"apps.example.com"},
		Upstreams: []node.Upstream{{Node: "vps-a", Address: "10.83.0.1:7400"}, {Node: "vps-b", Address: "10.83.0.2:7400"}},
		Denied:    []string{"/v1/storage", "/v1/ingress/routes"},
	}
	return d
}

func hosts(d *node.Document) []string {
	var out []string
	for _, r := range d.Routes {
		out = append(out, r.Host)
	}
	return out
}

func nodes(ups []node.Upstream) []string {
	var out []string
	for _, u := range ups {
		out = append(out, u.Node)
	}
	return out
}

// zeroLog is the zero logger, which logs nothing.
func zeroLog() zerolog.Logger { return zerolog.Logger{} }
