package nodetest_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type answer struct {
	status int
	header http.Header
	body   []byte
	doc    *node.Document
}

// get fetches the routes with the given query, token and If-None-Match.
func get(t *testing.T, n *nodetest.Node, query, token, inm string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, n.URL()+node.RoutesPath+query, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if inm != "" {
		req.Header.Set("If-None-Match", inm)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", query, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, body: body}
	if resp.StatusCode == http.StatusOK {
		a.doc, _ = node.Parse(body)
	}
	return a
}

func doc() *node.Document {
	ups := []node.Upstream{
		{Node: "vps-a", Address: "10.0.0.1:1"},
		{Node: "vps-b", Address: "10.0.0.2:1"},
		{Node: "vps-c", Address: "10.0.0.3:1"},
		{Node: "vps-b", Address: "10.0.0.2:2"},
	}
	return &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: ups},
		{Host: "b.example", Application: "b", Upstreams: ups[:1]},
	}, API: &node.API{Hosts: []string{"example"}, Upstreams: ups[:2], Denied: []string{"/v1/storage"}}}
}

func addrs(ups []node.Upstream) string {
	var s []string
	for _, u := range ups {
		s = append(s, u.Address)
	}
	return strings.Join(s, " ")
}

func TestNodeDrainsUntilItsFirstPass(t *testing.T) {
	n := nodetest.New(t, nodetest.Options{})
	a := get(t, n, "", "", "")
	if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" || !strings.Contains(string(a.body), "draining") {
		t.Errorf("before the first pass: %d %v %s, want 503 draining with Retry-After", a.status, a.header, a.body)
	}
	n.SetDocument(doc())
	if a := get(t, n, "", "", ""); a.status != http.StatusOK || a.doc == nil {
		t.Errorf("after the first pass: %d %s", a.status, a.body)
	}
	n.SetDraining(true)
	if a := get(t, n, "", "", ""); a.status != http.StatusServiceUnavailable {
		t.Errorf("draining switched on: %d, want 503", a.status)
	}
}

func TestNodeRequiresItsToken(t *testing.T) {
	n := nodetest.New(t, nodetest.Options{Token: "tok"})
	n.SetDocument(doc())
	for _, tc := range []struct {
		name, token string
		want        int
	}{
		{"no token is refused", "", 401},
		{"a wrong token is refused", "nope", 401},
		{"the token is accepted", "tok", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if a := get(t, n, "", tc.token, ""); a.status != tc.want {
				t.Errorf("status = %d, want %d", a.status, tc.want)
			}
		})
	}
	if got := n.LastRequest().Header.Get("Authorization"); got != "Bearer tok" {
		t.Errorf("last Authorization = %q", got)
	}
	if n.Requests() != 3 {
		t.Errorf("requests = %d, want 3", n.Requests())
	}
}

func TestNodeReordersByPrefer(t *testing.T) {
	n := nodetest.New(t, nodetest.Options{ID: "vps-b"})
	n.SetDocument(doc())
	fleet := "10.0.0.1:1 10.0.0.2:1 10.0.0.3:1 10.0.0.2:2"
	for _, tc := range []struct {
		name, query string
		route, api  string
	}{
		{"no prefer keeps the fleet's order", "", fleet, "10.0.0.1:1 10.0.0.2:1"},
		{"prefer=self puts this node's upstreams first, in order", "?prefer=self", "10.0.0.2:1 10.0.0.2:2 10.0.0.1:1 10.0.0.3:1", "10.0.0.2:1 10.0.0.1:1"},
		{"prefer=<id> puts that node first", "?prefer=vps-c", "10.0.0.3:1 10.0.0.1:1 10.0.0.2:1 10.0.0.2:2", "10.0.0.1:1 10.0.0.2:1"},
		{"an id nobody matches has no effect", "?prefer=vps-z", fleet, "10.0.0.1:1 10.0.0.2:1"},
		{"an empty prefer has no effect", "?prefer=", fleet, "10.0.0.1:1 10.0.0.2:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := get(t, n, tc.query, "", "")
			if a.doc == nil {
				t.Fatalf("status %d body %s", a.status, a.body)
			}
			if got := addrs(a.doc.Routes[0].Upstreams); got != tc.route {
				t.Errorf("route upstreams = %s, want %s", got, tc.route)
			}
			if got := addrs(a.doc.API.Upstreams); got != tc.api {
				t.Errorf("api upstreams = %s, want %s", got, tc.api)
			}
		})
	}
	if got := addrs(doc().Routes[0].Upstreams); got != fleet {
		t.Errorf("SetDocument's argument was reordered in place: %s", got)
	}
}

func TestNodeETag(t *testing.T) {
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(doc())
	a := get(t, n, "", "", "")
	etag := a.header.Get("ETag")
	if want := `"` + node.Fingerprint(a.body) + `"`; etag != want {
		t.Fatalf("ETag = %q, want the quoted fingerprint %q", etag, want)
	}
	for _, tc := range []struct {
		name, inm string
		want      int
	}{
		{"the current ETag is not modified", etag, 304},
		{"a weak match is not modified", "W/" + etag, 304},
		{"a list containing it is not modified", `"x", ` + etag, 304},
		{"another ETag gets the document", `"other"`, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if a := get(t, n, "", "", tc.inm); a.status != tc.want {
				t.Errorf("status = %d, want %d", a.status, tc.want)
			}
		})
	}
	if a := get(t, n, "?prefer=vps-c", "", etag); a.status != 200 {
		t.Errorf("another order is another body: status %d, want 200", a.status)
	}
	n.SetETag(false)
	if a := get(t, n, "", "", etag); a.status != 200 || a.header.Get("ETag") != "" {
		t.Errorf("ETag off: status %d ETag %q, want 200 and none", a.status, a.header.Get("ETag"))
	}
}

func TestNodeFailureModes(t *testing.T) {
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(doc())

	n.SetStatus(502)
	if a := get(t, n, "", "", ""); a.status != 502 {
		t.Errorf("forced status: %d", a.status)
	}
	n.SetStatus(0)

	n.SetGarbage(true)
	if a := get(t, n, "", "", ""); a.status != 200 || string(a.body) != nodetest.Garbage {
		t.Errorf("garbage: %d %s", a.status, a.body)
	}
	n.SetGarbage(false)

	n.SetBody([]byte(`{"v":1,"routes":[]}`))
	if a := get(t, n, "?prefer=self", "", ""); string(a.body) != `{"v":1,"routes":[]}` {
		t.Errorf("raw body: %s", a.body)
	}
	var d node.Document
	n.SetDocument(&node.Document{V: 1})
	if a := get(t, n, "", "", ""); json.Unmarshal(a.body, &d) != nil || d.Routes == nil {
		t.Errorf("a document without routes is served with an empty list: %s", a.body)
	}

	n.SetDelay(time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.URL()+node.RoutesPath, nil)
	_, err := http.DefaultClient.Do(req)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("delayed request error = %v, want a deadline", err)
	}
	n.SetDelay(0)

	url := n.URL()
	n.Stop()
	if _, err := http.Get(url + node.RoutesPath); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("stopped node: error %v, want connection refused", err)
	}
	if err := n.Restart(); err != nil {
		t.Fatal(err)
	}
	if n.URL() != url {
		t.Errorf("URL changed across a restart: %s, was %s", n.URL(), url)
	}
	if a := get(t, n, "", "", ""); a.status != 200 {
		t.Errorf("restarted node: %d", a.status)
	}
}

func TestNodeStopEndsADelayedRequest(t *testing.T) {
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(doc())
	n.SetDelay(time.Hour)
	errc := make(chan error, 1)
	go func() {
		resp, err := http.Get(n.URL() + node.RoutesPath)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	n.WaitRequests(t, 1)
	stopped := make(chan struct{})
	go func() { n.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop hung on a delayed request")
	}
	<-errc
	if !slices.Contains([]int{1}, n.Requests()) {
		t.Errorf("requests = %d, want 1", n.Requests())
	}
}
