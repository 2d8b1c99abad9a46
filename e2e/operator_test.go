package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/admin"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

// writeOperatorFile replaces path atomically, as an editor's save or a
// config tool should.
func writeOperatorFile(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// operatorFile is an operator's file: its own Grafana on a host the node
// also names (a conflict), a tool of its own, and a www redirect.
func operatorFile(grafana, tool string) string {
	return fmt.Sprintf(`{
  "v": 1,
  "routes": [
    {"host": "b.example", "application": "grafana", "upstreams": [{"address": %q}]},
    {"host": "tool.example", "upstreams": [{"address": %q}]},
    {"host": "www.example", "redirect": {"to": "https://a.example", "status": 308, "keep_path": true}}
  ]
}
`, grafana, tool)
}

func TestOperatorRoutes(t *testing.T) {
	a, b, g, tool, tool2 := app(t, "A"), app(t, "B"), app(t, "GRAFANA"), app(t, "TOOL"), app(t, "TOOL2")
	n := nodetest.New(t, nodetest.Options{Token: "tok"})
	n.SetDocument(routesDoc(hostOf(a), hostOf(b)))
	opPath := filepath.Join(t.TempDir(), "operator.json")
	writeOperatorFile(t, opPath, operatorFile(hostOf(g), hostOf(tool)))
	e := startEdge(t, "--node", n.URL(), "--ingress-token", "tok", "--tls", "off", "--operator-routes", opPath)

	testsupport.WaitForNil(t, 15*time.Second, "the first document", func() error {
		if code, body := e.get(t, "a.example", "/x"); code != 200 || !strings.HasPrefix(body, "A /x") {
			return fmt.Errorf("a.example: %d %q", code, body)
		}
		return nil
	})

	t.Run("node routes and operator routes are served side by side", func(t *testing.T) {
		if code, body := e.get(t, "tool.example", "/t"); code != 200 || !strings.HasPrefix(body, "TOOL /t") {
			t.Errorf("tool.example = %d %q, want the operator's tool", code, body)
		}
		req, _ := http.NewRequest("GET", "http://"+e.HTTPAddr+"/p/q?x=1", nil)
		req.Host = "www.example"
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 308 || resp.Header.Get("Location") != "https://a.example/p/q?x=1" {
			t.Errorf("www.example = %d Location %q, want 308 to https://a.example/p/q?x=1", resp.StatusCode, resp.Header.Get("Location"))
		}
	})
	t.Run("a host both name answers from the operator's upstream and is counted", func(t *testing.T) {
		if code, body := e.get(t, "b.example", "/d"); code != 200 || !strings.HasPrefix(body, "GRAFANA /d") {
			t.Errorf("b.example = %d %q, want the operator's Grafana", code, body)
		}
		if v := e.metric(t, "scafo_edge_operator_route_conflicts", nil); v != 1 {
			t.Errorf("scafo_edge_operator_route_conflicts = %v, want 1", v)
		}
		if e.countLogs("host named by both the node's document and the operator routes file; the operator's route serves it") < 1 {
			t.Error("the conflict was not logged")
		}
	})
	t.Run("the status and the routes command say where each route came from", func(t *testing.T) {
		code, body := e.admin(t, "/status.json")
		if code != 200 {
			t.Fatalf("/status.json = %d", code)
		}
		var v admin.Status
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatal(err)
		}
		sources := map[string]string{}
		for _, r := range v.Routes {
			sources[r.Host] = r.Source
		}
		want := map[string]string{"a.example": "node", "b.example": "operator", "tool.example": "operator", "www.example": "operator"}
		for h, s := range want {
			if sources[h] != s {
				t.Errorf("status.json route %s source = %q, want %q (all: %v)", h, sources[h], s, sources)
			}
		}
		if v.Operator == nil || !v.Operator.Valid || len(v.Operator.Conflicts) != 1 || v.Operator.Conflicts[0].NodeApplication != "app-b" {
			t.Errorf("status.json operator = %+v, want valid with the b.example conflict", v.Operator)
		}
		out, err := runRoutes(t, "--admin", e.AdminAddr)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"operator", "(operator file)", "conflict", "b.example: operator's grafana serves it, not the node's app-b", "redirect 308 https://a.example"} {
			if !strings.Contains(out, s) {
				t.Errorf("routes output lacks %q:\n%s", s, out)
			}
		}
	})
	t.Run("the node's document cannot take an operator host back", func(t *testing.T) {
		doc := routesDoc(hostOf(a), hostOf(b))
		doc.Routes = append(doc.Routes, node.Route{Host: "tool.example", Application: "node-tool", Upstreams: []node.Upstream{{Node: "n1", Address: hostOf(a)}}})
		n.SetDocument(doc)
		testsupport.WaitFor(t, 15*time.Second, "two conflicts counted", func() bool {
			return e.metric(t, "scafo_edge_operator_route_conflicts", nil) == 2
		})
		if code, body := e.get(t, "tool.example", "/"); code != 200 || !strings.HasPrefix(body, "TOOL ") {
			t.Errorf("tool.example = %d %q, want still the operator's", code, body)
		}
	})
	t.Run("an edit is live within a couple of seconds", func(t *testing.T) {
		writeOperatorFile(t, opPath, operatorFile(hostOf(g), hostOf(tool2)))
		start := time.Now()
		testsupport.WaitForNil(t, 15*time.Second, "the edit served", func() error {
			if _, body := e.get(t, "tool.example", "/"); !strings.HasPrefix(body, "TOOL2 ") {
				return fmt.Errorf("tool.example = %q", body)
			}
			return nil
		})
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("the edit took %s to be served, want a couple of seconds", d)
		}
	})
	t.Run("a broken edit keeps the last good file", func(t *testing.T) {
		writeOperatorFile(t, opPath, "{\"v\": 1,\n  \"routes\": [\n    {\"host\": \"tool.example\", \"upstreams\": [{\"address\": \"nowhere\"}]}\n  ]\n}\n")
		testsupport.WaitFor(t, 15*time.Second, "the broken file refused", func() bool {
			return e.metric(t, "scafo_edge_operator_routes_valid", nil) == 0
		})
		if _, body := e.get(t, "tool.example", "/"); !strings.HasPrefix(body, "TOOL2 ") {
			t.Errorf("tool.example = %q, want the last good file's TOOL2", body)
		}
		_, body := e.admin(t, "/status.json")
		var v admin.Status
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatal(err)
		}
		if v.Operator == nil || v.Operator.Valid || !strings.Contains(v.Operator.LastError, opPath+":3:") {
			t.Errorf("status.json operator = %+v, want invalid naming %s:3", v.Operator, opPath)
		}
		if n := e.countLogs("operator routes file refused; keeping the last good one"); n != 1 {
			t.Errorf("refusal logged %d times, want once", n)
		}
	})
	t.Run("the fix is served and the recovery logged once", func(t *testing.T) {
		writeOperatorFile(t, opPath, operatorFile(hostOf(g), hostOf(tool)))
		testsupport.WaitForNil(t, 15*time.Second, "the fix served", func() error {
			if _, body := e.get(t, "tool.example", "/"); !strings.HasPrefix(body, "TOOL ") {
				return fmt.Errorf("tool.example = %q", body)
			}
			return nil
		})
		if v := e.metric(t, "scafo_edge_operator_routes_valid", nil); v != 1 {
			t.Errorf("scafo_edge_operator_routes_valid = %v, want 1", v)
		}
		if n := e.countLogs("operator routes file is good again"); n != 1 {
			t.Errorf("recovery logged %d times, want once", n)
		}
	})
}

func TestOperatorRoutesBrokenAtStart(t *testing.T) {
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.json")
	body, _ := json.Marshal(routesDoc("127.0.0.1:1", "127.0.0.1:2"))
	if err := os.WriteFile(routes, body, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"malformed JSON", "{\n  \"v\": 1,\n  \"routes\": [\n    {\"host\": \"a.example\",, }\n  ]\n}\n", []string{":4:", "invalid character"}},
		{"a bad field", "{\n  \"v\": 1,\n  \"routes\": [\n    {\"host\": \"a.example\",\n     \"upstreams\": [{\"address\": \"127.0.0.1\"}]}\n  ]\n}\n",
			[]string{":5:", "routes[0].upstreams[0].address", "missing port"}},
		{"an unknown field", "{\"v\": 1,\n\"routes\": [{\"host\": \"a.example\", \"upstreams\": [{\"address\": \"127.0.0.1:1\"}],\n\"basic_aut\": {}}]}",
			[]string{":3:", "routes[0].basic_aut", `unknown field "basic_aut"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			op := filepath.Join(dir, "operator.json")
			if err := os.WriteFile(op, []byte(tc.file), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, edgeBinary, "serve", "--routes-file", routes, "--operator-routes", op, "--tls", "off",
				"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--state-dir", t.TempDir())
			out, err := cmd.CombinedOutput()
			if err == nil || cmd.ProcessState.ExitCode() == 0 {
				t.Fatalf("scafo-edge started with a broken operator file:\n%s", out)
			}
			if !strings.Contains(string(out), "operator routes "+op) {
				t.Errorf("output does not name the file %s:\n%s", op, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), op+w) && !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if !strings.Contains(string(out), op+tc.want[0]) {
				t.Errorf("output does not give %s%s (file:line):\n%s", op, tc.want[0], out)
			}
		})
	}
}
