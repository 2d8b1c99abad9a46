package e2e

// What the edge's bbolt state file holds, read from a copy while the edge
// runs: a test compares snapshots to show an input wrote nothing.

import (
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// stateSnapshot reads every bucket's keys and value digests from a copy of
// the live bbolt file (the edge holds its lock), so a check compares what is
// stored rather than page layout.
func stateSnapshot(t *testing.T, dbPath string) map[string][32]byte {
	t.Helper()
	b, err := os.ReadFile(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), "snapshot.db")
	if err := os.WriteFile(cp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(cp, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string][32]byte{}
	var walk func(prefix string, b *bolt.Bucket) error
	walk = func(prefix string, b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				return walk(prefix+string(k)+"/", b.Bucket(k))
			}
			out[prefix+string(k)] = sha256.Sum256(v)
			return nil
		})
	}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error { return walk(string(name)+"/", b) })
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// diffSnapshots names the keys added, removed or changed between two
// snapshots.
func diffSnapshots(before, after map[string][32]byte) []string {
	var diff []string
	for k, v := range after {
		if old, ok := before[k]; !ok {
			diff = append(diff, "+"+k)
		} else if old != v {
			diff = append(diff, "~"+k)
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			diff = append(diff, "-"+k)
		}
	}
	slices.Sort(diff)
	return diff
}

// waitDocumentPersisted waits until the edge has saved its routing document
// in the state file at dbPath, which it does just after serving it. The
// file is read through a copy: the edge holds its lock.
func waitDocumentPersisted(t *testing.T, dbPath string) {
	t.Helper()
	testsupport.WaitForNil(t, 20*time.Second, "routing document persisted", func() error {
		b, err := os.ReadFile(dbPath)
		if err != nil {
			return err
		}
		cp := filepath.Join(t.TempDir(), "copy.db")
		if err := os.WriteFile(cp, b, 0o600); err != nil {
			return err
		}
		db, err := bolt.Open(cp, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
		if err != nil {
			return err
		}
		defer db.Close()
		u, err := node.LoadDocument(db)
		if err == nil && u == nil {
			err = errors.New("no document saved yet")
		}
		return err
	})
}
