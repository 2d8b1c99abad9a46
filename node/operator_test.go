package node_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// bcrypt of "s3cret" at the minimum cost.
const s3cretHash = "$2a$04$KS98S0tAZG5k4gXURbV28O5diKwQN8I59g9zojtGj0VxJz8WXwny2"

const goodOperatorFile = `{
  "v": 1,
  "routes": [
    {"host": "www.example.com", "redirect": {"to": "https://example.com", "status": 301, "keep_path": true}},
    {"host": "grafana.example.com", "application": "grafana",
     "upstreams": [{"address": "127.0.0.1:3000"}],
     "basic_auth": {"realm": "grafana", "users": ["admin:` + s3cretHash + `"]},
     "headers": {"set": {"Strict-Transport-Security": "max-age=63072000"}, "remove": ["Server"]}},
    {"host": "tools.example.com", "upstreams": [{"node": "box", "address": "127.0.0.1:8080"}],
     "allow": ["10.0.0.0/8", "192.0.2.7", "::1"], "paths": {"wiki": "grafana.example.com"}},
    {"host": "*.preview.example.com", "upstreams": [{"address": "127.0.0.1:8081"}, {"address": "10.0.0.2:8081"}]}
  ]
}
`

func TestParseOperatorAcceptsTheDocumentedFields(t *testing.T) {
	doc, err := node.ParseOperator("ops.json", []byte(goodOperatorFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Routes) != 4 || doc.Routes[0].Redirect.Status != 301 || doc.Routes[1].BasicAuth == nil || len(doc.Routes[2].Allow) != 3 {
		t.Errorf("parsed %+v", doc)
	}
	// The node-document form passes the node's own parser's checks.
	if _, err := node.Parse(mustJSON(t, doc.Document())); err != nil {
		t.Errorf("Document() does not parse as a node document: %v", err)
	}
}

func TestParseOperatorRefusals(t *testing.T) {
	route := func(fields string) string {
		return "{\n  \"v\": 1,\n  \"routes\": [\n    {\"host\": \"a.example.com\", " + fields + "}\n  ]\n}\n"
	}
	ups := `"upstreams": [{"address": "127.0.0.1:1"}]`
	cases := []struct {
		name, body string
		wantLine   int    // 0: no position expected
		wantField  string // "" : not checked
		wantErr    string
	}{
		{"malformed JSON names its line and column", "{\n  \"v\": 1,\n  \"routes\": [\n    {\"host\": \"a\",, }\n  ]\n}", 4, "", "invalid character ','"},
		{"a truncated file", "{\n  \"v\": 1,\n  \"routes\": [", 0, "", "unexpected end of JSON input"},
		{"trailing data after the document", `{"v":1,"routes":[]}` + "\n{}", 2, "", "trailing data"},
		{"a value of the wrong type names its field", "{\n  \"v\": 1,\n  \"routes\": [\n    {\"host\": 7}\n  ]\n}", 4, "routes[0].host", "a JSON number where string is wanted"},
		{"an unknown field is refused where it is", route(ups + ",\n    \"redirct\": {}"), 5, "routes[0].redirct", `unknown field "redirct"`},
		{"an unknown top-level field", "{\"v\": 1, \"routes\": [], \"api\": {}}", 1, "api", `unknown field "api"`},
		{"v other than 1", "{\"v\": 2, \"routes\": []}", 1, "v", "v is 2"},
		{"routes missing", "{\"v\": 1}", 0, "routes", "routes is missing"},
		{"a bad host", route(`"upstreams": []`), 4, "routes[0].host", ""},
		{"a host that is not a DNS name", strings.Replace(route(ups), "a.example.com", "a_b.example.com", 1), 4, "routes[0].host", `has character '_'`},
		{"a duplicate host", "{\"v\":1,\"routes\":[\n{\"host\":\"a.example.com\"," + ups + "},\n{\"host\":\"A.example.com.\"," + ups + "}]}", 3, "routes[1].host", "duplicates routes[0].host"},
		{"an upstream without a port", route(`"upstreams": [{"address": "127.0.0.1"}]`), 4, "routes[0].upstreams[0].address", "missing port"},
		{"neither upstreams nor a redirect", route(`"allow": ["10.0.0.0/8"]`), 4, "routes[0].host", "neither upstreams nor a redirect"},
		{"both upstreams and a redirect", route(ups + `, "redirect": {"to": "https://b.example"}`), 4, "routes[0].redirect", "both upstreams and a redirect"},
		{"a redirect with paths", route(`"redirect": {"to": "https://b.example"}, "paths": {"x": "a.example.com"}`), 4, "routes[0].paths", "its paths would never be used"},
		{"a redirect status other than 301/302/307/308", route(`"redirect": {"to": "https://b.example", "status": 303}`), 4, "routes[0].redirect.status", "want 301, 302, 307 or 308"},
		{"a relative redirect", route(`"redirect": {"to": "/elsewhere"}`), 4, "routes[0].redirect.to", "absolute http or https URL"},
		{"a redirect to another scheme", route(`"redirect": {"to": "javascript:alert(1)"}`), 4, "routes[0].redirect.to", "absolute http or https URL"},
		{"keep_path onto a URL ending in /", route(`"redirect": {"to": "https://b.example/", "keep_path": true}`), 4, "routes[0].redirect.to", "must not end in /"},
		{"an allow entry that is no network", route(ups + `, "allow": ["10.0.0.0/8", "intranet"]`), 4, "routes[0].allow[1]", `"intranet" is not a CIDR`},
		{"basic auth with no users", route(ups + `, "basic_auth": {"users": []}`), 4, "routes[0].basic_auth.users", "nobody could ever pass"},
		{"basic auth with a plain-text password", route(ups + `, "basic_auth": {"users": ["admin:hunter2"]}`), 4, "routes[0].basic_auth.users[0]", "only bcrypt hashes"},
		{"basic auth with an MD5 htpasswd line", route(ups + `, "basic_auth": {"users": ["admin:$apr1$x$y"]}`), 4, "routes[0].basic_auth.users[0]", "only bcrypt hashes"},
		{"basic auth with a broken bcrypt hash", route(ups + `, "basic_auth": {"users": ["admin:$2y$99$abc"]}`), 4, "routes[0].basic_auth.users[0]", "bcrypt hash"},
		{"basic auth with a line without a user", route(ups + `, "basic_auth": {"users": [":` + s3cretHash + `"]}`), 4, "routes[0].basic_auth.users[0]", "user:<bcrypt hash>"},
		{"basic auth naming a user twice", route(ups + `, "basic_auth": {"users": ["a:` + s3cretHash + `", "a:` + s3cretHash + `"]}`), 4, "routes[0].basic_auth.users[1]", "duplicates users[0]"},
		{"a realm with a quote", route(ups + `, "basic_auth": {"realm": "a\"b", "users": ["a:` + s3cretHash + `"]}`), 4, "routes[0].basic_auth.realm", "quote"},
		{"a header name that is not one", route(ups + `, "headers": {"set": {"X Bad": "1"}}`), 4, "routes[0].headers.set.X Bad", "not a valid header name"},
		{"a header value with a line break", route(ups + `, "headers": {"set": {"X-A": "1\r\nSet-Cookie: x"}}`), 4, "routes[0].headers.set.X-A", "not a valid header value"},
		{"a framing header", route(ups + `, "headers": {"remove": ["content-length"]}`), 4, "routes[0].headers.remove[0]", "the edge's to set"},
		{"a hop-by-hop header", route(ups + `, "headers": {"set": {"Connection": "close"}}`), 4, "routes[0].headers.set.Connection", "the edge's to set"},
		{"a negative max_body_bytes", route(ups + `, "max_body_bytes": -1`), 4, "routes[0].max_body_bytes", "want a number of bytes"},
		{"a fractional max_body_bytes", route(ups + `, "max_body_bytes": 1.5`), 4, "routes[0].max_body_bytes", "a JSON number 1.5 where int64 is wanted"},
		{"a max_body_bytes past int64", route(ups + `, "max_body_bytes": 1e30`), 4, "routes[0].max_body_bytes", "where int64 is wanted"},
		{"a max_body_bytes with a unit", route(ups + `, "max_body_bytes": "10MiB"`), 4, "routes[0].max_body_bytes", "a JSON string where int64 is wanted"},
		{"a max_body_bytes on a redirect", route(`"redirect": {"to": "https://b.example"}, "max_body_bytes": 10`), 4, "routes[0].max_body_bytes", "no body is ever forwarded"},
		{"an empty file", "  \n", 0, "", "empty file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := node.ParseOperator("/etc/scafo/ops.json", []byte(tc.body))
			var oe *node.OperatorError
			if !errors.As(err, &oe) {
				t.Fatalf("ParseOperator = %v, want an *OperatorError", err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "operator routes /etc/scafo/ops.json") {
				t.Errorf("error %q does not start by naming the file", msg)
			}
			if tc.wantLine != 0 && oe.Line != tc.wantLine {
				t.Errorf("error %q: line %d, want %d", msg, oe.Line, tc.wantLine)
			}
			if tc.wantLine != 0 && oe.Column < 1 {
				t.Errorf("error %q: column %d, want one", msg, oe.Column)
			}
			if tc.wantField != "" && oe.Field != tc.wantField {
				t.Errorf("error %q: field %q, want %q", msg, oe.Field, tc.wantField)
			}
			if !strings.Contains(msg, tc.wantErr) {
				t.Errorf("error %q does not say %q", msg, tc.wantErr)
			}
		})
	}
	t.Run("a file over the size limit", func(t *testing.T) {
		_, err := node.ParseOperator("big.json", make([]byte, node.MaxOperatorFileSize+1))
		if err == nil || !strings.Contains(err.Error(), "over the") {
			t.Errorf("ParseOperator(huge) = %v", err)
		}
	})
}

func TestNodeDocumentsCannotUseOperatorFields(t *testing.T) {
	// A node's document with the operator's fields parses (unknown fields
	// are ignored, by the document's rule of additive fields), but its
	// Route has nowhere to keep them: they do nothing.
	body := `{"v":1,"routes":[{"host":"a.example.com","application":"a","upstreams":[{"node":"n","address":"127.0.0.1:1"}],
	  "redirect":{"to":"https://evil.example"},"basic_auth":{"users":["x:y"]},"allow":["10.0.0.0/8"],"headers":{"set":{"A":"b"}}}]}`
	doc, err := node.Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	again := string(mustJSON(t, doc))
	for _, f := range []string{"redirect", "basic_auth", "allow", "headers"} {
		if strings.Contains(again, f) {
			t.Errorf("node document kept %q: %s", f, again)
		}
	}
}

// operatorRun runs src until the test ends and returns the updates it
// hands on.
func operatorRun(t *testing.T, src *node.OperatorSource) <-chan node.OperatorUpdate {
	t.Helper()
	updates := make(chan node.OperatorUpdate, 16)
	ctx, cancel := context.WithCancel(context.Background())
	var done sync.WaitGroup
	done.Add(1)
	go func() {
		defer done.Done()
		src.Run(ctx, func(u node.OperatorUpdate) { updates <- u })
	}()
	t.Cleanup(func() {
		cancel()
		done.Wait()
	})
	return updates
}

func nextOperator(t *testing.T, updates <-chan node.OperatorUpdate) node.OperatorUpdate {
	t.Helper()
	select {
	case u := <-updates:
		return u
	case <-time.After(10 * time.Second):
		t.Fatal("no operator update")
	}
	return node.OperatorUpdate{}
}

func TestOperatorSource(t *testing.T) {
	path := filepath.Join(t.TempDir(), "operator.json")
	writeFile(t, path, []byte(goodOperatorFile))
	logs := &testsupport.SyncBuffer{}
	reg := prometheus.NewPedanticRegistry()
	src, err := node.NewOperatorSource(node.OperatorSourceOptions{Path: path, Interval: 20 * time.Millisecond, Log: zerolog.New(logs), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	valid := func() float64 {
		v, _ := testsupport.MetricValue(t, reg, "scafo_edge_operator_routes_valid", nil)
		return v
	}
	first, err := src.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Doc.Routes) != 4 || first.Fingerprint != node.Fingerprint([]byte(goodOperatorFile)) {
		t.Fatalf("Load = %d routes, fingerprint %q", len(first.Doc.Routes), first.Fingerprint)
	}
	if st := src.Status(); !st.Valid || st.File != path || st.Routes != 4 || valid() != 1 {
		t.Fatalf("status after Load = %+v, valid metric %v", st, valid())
	}
	updates := operatorRun(t, src)

	edit := `{"v":1,"routes":[{"host":"grafana.example.com","upstreams":[{"address":"127.0.0.1:3001"}]}]}`
	t.Run("an edit is handed on", func(t *testing.T) {
		writeFile(t, path, []byte(edit))
		u := nextOperator(t, updates)
		if len(u.Doc.Routes) != 1 || u.Doc.Routes[0].Upstreams[0].Address != "127.0.0.1:3001" {
			t.Errorf("update = %+v", u.Doc)
		}
		if e := logs.LogEntries("operator routes file changed"); len(e) != 1 {
			t.Errorf("change logged %d times, want once", len(e))
		}
	})
	t.Run("a broken edit keeps the last good file, logged once", func(t *testing.T) {
		writeFile(t, path, []byte("{\"v\":1,\n\"routes\":[{\"host\":\"grafana.example.com\",\"upstreams\":[{\"address\":\"nope\"}]}]}"))
		testsupport.WaitFor(t, 10*time.Second, "the broken file refused", func() bool { return !src.Status().Valid })
		if valid() != 0 {
			t.Errorf("scafo_edge_operator_routes_valid = %v, want 0", valid())
		}
		st := src.Status()
		if !strings.Contains(st.LastError, path+":2:") || !strings.Contains(st.LastError, "routes[0].upstreams[0].address") {
			t.Errorf("status error = %q, want the file, line 2 and the field", st.LastError)
		}
		if st.Fingerprint != node.Fingerprint([]byte(edit)) {
			t.Errorf("status fingerprint = %q, want the last good file's", st.Fingerprint)
		}
		if e := logs.LogEntries("operator routes file refused; keeping the last good one"); len(e) != 1 {
			t.Errorf("refusal logged %d times, want once", len(e))
		}
		select {
		case u := <-updates:
			t.Errorf("a broken file was handed on: %+v", u)
		default:
		}
	})
	t.Run("a missing file keeps the last good one", func(t *testing.T) {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		testsupport.WaitFor(t, 10*time.Second, "the missing file noticed", func() bool {
			return strings.Contains(src.Status().LastError, "no such file")
		})
		if e := logs.LogEntries("operator routes file refused; keeping the last good one"); len(e) != 2 {
			t.Errorf("refusals logged %d times, want twice (broken, then missing)", len(e))
		}
	})
	t.Run("the fix is handed on and the recovery logged once", func(t *testing.T) {
		fixed := `{"v":1,"routes":[{"host":"grafana.example.com","upstreams":[{"address":"127.0.0.1:3002"}]}]}`
		writeFile(t, path, []byte(fixed))
		u := nextOperator(t, updates)
		if u.Doc.Routes[0].Upstreams[0].Address != "127.0.0.1:3002" {
			t.Errorf("update = %+v", u.Doc)
		}
		if st := src.Status(); !st.Valid || st.LastError != "" || valid() != 1 {
			t.Errorf("status = %+v, valid metric %v", st, valid())
		}
		if e := logs.LogEntries("operator routes file is good again"); len(e) != 1 {
			t.Errorf("recovery logged %d times, want once", len(e))
		}
	})
}

func TestOperatorSourceLoadRefusesABrokenFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, body, want string
	}{
		{"broken JSON", "{\n\"v\": 1,\n\"routes\": [}\n", ":3:"},
		{"a bad field", "{\"v\": 1,\n\"routes\": [\n{\"host\": \"a.example.com\", \"upstreams\": [{\"address\": \"x\"}]}]}", ":3:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "ops.json")
			writeFile(t, path, []byte(tc.body))
			src, err := node.NewOperatorSource(node.OperatorSourceOptions{Path: path})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := src.Load(); err == nil || !strings.Contains(err.Error(), path+tc.want) {
				t.Errorf("Load = %v, want the file and line %s", err, tc.want)
			}
		})
	}
	t.Run("a missing file", func(t *testing.T) {
		src, err := node.NewOperatorSource(node.OperatorSourceOptions{Path: filepath.Join(dir, "none.json")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := src.Load(); err == nil || !strings.Contains(err.Error(), "none.json") {
			t.Errorf("Load = %v, want the missing file named", err)
		}
	})
	t.Run("an empty path", func(t *testing.T) {
		if _, err := node.NewOperatorSource(node.OperatorSourceOptions{}); err == nil {
			t.Error("NewOperatorSource accepted an empty path")
		}
	})
}

func TestWithOperatorAddsTheFileToStatus(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ops.json")
	writeFile(t, path, []byte(goodOperatorFile))
	op, err := node.NewOperatorSource(node.OperatorSourceOptions{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Load(); err != nil {
		t.Fatal(err)
	}
	fs, err := node.NewFileSource(node.FileSourceOptions{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	st := node.WithOperator(fs, op).Status()
	if st.Source != "file "+path || st.Operator == nil || !st.Operator.Valid || st.Operator.Routes != 4 {
		t.Errorf("Status() = %+v (operator %+v)", st, st.Operator)
	}
	if fs.Status().Operator != nil {
		t.Error("the wrapped source's own status grew an operator part")
	}
}

func TestParseOperatorMaxBodyBytes(t *testing.T) {
	for _, tc := range []struct {
		field string
		want  *int64
	}{
		{``, nil},
		{`, "max_body_bytes": 0`, new(int64)},
		{`, "max_body_bytes": 1048576`, func() *int64 { n := int64(1 << 20); return &n }()},
	} {
		body := `{"v": 1, "routes": [{"host": "a.example.com", "upstreams": [{"address": "127.0.0.1:1"}]` + tc.field + `}]}`
		doc, err := node.ParseOperator("ops.json", []byte(body))
		if err != nil {
			t.Fatalf("ParseOperator(%s) = %v", body, err)
		}
		got := doc.Routes[0].MaxBodyBytes
		if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
			t.Errorf("ParseOperator(%s): max_body_bytes = %v, want %v", body, got, tc.want)
		}
	}
}
