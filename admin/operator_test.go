package admin

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/edge"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// TestStatusShowsOperatorRoutes: with an operator file, status.json, the
// page and the routes table say which routes are the operator's, what they
// add, the file's state and the hosts both name.
func TestStatusShowsOperatorRoutes(t *testing.T) {
	f := newStatusFixture(t)
	op := &node.OperatorDocument{V: 1, Routes: []node.OperatorRoute{
		{Host: "shop.example.test", Application: "my-shop", Upstreams: []node.Upstream{{Address: "127.0.0.1:3000"}}},
		{Host: "www.example.test", Redirect: &node.Redirect{To: "https://example.test", Status: 301}},
	}}
	live := &edge.Live{}
	up := testsupport.Must(edge.NewUpdater(live, zerolog.Nop(), nil))
	if err := up.SetOperator(node.OperatorUpdate{Doc: op, Fingerprint: "op"}, nil); err != nil {
		t.Fatal(err)
	}
	up.Apply(node.Update{Doc: &node.Document{V: 1, Routes: []node.Route{
		{Host: "shop.example.test", Application: "shop", Upstreams: []node.Upstream{{Node: "a", Address: "10.0.0.1:1"}}},
		{Host: "go.example.test", Application: "tito-go", Upstreams: []node.Upstream{{Node: "a", Address: "10.0.0.1:2"}}},
	}}, Fingerprint: "doc", FetchedAt: statusT0})
	a := *f.admin
	a.Live = live
	src := a.Source.(*fakeSource)
	st := src.st
	st.Operator = &node.OperatorStatus{File: "/etc/scafo-edge/operator.json", Valid: false,
		LastError: "operator routes /etc/scafo-edge/operator.json:3:7: routes[0].host: bad", Fingerprint: "op", LastChange: statusT0.Add(-time.Minute), Routes: 2}
	a.Source = &fakeSource{st: st}

	rec := serveAdmin(a.Handler(), "/status.json", "127.0.0.1:1", "")
	var v Status
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	sources := map[string]string{}
	for _, r := range v.Routes {
		sources[r.Host] = r.Source + " " + strings.Join(r.Features, ",")
	}
	for h, want := range map[string]string{"shop.example.test": "operator ", "go.example.test": "node ", "www.example.test": "operator redirect 301 https://example.test"} {
		if sources[h] != want {
			t.Errorf("route %s = %q, want %q", h, sources[h], want)
		}
	}
	o := v.Operator
	if o == nil || o.Valid || o.File != "/etc/scafo-edge/operator.json" || !strings.Contains(o.LastError, ":3:7:") ||
		len(o.Conflicts) != 1 || o.Conflicts[0] != (ConflictStatus{Host: "shop.example.test", NodeApplication: "shop", OperatorApplication: "my-shop"}) {
		t.Errorf("status.json operator = %+v", o)
	}

	t.Run("the operator keys of status.json are a contract too", func(t *testing.T) {
		var doc any
		json.Unmarshal(rec.Body.Bytes(), &doc)
		seen := map[string]bool{}
		collectKeys(doc, "", seen)
		for _, k := range []string{"operator", "operator.file", "operator.valid", "operator.last_error", "operator.fingerprint",
			"operator.last_change", "operator.routes", "operator.conflicts", "operator.conflicts.host",
			"operator.conflicts.node_application", "operator.conflicts.operator_application", "routes.source", "routes.features"} {
			if !seen[k] {
				t.Errorf("status.json lacks %s", k)
			}
		}
	})

	page := serveAdmin(a.Handler(), "/", "127.0.0.1:1", "").Body.String()
	for _, want := range []string{"Operator routes", "the file on disk is refused", "shop.example.test</span>: the operator", `<span class="tag">operator</span>`} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}

	var out bytes.Buffer
	writeRoutes(&out, &v, 0)
	for _, want := range []string{"operator    /etc/scafo-edge/operator.json  REFUSED", "conflict", "shop.example.test: operator's my-shop serves it, not the node's shop", "(operator file)", "redirect 301"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("routes output lacks %q:\n%s", want, out.String())
		}
	}
}
