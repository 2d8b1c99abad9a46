package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// runRoutes runs PrintRoutes with o, and a timeout when o has none, and
// returns its output.
func runRoutes(t *testing.T, o RoutesOptions) (string, error) {
	t.Helper()
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	var out bytes.Buffer
	err := PrintRoutes(context.Background(), o, &out)
	return out.String(), err
}

func TestPrintRoutes(t *testing.T) {
	long := "a-rather-long-application-host-name.customers.example.test"
	f := newStatusFixture(t, node.Route{Host: long, Application: "a-long-application-name",
		Upstreams: []node.Upstream{{Node: "node-with-a-long-name-17", Address: "[2001:db8:1234::17]:31000"}}})
	// The admin server as a remote client sees it: the handler is told
	// the request came from off loopback, so the token matters.
	remote := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.RemoteAddr = "203.0.113.9:40000"
		f.admin.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(remote.Close)
	local := httptest.NewServer(f.admin.Handler())
	t.Cleanup(local.Close)

	out, err := runRoutes(t, RoutesOptions{Admin: local.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("routes output:\n%s", out)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")

	t.Run("every line fits 80 columns", func(t *testing.T) {
		for _, l := range lines {
			if n := utf8.RuneCountInString(l); n > 80 {
				t.Errorf("line of %d columns: %q", n, l)
			}
		}
	})
	t.Run("path rows are indented under their host", func(t *testing.T) {
		idx := func(prefix string) int {
			for i, l := range lines {
				if strings.HasPrefix(l, prefix) {
					return i
				}
			}
			return -1
		}
		host, beta, paulca, next := idx("classic.example.test "), idx("  /beta "), idx("  /paulca "), idx("go.example.test ")
		if host < 0 || !(host < beta && beta < paulca && paulca < next) {
			t.Errorf("line numbers host=%d /beta=%d /paulca=%d next=%d, want increasing", host, beta, paulca, next)
		}
		if l := lines[paulca]; !strings.Contains(l, "tito-go") || !strings.Contains(l, "-> go.example.test") {
			t.Errorf("path row %q lacks the target and its application", l)
		}
	})
	t.Run("upstreams are numbered in priority order with health, aligned in one column", func(t *testing.T) {
		var first, second string
		for i, l := range lines {
			if strings.HasPrefix(l, "shop.example.test ") {
				first, second = l, lines[i+1]
			}
		}
		c1, c2 := strings.Index(first, "1 box-down "+f.deadAddr), strings.Index(second, "2 box-a "+f.liveAddr)
		if c1 < 0 || c1 != c2 {
			t.Errorf("upstream rows not aligned in priority order:\n%s\n%s", first, second)
		}
		if !strings.HasSuffix(first, "ejected") || !strings.HasSuffix(second, "ok") {
			t.Errorf("health missing:\n%s\n%s", first, second)
		}
	})
	t.Run("the header gives document, source and poll state", func(t *testing.T) {
		for _, want := range []string{"document    9f86d081884c  fresh", "(1m30s ago)", "5 routes, 2 path prefixes, 2 API hosts",
			"source      node http://127.0.0.1:7400", "success 7s ago, 1 consecutive failure", "last error  poll: connection refused"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q", want)
			}
		}
	})
	t.Run("API hosts list their denied prefixes", func(t *testing.T) {
		for _, want := range []string{"api.example.test", "platform.example.test", "  denied /v1/storage", "  denied /v1/secrets"} {
			if !strings.Contains(out, "\n"+want) {
				t.Errorf("output lacks a line starting %q", want)
			}
		}
	})
	t.Run("a long host keeps its row readable", func(t *testing.T) {
		if !strings.Contains(out, "\n"+long+"\n") {
			t.Errorf("the long host is not on a line of its own")
		}
	})
	t.Run("MaxPaths limits the prefix rows and says how many are left", func(t *testing.T) {
		out, err := runRoutes(t, RoutesOptions{Admin: local.URL, MaxPaths: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "  /beta ") || strings.Contains(out, "  /paulca ") || !strings.Contains(out, "  ... 1 more prefix") {
			t.Errorf("MaxPaths 1 output:\n%s", out)
		}
	})
	t.Run("JSON prints status.json for scripts", func(t *testing.T) {
		out, err := runRoutes(t, RoutesOptions{Admin: local.URL, JSON: true})
		if err != nil {
			t.Fatal(err)
		}
		var v Status
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("JSON output is not JSON: %v", err)
		}
		if len(v.Routes) != 5 || v.Routes[2].Paths[1].Prefix != "paulca" {
			t.Errorf("JSON routes = %+v", v.Routes)
		}
	})
	t.Run("off loopback without a token it fails saying a token is needed", func(t *testing.T) {
		_, err := runRoutes(t, RoutesOptions{Admin: remote.URL})
		if err == nil || !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), "token") {
			t.Errorf("err = %v, want a 403 that mentions the token", err)
		}
	})
	t.Run("off loopback the token is sent as a bearer token", func(t *testing.T) {
		if _, err := runRoutes(t, RoutesOptions{Admin: remote.URL, Token: statusToken}); err != nil {
			t.Error(err)
		}
	})
	t.Run("an edge that is not there is an error naming the URL", func(t *testing.T) {
		addr := testsupport.ClosedAddr(t)
		_, err := runRoutes(t, RoutesOptions{Admin: addr})
		if err == nil || !strings.Contains(err.Error(), "http://"+addr+"/status.json") {
			t.Errorf("err = %v", err)
		}
	})
}

func TestRoutesTableWrapsCellsThatDoNotFit(t *testing.T) {
	cases := []struct {
		name string
		rows [][]string
		want string
	}{
		{
			"short cells align in columns",
			[][]string{{"H", "APP", "UP"}, {"a.test", "x", "1 n 10.0.0.1:1"}},
			"H       APP  UP\na.test  x    1 n 10.0.0.1:1\n",
		},
		{
			"a cell longer than its cap pushes the rest of the row to the next line",
			[][]string{{"H", "APP", "UP"}, {"a-very-long-host.test", "x", "u"}},
			"H           APP  UP\na-very-long-host.test\n            x    u\n",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tt := &textTable{caps: []int{10, 5, 20}}
			for _, r := range tc.rows {
				tt.row(r...)
			}
			var b strings.Builder
			tt.write(&b)
			if b.String() != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", b.String(), tc.want)
			}
		})
	}
}
