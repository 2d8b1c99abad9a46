package main

import (
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The flags bench/run.sh and bench/overload.sh pass, at their default ports
// and with --workers 2.
var (
	runFlags = []string{"-addr", "127.0.0.1:18082", "-tls-addr", "127.0.0.1:18083",
		"-route", "up=localhost=127.0.0.1:18080", "-workers", "2", "-tuned", "-haproxy-maxconn", "4096"}
	overloadFlags = []string{"-addr", "127.0.0.1:18282", "-tls-addr", "127.0.0.1:18283",
		"-route", "fast=fast.test=127.0.0.1:18280", "-route", "slow=slow.test=127.0.0.1:18281",
		"-workers", "2", "-plain-only", "nginx,haproxy", "-nginx-worker-connections", "4096",
		"-haproxy-server-maxconn", "1000", "-haproxy-queue-timeout", "5s"}
	allProxies = []string{"scafo-edge", "caddy", "traefik", "nginx", "haproxy"}
)

// TestMain makes the test binary the command itself when the scripts'
// own write_config runs it (TestTheScriptsPassTheseFlags).
func TestMain(m *testing.M) {
	if os.Getenv("PROXYCONF_TEST_AS_COMMAND") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// write runs the command's parsing and writing as root would (nginx then
// names root as its user, as the files in testdata/before were made) into
// a new directory, and returns each file written, by its path under the
// directory, with the directory's path replaced by $WORK.
func write(t *testing.T, flags []string, proxies ...string) map[string]string {
	t.Helper()
	return writeAs(t, true, flags, proxies...)
}

func writeAs(t *testing.T, root bool, flags []string, proxies ...string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	s, names, err := parse(append(append([]string{"-dir", dir}, flags...), proxies...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s.Root = root
	for _, p := range names {
		if err := s.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	return readTree(t, dir, dir)
}

func readTree(t *testing.T, root, work string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		files[rel] = strings.ReplaceAll(string(b), work, "$WORK")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestConfigurationsAreTheScriptsOwn holds the configurations to what
// bench/run.sh and bench/overload.sh wrote themselves before this command
// (testdata/before: their write_*_config functions at c844233, run with
// the same settings): byte for byte where the layout was kept, else the
// same once parsed (JSON and YAML decoded, nginx's tokens, HAProxy's
// lines), so each proxy runs the configuration it always has.
func TestConfigurationsAreTheScriptsOwn(t *testing.T) {
	const nginxKey, nginxProtocols = "    ssl_certificate_key $WORK/key.pem;\n", "    ssl_protocols TLSv1.2 TLSv1.3;\n"
	for _, tc := range []struct {
		name  string
		flags []string
		// renamed: what changed on purpose, old text to new.
		renamed map[string][2]string
		// added: files the script did not write and the command does.
		added []string
		// bytes: files that are byte for byte the same.
		bytes []string
	}{
		{
			name:  "run",
			flags: runFlags,
			// scafo-edge's application takes the route's name, as every
			// other proxy's upstream does.
			renamed: map[string][2]string{"routes.json": {`"application": "bench"`, `"application": "up"`},
				// TLS 1.3 on, as on every other server (nginx 1.22 left it off).
				"nginx/nginx.conf":    {nginxKey, nginxKey + nginxProtocols},
				"nginx/nginx-h2.conf": {nginxKey, nginxKey + nginxProtocols}},
			bytes: []string{"traefik.yml", "nginx/nginx.conf", "nginx/nginx-h2.conf", "haproxy.cfg", "haproxy-h2.cfg"},
			// The compression cell's variants (TestCompressionVariants).
			added: compressionFiles,
		},
		{
			name:  "overload",
			flags: overloadFlags,
			// Caddy's HTTP/3 variant and the compression cell's, which the
			// overload rows do not use.
			added: append([]string{"caddy-h3.json"}, compressionFiles...),
			bytes: []string{"haproxy-queue.cfg"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := write(t, tc.flags, allProxies...)
			before := filepath.Join("testdata", "before", tc.name)
			want := readTree(t, before, "$WORK")
			for f, w := range want {
				if r, ok := tc.renamed[f]; ok {
					w = strings.ReplaceAll(w, r[0], r[1])
				}
				g, ok := got[f]
				switch {
				case !ok:
					t.Errorf("%s: not written", f)
				case slices.Contains(tc.bytes, f):
					if g != w {
						t.Errorf("%s differs from %s:\n%s\nwant\n%s", f, filepath.Join(before, f), g, w)
					}
				default:
					if !sameMeaning(t, f, g, w) {
						t.Errorf("%s does not say what %s says:\n%s\nwant\n%s", f, filepath.Join(before, f), g, w)
					}
				}
			}
			for f := range got {
				if _, ok := want[f]; !ok && !slices.Contains(tc.added, f) {
					t.Errorf("%s: written, and the script did not write it", f)
				}
			}
		})
	}
}

var nginxToken = regexp.MustCompile(`[{};]|[^\s{};]+`)

// sameMeaning reports whether two configurations of file's kind say the
// same to the proxy that reads them.
func sameMeaning(t *testing.T, file, got, want string) bool {
	t.Helper()
	switch ext := filepath.Ext(file); ext {
	case ".json", ".yml":
		unmarshal := json.Unmarshal
		if ext == ".yml" {
			unmarshal = yaml.Unmarshal
		}
		var g, w any
		if err := unmarshal([]byte(got), &g); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if err := unmarshal([]byte(want), &w); err != nil {
			t.Fatalf("%s (before): %v", file, err)
		}
		return reflect.DeepEqual(g, w)
	case ".conf": // nginx: the same directives in the same order
		return slices.Equal(nginxToken.FindAllString(got, -1), nginxToken.FindAllString(want, -1))
	case ".cfg": // HAProxy: the same lines, indentation and blank ones aside
		return slices.Equal(lines(got), lines(want))
	}
	t.Fatalf("%s: no way to compare it", file)
	return false
}

func lines(s string) []string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func TestBadSettingsAreRefused(t *testing.T) {
	base := []string{"-dir", t.TempDir(), "-addr", "127.0.0.1:1", "-tls-addr", "127.0.0.1:2", "-workers", "2"}
	route := []string{"-route", "up=localhost=127.0.0.1:3"}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"no proxy named", append(slices.Clone(base), route...)},
		{"no route", append(slices.Clone(base), "caddy")},
		{"a route without its address", append(slices.Clone(base), "-route", "up=localhost", "caddy")},
		{"a route with an empty name", append(slices.Clone(base), "-route", "=localhost=127.0.0.1:3", "caddy")},
		{"a route whose address has no port", append(slices.Clone(base), "-route", "up=localhost=127.0.0.1", "caddy")},
		{"a route name that would break a configuration", append(slices.Clone(base), "-route", "u p=localhost=127.0.0.1:3", "caddy")},
		{"a host that would break a configuration", append(slices.Clone(base), "-route", "up=local\"host=127.0.0.1:3", "caddy")},
		{"two routes of one name", append(slices.Clone(base), "-route", "up=a.test=127.0.0.1:3", "-route", "up=b.test=127.0.0.1:4", "caddy")},
		{"no work directory", append([]string{"-addr", "127.0.0.1:1", "-tls-addr", "127.0.0.1:2", "-workers", "2"}, append(route, "caddy")...)},
		{"no listener", append([]string{"-dir", t.TempDir(), "-tls-addr", "127.0.0.1:2", "-workers", "2"}, append(route, "caddy")...)},
		{"a TLS listener without a port", append([]string{"-dir", t.TempDir(), "-addr", "127.0.0.1:1", "-tls-addr", "127.0.0.1", "-workers", "2"}, append(route, "caddy")...)},
		{"no workers", append([]string{"-dir", t.TempDir(), "-addr", "127.0.0.1:1", "-tls-addr", "127.0.0.1:2"}, append(route, "caddy")...)},
		{"no nginx worker connections", append(slices.Clone(base), append(route, "-nginx-worker-connections", "0", "nginx")...)},
		{"a negative HAProxy maxconn", append(slices.Clone(base), append(route, "-haproxy-maxconn", "-1", "haproxy")...)},
		{"plain-only for a proxy that has no such choice", append(slices.Clone(base), append(route, "-plain-only", "caddy", "caddy")...)},
		{"an unknown flag", append(slices.Clone(base), append(route, "-nope", "caddy")...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := run(tc.args, io.Discard); err == nil {
				t.Errorf("run(%q) = nil, want an error", tc.args)
			}
		})
	}
	t.Run("an unknown proxy", func(t *testing.T) {
		dir := t.TempDir()
		args := append([]string{"-dir", dir, "-addr", "127.0.0.1:1", "-tls-addr", "127.0.0.1:2", "-workers", "2"}, append(route, "squid")...)
		if err := run(args, io.Discard); err == nil {
			t.Errorf("run(%q) = nil, want an error", args)
		}
	})
}

// TestOnlyTheNamedProxiesAreWritten: the scripts name the proxies they
// found a binary for; no other's files appear.
func TestOnlyTheNamedProxiesAreWritten(t *testing.T) {
	got := write(t, runFlags, "caddy", "haproxy")
	var names []string
	for f := range got {
		names = append(names, f)
	}
	slices.Sort(names)
	want := []string{"caddy-encode.json", "caddy-h3.json", "caddy.json", "haproxy-gzip.cfg", "haproxy-h2.cfg", "haproxy.cfg"}
	if !slices.Equal(names, want) {
		t.Errorf("files = %q, want %q", names, want)
	}
}

// TestTheScriptsPassTheseFlags runs the write_config function of
// bench/run.sh and bench/overload.sh, as they define it, with their
// default ports and --workers 2: what they write is what runFlags and
// overloadFlags write, so the test above holds the scripts' configurations.
func TestTheScriptsPassTheseFlags(t *testing.T) {
	for _, tc := range []struct {
		script string
		vars   []string
		flags  []string
	}{
		{"run.sh", []string{"WORKERS=2", "HOST=localhost", "UP_PORT=18080", "PX_PORT=18082", "PX_TLS_PORT=18083"}, runFlags},
		{"overload.sh", []string{"WORKERS=2", "FAST_HOST=fast.test", "SLOW_HOST=slow.test", "FAST_PORT=18280",
			"SLOW_PORT=18281", "PX_PORT=18282", "PX_TLS_PORT=18283", "HAPROXY_SERVER_MAXCONN=1000",
			"HAPROXY_QUEUE_TIMEOUT=5s", "NGINX_WORKER_CONNECTIONS=4096"}, overloadFlags},
	} {
		t.Run(tc.script, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join("..", tc.script))
			if err != nil {
				t.Fatal(err)
			}
			fn := scriptFunction(t, string(src), "write_config")
			dir := t.TempDir()
			script := fn + "\ndie() { echo \"$*\" >&2; exit 1; }\nfor p in " + strings.Join(allProxies, " ") + "; do write_config \"$p\"; done\n"
			cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
			cmd.Env = append(os.Environ(), append(tc.vars, "WORK="+dir, "PROXYCONF="+os.Args[0], "PROXYCONF_TEST_AS_COMMAND=1")...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s's write_config: %v\n%s", tc.script, err, out)
			}
			got := readTree(t, dir, dir)
			want := writeAs(t, os.Geteuid() == 0, tc.flags, allProxies...)
			if len(got) != len(want) {
				t.Errorf("%s wrote %d files, want %d", tc.script, len(got), len(want))
			}
			for f, w := range want {
				if got[f] != w {
					t.Errorf("%s wrote %s:\n%s\nwant\n%s", tc.script, f, got[f], w)
				}
			}
		})
	}
}

// scriptFunction is the definition of the shell function name in src:
// from its "name() {" line to the first line that is "}".
func scriptFunction(t *testing.T, src, name string) string {
	t.Helper()
	start := strings.Index(src, "\n"+name+"() {\n")
	if start < 0 {
		t.Fatalf("no %s() in the script", name)
	}
	body := src[start+1:]
	end := strings.Index(body, "\n}\n")
	if end < 0 {
		t.Fatalf("%s() does not end", name)
	}
	return body[:end+2]
}

// compressionFiles are the compression cell's (http-html64k) variants, one
// per proxy that needs its compression turned on (scafo-edge compresses by
// default).
var compressionFiles = []string{"caddy-encode.json", "traefik-compress.yml", "nginx/nginx-gzip.conf", "haproxy-gzip.cfg"}

// TestCompressionVariants: each compression variant is its proxy's usual
// file plus the compression settings and nothing else, so the compression
// cell differs from the others only in them, and the other cells, which
// run the usual files, do not change at all.
func TestCompressionVariants(t *testing.T) {
	const nginxGzip = `  gzip on;
  gzip_types text/plain text/css text/xml application/json application/javascript application/xml image/svg+xml;
  gzip_proxied any;
  gzip_min_length 512;
  gzip_vary on;
`
	const haproxyGzip = "  compression algo gzip\n" +
		"  compression type text/html text/plain text/css text/xml application/json application/javascript application/xml image/svg+xml\n"
	for _, tc := range []struct {
		name   string
		flags  []string
		routes int
	}{{"run", runFlags, 1}, {"overload", overloadFlags, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			got := write(t, tc.flags, allProxies...)

			// Caddy: every route of both servers runs encode, zstd
			// preferred, before its reverse_proxy.
			var caddy, encode map[string]any
			if err := json.Unmarshal([]byte(got["caddy.json"]), &caddy); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(got["caddy-encode.json"]), &encode); err != nil {
				t.Fatal(err)
			}
			wantEncode := map[string]any{"handler": "encode", "encodings": map[string]any{"zstd": map[string]any{}, "gzip": map[string]any{}},
				"prefer": []any{"zstd", "gzip"}}
			servers := encode["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)
			n := 0
			for _, srv := range servers {
				for _, r := range srv.(map[string]any)["routes"].([]any) {
					route := r.(map[string]any)
					handle := route["handle"].([]any)
					if len(handle) != 2 || !reflect.DeepEqual(handle[0], wantEncode) || handle[1].(map[string]any)["handler"] != "reverse_proxy" {
						t.Errorf("caddy-encode.json route %v: want encode, then reverse_proxy", route["match"])
					}
					route["handle"] = handle[1:]
					n++
				}
			}
			if n != 2*tc.routes {
				t.Errorf("caddy-encode.json: %d routes, want %d", n, 2*tc.routes)
			}
			if !reflect.DeepEqual(encode, caddy) {
				t.Errorf("caddy-encode.json without encode is not caddy.json:\n%s", got["caddy-encode.json"])
			}

			// nginx: the gzip directives in the http block.
			gz := got["nginx/nginx-gzip.conf"]
			if !strings.Contains(gz, "http {\n") || strings.Count(gz, nginxGzip) != 1 || strings.Index(gz, nginxGzip) < strings.Index(gz, "http {\n") {
				t.Errorf("nginx-gzip.conf: no gzip directives in its http block:\n%s", gz)
			}
			if strings.Replace(gz, nginxGzip, "", 1) != got["nginx/nginx.conf"] {
				t.Errorf("nginx-gzip.conf without its gzip directives is not nginx.conf:\n%s", gz)
			}
			if strings.Contains(got["nginx/nginx.conf"], "gzip") {
				t.Error("nginx.conf compresses")
			}

			// HAProxy: compression in the defaults section.
			hg := got["haproxy-gzip.cfg"]
			if i := strings.Index(hg, haproxyGzip); i < strings.Index(hg, "defaults\n") || i > strings.Index(hg, "frontend ") {
				t.Errorf("haproxy-gzip.cfg: no compression in its defaults:\n%s", hg)
			}
			if strings.Replace(hg, haproxyGzip, "", 1) != got["haproxy.cfg"] {
				t.Errorf("haproxy-gzip.cfg without compression is not haproxy.cfg:\n%s", hg)
			}
			if strings.Contains(got["haproxy.cfg"], "compression") {
				t.Error("haproxy.cfg compresses")
			}

			// Traefik: every router through the compress middleware.
			var tr, tc2 map[string]any
			if err := yaml.Unmarshal([]byte(got["traefik.yml"]), &tr); err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal([]byte(got["traefik-compress.yml"]), &tc2); err != nil {
				t.Fatal(err)
			}
			h := tc2["http"].(map[string]any)
			wantMw := map[string]any{"compress": map[string]any{"compress": map[string]any{"encodings": []any{"zstd", "gzip"}}}}
			if !reflect.DeepEqual(h["middlewares"], wantMw) {
				t.Errorf("traefik-compress.yml middlewares = %v, want %v", h["middlewares"], wantMw)
			}
			delete(h, "middlewares")
			routers := h["routers"].(map[string]any)
			if len(routers) != 2*tc.routes {
				t.Errorf("traefik-compress.yml: %d routers, want %d", len(routers), 2*tc.routes)
			}
			for name, r := range routers {
				router := r.(map[string]any)
				if !reflect.DeepEqual(router["middlewares"], []any{"compress"}) {
					t.Errorf("traefik-compress.yml router %s: middlewares %v, want [compress]", name, router["middlewares"])
				}
				delete(router, "middlewares")
			}
			if !reflect.DeepEqual(tc2, tr) {
				t.Errorf("traefik-compress.yml without compress is not traefik.yml:\n%s", got["traefik-compress.yml"])
			}
		})
	}
}
