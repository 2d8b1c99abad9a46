package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestObservabilityFlagsAreCheckedAsParsed(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "404.html")
	os.WriteFile(file, []byte("x"), 0o644)
	cases := []struct {
		name  string
		args  []string
		env   map[string]string
		want  string // part of the error; "" for none
		check func(c *config) bool
	}{
		{"the defaults", nil, nil, "", func(c *config) bool {
			return c.accessLogFormat == "json" && !c.accessLogAnon && c.errorPages == "" && c.maxBodyBytes == 0
		}},
		{"a body limit in bytes", []string{"--max-body-bytes", "1048576"}, nil, "", func(c *config) bool { return c.maxBodyBytes == 1<<20 }},
		{"a body limit with a unit", []string{"--max-body-bytes", "10MiB"}, nil, "", func(c *config) bool { return c.maxBodyBytes == 10<<20 }},
		{"a body limit from the environment", nil, map[string]string{"SCAFO_EDGE_MAX_BODY_BYTES": "2KiB"}, "", func(c *config) bool { return c.maxBodyBytes == 2048 }},
		{"a negative body limit", []string{"--max-body-bytes", "-1"}, nil, "max-body-bytes", nil},
		{"a body limit that is no number", []string{"--max-body-bytes", "lots"}, nil, "max-body-bytes", nil},
		{"a body limit with an unknown unit", []string{"--max-body-bytes", "10MB"}, nil, "max-body-bytes", nil},
		{"a body limit past int64", []string{"--max-body-bytes", "9999999TiB"}, nil, "max-body-bytes", nil},
		{"the combined format", []string{"--access-log-format", "combined"}, nil, "", func(c *config) bool { return c.accessLogFormat == "combined" }},
		{"an unknown access log format", []string{"--access-log-format", "xml"}, nil, "access-log-format", nil},
		{"an unknown access log format from the environment", nil, map[string]string{"SCAFO_EDGE_ACCESS_LOG_FORMAT": "Combined"}, "SCAFO_EDGE_ACCESS_LOG_FORMAT", nil},
		{"anonymised addresses", []string{"--access-log-anonymise"}, nil, "", func(c *config) bool { return c.accessLogAnon }},
		{"an error pages directory", []string{"--error-pages", dir}, nil, "", func(c *config) bool { return c.errorPages == dir }},
		{"an error pages directory that does not exist", []string{"--error-pages", filepath.Join(dir, "nope")}, nil, "error-pages", nil},
		{"an error pages directory that is a file", []string{"--error-pages", file}, nil, "not a directory", nil},
		{"an empty error pages directory name", []string{"--error-pages", ""}, nil, "error-pages", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c config
			fs := serveFlags(&c)
			fs.SetOutput(&strings.Builder{})
			err := fs.parse(tc.args, func(k string) string { return tc.env[k] })
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("parse(%q) = %v, want no error", tc.args, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("parse(%q) = %v, want an error naming %q", tc.args, err, tc.want)
			}
			if tc.check != nil && !tc.check(&c) {
				t.Errorf("parse(%q): config = %+v", tc.args, c)
			}
		})
	}
}
