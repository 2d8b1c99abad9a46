package node_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scafo/scafo-edge/node"
)

func TestLoadToken(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	private := file("private", "s3cret\n", 0o600)
	world := file("world", "  s3cret  \n", 0o644)
	group := file("group", "s3cret", 0o640)
	empty := file("empty", " \n", 0o600)
	twoLines := file("two-lines", "s3cret\nother\n", 0o600)

	for _, tc := range []struct {
		name, token, file string
		want              string
		warn              string // a substring of the one warning; "" means none
		err               string // a substring of the error; "" means none
	}{
		{"nothing given is allowed", "", "", "", "", ""},
		{"a flag value is used as given", "s3cret", "", "s3cret", "", ""},
		{"a file's content is trimmed", "", private, "s3cret", "", ""},
		{"a world-readable file is used with a loud warning", "", world, "s3cret", "READABLE BY GROUP OR OTHERS (mode 0644)", ""},
		{"a group-readable file is warned about too", "", group, "s3cret", "mode 0640", ""},
		{"the flag wins over the file", "flag", private, "flag", "using the token, ignoring the file", ""},
		{"a missing file is an error", "", filepath.Join(dir, "nope"), "", "", "no such file"},
		{"a directory is an error", "", dir, "", "", "is a directory"},
		{"an empty file is an error", "", empty, "", "", "file is empty"},
		{"a token with a line break is an error", "", twoLines, "", "", "line breaks"},
		{"a flag with a space is an error", "a b", "", "", "", "spaces"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, warnings, err := node.LoadToken(tc.token, tc.file)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("LoadToken(%q, %q) error = %v, want one containing %q", tc.token, tc.file, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("LoadToken(%q, %q) = %q, %v, want %q", tc.token, tc.file, got, err, tc.want)
			}
			switch {
			case tc.warn == "" && len(warnings) != 0:
				t.Errorf("warnings = %q, want none", warnings)
			case tc.warn != "" && (len(warnings) != 1 || !strings.Contains(warnings[0], tc.warn)):
				t.Errorf("warnings = %q, want one containing %q", warnings, tc.warn)
			}
		})
	}
}
