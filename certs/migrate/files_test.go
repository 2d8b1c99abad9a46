package migrate

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestReadRegular(t *testing.T) {
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	if err := os.WriteFile(path("file"), []byte("pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path("exact"), make([]byte, 100), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path("big"), make([]byte, 101), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path("fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"link": path("file"), "zero": "/dev/zero", "fifolink": path("fifo")} {
		if err := os.Symlink(target, path(link)); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name     string
		file     string
		noFollow bool
		want     error
	}{
		{"a regular file is read", "file", true, nil},
		{"a file of exactly the cap is read", "exact", true, nil},
		{"a file over the cap is refused", "big", true, ErrTooLarge},
		{"a FIFO is refused at once", "fifo", true, ErrNotRegular},
		{"a link is refused inside another proxy's directory", "link", true, ErrNotRegular},
		{"a link to /dev/zero is refused", "zero", true, ErrNotRegular},
		{"the operator's link to a regular file is read", "link", false, nil},
		{"the operator's link to /dev/zero is refused", "zero", false, ErrNotRegular},
		{"the operator's link to a FIFO is refused at once", "fifolink", false, ErrNotRegular},
		{"a directory is refused", ".", true, ErrNotRegular},
		{"a missing file is an error", "none", true, fs.ErrNotExist},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			within(t, func() { _, err = readRegular(path(tc.file), 100, tc.noFollow) })
			if !errors.Is(err, tc.want) {
				t.Errorf("readRegular(%s) = %v, want %v", tc.file, err, tc.want)
			}
			if err != nil && !strings.Contains(err.Error(), path(tc.file)) {
				t.Errorf("readRegular(%s) error %q does not name the file", tc.file, err)
			}
		})
	}
}

// TestReadCaddyHostileFiles lays out a Caddy directory with a good
// certificate beside files an attacker planted: each planted one is a
// candidate refused with its file named, and the good one is read.
func TestReadCaddyHostileFiles(t *testing.T) {
	dir := t.TempDir()
	good := valid(t, "good.example")
	site := func(name string) string {
		p := filepath.Join(dir, "certificates", "acme", name)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(p, name)
	}
	write := func(p string, b []byte) {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	g := site("good.example")
	write(g+".crt", good.cert)
	write(g+".key", good.key)
	if err := syscall.Mkfifo(site("fifo.example")+".crt", 0o600); err != nil {
		t.Fatal(err)
	}
	fk := site("fifokey.example")
	write(fk+".crt", good.cert)
	if err := syscall.Mkfifo(fk+".key", 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", site("zero.example")+".crt"); err != nil {
		t.Fatal(err)
	}
	l := site("link.example")
	if err := os.Symlink(g+".crt", l+".crt"); err != nil {
		t.Fatal(err)
	}
	write(l+".key", good.key)
	b := site("big.example")
	write(b+".crt", append(good.cert, make([]byte, MaxPEMFile)...))
	write(b+".key", good.key)

	var got []Candidate
	var err error
	within(t, func() { got, err = ReadCaddy(dir) })
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		err  error
		file string
	}{
		"good.example":    {nil, ""},
		"fifo.example":    {ErrNotRegular, "fifo.example.crt"},
		"fifokey.example": {ErrNotRegular, "fifokey.example.key"},
		"zero.example":    {ErrNotRegular, "zero.example.crt"},
		"link.example":    {ErrNotRegular, "link.example.crt"},
		"big.example":     {ErrTooLarge, "big.example.crt"},
	}
	if len(got) != len(want) {
		t.Fatalf("ReadCaddy() = %d candidates, want %d", len(got), len(want))
	}
	for _, c := range got {
		w := want[c.Names[0]]
		if !errors.Is(c.Err, w.err) || (w.file != "" && !strings.Contains(c.Err.Error(), w.file)) {
			t.Errorf("%s: Err = %v, want %v naming %s", c.Names[0], c.Err, w.err, w.file)
		}
	}
}

func TestReadTraefikFile(t *testing.T) {
	dir := t.TempDir()
	a := valid(t, "a.example")
	data, _ := json.Marshal(map[string]any{"le": map[string]any{"Certificates": []any{
		map[string]any{"domain": map[string]any{"main": "a.example"}, "certificate": a.cert, "key": a.key},
	}}})
	small := filepath.Join(dir, "acme.json")
	if err := os.WriteFile(small, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadTraefikFile(small); err != nil || len(got) != 1 {
		t.Errorf("ReadTraefikFile(acme.json) = %d candidates, %v; want 1", len(got), err)
	}
	// Sparse: MaxAcmeJSON and a byte, on no disk.
	huge := filepath.Join(dir, "huge.json")
	if err := os.WriteFile(huge, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, MaxAcmeJSON+1); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTraefikFile(huge); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), huge) {
		t.Errorf("ReadTraefikFile(huge) = %v, want %v naming the file", err, ErrTooLarge)
	}
	fifo := filepath.Join(dir, "fifo.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	within(t, func() { _, err = ReadTraefikFile(fifo) })
	if !errors.Is(err, ErrNotRegular) {
		t.Errorf("ReadTraefikFile(fifo) = %v, want %v", err, ErrNotRegular)
	}
}

// within runs f and fails t if it has not returned within ten seconds:
// a read blocked on a FIFO never returns. The goroutine is left blocked
// then; the test binary ends soon after.
func within(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("still blocked after 10s")
	}
}
