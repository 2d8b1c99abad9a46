package node_test

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

func openState(t *testing.T, dir string) *bolt.DB {
	t.Helper()
	db, err := node.OpenState(dir, zeroLog())
	if err != nil {
		t.Fatalf("OpenState(%s): %v", dir, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestOpenStateCreatesPrivateFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "nested")
	openState(t, dir)
	for path, want := range map[string]os.FileMode{dir: 0o700, filepath.Join(dir, node.StateFile): 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s mode = %04o, want %04o", path, got, want)
		}
	}
}

func TestOpenStateTightensALooseStateFile(t *testing.T) {
	dir := t.TempDir()
	db := openState(t, dir)
	db.Close()
	path := filepath.Join(dir, node.StateFile)
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	logs := &testsupport.SyncBuffer{}
	db2, err := node.OpenState(dir, zerolog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode = %04o, want 0600", fi.Mode().Perm())
	}
	if len(logs.LogEntries("readable by group or others")) != 1 {
		t.Errorf("no warning about the loose mode:\n%s", logs)
	}
}

func TestOpenStateFailsFastOnALockedFile(t *testing.T) {
	dir := t.TempDir()
	openState(t, dir) // holds the lock, as another process would
	start := time.Now()
	db, err := node.OpenState(dir, zeroLog())
	took := time.Since(start)
	if err == nil {
		db.Close()
		t.Fatal("OpenState on a locked file succeeded")
	}
	path := filepath.Join(dir, node.StateFile)
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "locked by another process") {
		t.Errorf("error = %q, want it to name %s and say it is locked", err, path)
	}
	if took > 5*time.Second {
		t.Errorf("OpenState took %v to give up, want at most 5s", took)
	}
	t.Logf("gave up after %v", took)
}

// damage writes garbage over part of path.
func damage(t *testing.T, path string, off int64, n int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	junk := make([]byte, n)
	rand.Read(junk)
	if _, err := f.WriteAt(junk, off); err != nil {
		t.Fatal(err)
	}
}

func TestOpenStateMovesACorruptFileAside(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(t *testing.T, path string)
	}{
		{"a file that is not bbolt at all", func(t *testing.T, path string) {
			if err := os.WriteFile(path, bytes.Repeat([]byte("not a database "), 2000), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"both meta pages damaged", func(t *testing.T, path string) {
			damage(t, path, 0, 64)
			damage(t, path, 4096, 64)
		}},
		{"data pages damaged", func(t *testing.T, path string) {
			fi, _ := os.Stat(path)
			damage(t, path, 2*4096, int(fi.Size()-2*4096))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, node.StateFile)
			db := openState(t, dir)
			if err := db.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucketIfNotExists([]byte("certs"))
				if err != nil {
					return err
				}
				for i := range 200 {
					if err := b.Put([]byte{byte(i), 'k'}, bytes.Repeat([]byte{byte(i)}, 300)); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			db.Close()
			tc.corrupt(t, path)
			damaged, _ := os.ReadFile(path)

			logs := &testsupport.SyncBuffer{}
			db, err := node.OpenState(dir, zerolog.New(logs))
			if err == nil {
				db.Close()
				t.Fatal("OpenState on a corrupt file succeeded")
			}
			t.Logf("error: %v", err)
			aside, _ := filepath.Glob(path + ".corrupt-*")
			if len(aside) != 1 {
				t.Fatalf("moved-aside files = %v, want one; error: %v", aside, err)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), aside[0]) || !strings.Contains(err.Error(), "refusing to start") {
				t.Errorf("error = %q, want it to name %s, %s and the refusal", err, path, aside[0])
			}
			if kept, _ := os.ReadFile(aside[0]); !bytes.Equal(kept, damaged) {
				t.Error("the moved-aside file is not the corrupt file byte for byte")
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("state file still at %s after moving it aside (%v)", path, err)
			}
			if len(logs.LogEntries("corrupt")) != 1 {
				t.Errorf("no log line about the corrupt file:\n%s", logs)
			}

			// The refusal happens once: the next start begins empty.
			db = openState(t, dir)
			if u, err := node.LoadDocument(db); u != nil || err != nil {
				t.Errorf("LoadDocument after a fresh start = %v, %v, want nothing", u, err)
			}
		})
	}
}

func TestOpenStateOnAnUnusablePath(t *testing.T) {
	t.Run("a state directory below a regular file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "file")
		os.WriteFile(f, nil, 0o600)
		_, err := node.OpenState(filepath.Join(f, "state"), zeroLog())
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("error = %v, want one naming %s", err, f)
		}
	})
	t.Run("a state directory that is a file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "file")
		os.WriteFile(f, nil, 0o600)
		_, err := node.OpenState(f, zeroLog())
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("error = %v, want one naming %s", err, f)
		}
	})
	t.Run("a state file that is a directory", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, node.StateFile)
		os.Mkdir(path, 0o700)
		_, err := node.OpenState(dir, zeroLog())
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("error = %v, want one naming %s", err, path)
		}
		if aside, _ := filepath.Glob(path + ".corrupt-*"); len(aside) != 0 {
			t.Errorf("a directory was moved aside as corrupt: %v", aside)
		}
	})
	t.Run("a read-only state directory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "ro")
		os.Mkdir(dir, 0o700)
		readOnly(t, dir)
		_, err := node.OpenState(dir, zeroLog())
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, node.StateFile)) {
			t.Errorf("error = %v, want one naming the state file", err)
		}
		t.Logf("error: %v", err)
	})
	t.Run("a read-only state file", func(t *testing.T) {
		dir := t.TempDir()
		openState(t, dir).Close()
		path := filepath.Join(dir, node.StateFile)
		readOnly(t, path)
		_, err := node.OpenState(dir, zeroLog())
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("error = %v, want one naming %s", err, path)
		}
		if aside, _ := filepath.Glob(path + ".corrupt-*"); len(aside) != 0 {
			t.Errorf("an unwritable file was moved aside as corrupt: %v", aside)
		}
		t.Logf("error: %v", err)
	})
}

// readOnly makes path unwritable for this process: by its mode, or, for
// root (who writes through modes, as CI runs), by the immutable attribute.
func readOnly(t *testing.T, path string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if err := os.Chmod(path, 0o500); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(path, 0o700) })
		return
	}
	if out, err := exec.Command("chattr", "+i", path).CombinedOutput(); err != nil {
		t.Skipf("root, and chattr +i is not available here: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("chattr", "-i", path).Run() })
}

func TestDocumentPersistsAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	db := openState(t, dir)
	if u, err := node.LoadDocument(db); u != nil || err != nil {
		t.Fatalf("LoadDocument on a new state = %v, %v, want nil, nil", u, err)
	}
	// Another package's bucket in the same file must survive us.
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("certs"))
		if err != nil {
			return err
		}
		return b.Put([]byte("k"), []byte("v"))
	}); err != nil {
		t.Fatal(err)
	}

	// A poll applies a document and the caller persists it.
	s := newPoller(t, testDoc("a.example", "b.example"), nil)
	fetched := next(t, run(t, s.p, nil))
	if err := node.SaveDocument(db, fetched); err != nil {
		t.Fatal(err)
	}
	db.Close()

	// Restart with the node down.
	s.n.Stop()
	db = openState(t, dir)
	seed, err := node.LoadDocument(db)
	if err != nil || seed == nil {
		t.Fatalf("LoadDocument after restart = %v, %v", seed, err)
	}
	if !seed.Stale || seed.Fingerprint != fetched.Fingerprint || !seed.FetchedAt.Equal(fetched.FetchedAt) || !bytes.Equal(seed.Body, fetched.Body) {
		t.Errorf("loaded = stale %v, fingerprint %.12s at %v; want stale, %.12s at %v", seed.Stale, seed.Fingerprint, seed.FetchedAt, fetched.Fingerprint, fetched.FetchedAt)
	}
	if got := hosts(seed.Doc); len(got) != 2 || got[1] != "b.example" {
		t.Errorf("loaded hosts = %v", got)
	}
	if err := db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket([]byte("certs")).Get([]byte("k")); string(v) != "v" {
			t.Errorf("certs bucket value = %q after a restart", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// The restarted edge serves the persisted document, stale, while the
	// node stays down.
	s2 := newPoller(t, nil, nil)
	s2.n.Stop()
	updates := run(t, s2.p, seed)
	testsupport.WaitFor(t, 10*time.Second, "failed polls", func() bool { return s2.p.Status().ConsecutiveFailures >= 2 })
	none(t, updates)
	if st := s2.p.Status(); !st.Stale || st.Fingerprint != seed.Fingerprint {
		t.Errorf("status = %+v, want the persisted document, stale", st)
	}
}

func TestLoadDocumentRefusesADamagedRecord(t *testing.T) {
	dir := t.TempDir()
	db := openState(t, dir)
	body, _ := json.Marshal(testDoc("a.example"))
	if err := node.SaveDocument(db, node.Update{Body: body, FetchedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("routing")).Put([]byte("body"), append(body, ' '))
	})
	if u, err := node.LoadDocument(db); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("LoadDocument of a body changed behind its fingerprint = %v, %v, want an error", u, err)
	}
	if err := node.SaveDocument(db, node.Update{}); err == nil {
		t.Error("SaveDocument of an empty body succeeded")
	}
}
