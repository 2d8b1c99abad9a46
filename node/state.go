package node

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// StateFile is the name of the bbolt file inside the state directory.
const StateFile = "edge.db"

// stateLockTimeout bounds the wait for another process's lock on the state
// file: bbolt would otherwise wait forever, and an edge that hangs at start
// is worse than one that says why it cannot start.
const stateLockTimeout = 3 * time.Second

// routingBucket holds the last good routing document.
var routingBucket = []byte("routing")

var (
	keyBody        = []byte("body")
	keyFingerprint = []byte("fingerprint")
	keyFetchedAt   = []byte("fetched_at")
)

// errCorrupt marks a state file bbolt cannot read as a database.
var errCorrupt = errors.New("not a sound bbolt file")

// OpenState opens (creating if needed) the edge's bbolt state at
// <dir>/edge.db: the directory 0700, the file 0600, since it holds
// certificate keys. Other packages keep their own buckets in the same file,
// so OpenState only makes sure the file is sound and writable.
//
// Every failure is an error that names the file, never a hang or a silent
// fallback:
//   - a file locked by another process fails after a few seconds;
//   - an unwritable directory or file fails with the OS's reason;
//   - a corrupt file (not a bbolt file, bad meta pages, a failed
//     consistency check) is renamed to edge.db.corrupt-<UTC time> — never
//     deleted — and OpenState refuses to start. Starting with an empty store
//     instead would quietly throw away every certificate and the ACME
//     account; refusing makes an operator look once. The next start, with
//     the bad file out of the way, begins with an empty state.
func OpenState(dir string, log zerolog.Logger) (*bolt.DB, error) {
	if dir == "" {
		return nil, errors.New("open state: empty state directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state directory: %w", err)
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("stat state directory: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("state directory %s is not a directory", dir)
	} else if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		// Not changed here: it may be a volume an operator set up on purpose.
		log.Warn().Str("dir", dir).Str("mode", fmt.Sprintf("%04o", perm)).
			Msg("state directory is accessible by group or others; it holds certificate keys, 0700 is advised")
	}
	path := filepath.Join(dir, StateFile)
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return nil, fmt.Errorf("restrict state file %s to 0600: %w", path, err)
		}
		log.Warn().Str("file", path).Str("was", fmt.Sprintf("%04o", fi.Mode().Perm())).
			Msg("state file was readable by group or others; changed it to 0600")
	}

	db, err := openBolt(path)
	switch {
	case err == nil:
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("open state file %s: locked by another process for %s (is another scafo-edge using this state directory?): %w", path, stateLockTimeout, err)
	case errors.Is(err, errCorrupt):
		return nil, moveAside(path, err, log)
	default:
		return nil, fmt.Errorf("open state file %s: %w", path, err)
	}
	if err := check(db); err != nil {
		db.Close()
		return nil, moveAside(path, err, log)
	}
	// A write proves the file (and the disk under it) take writes now,
	// rather than at the first certificate.
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(routingBucket)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("write state file %s: %w", path, err)
	}
	return db, nil
}

// openBolt opens path, turning bbolt's corruption errors and panics (a
// damaged freelist can panic inside Open) into errCorrupt. After a panic the
// half-opened file's descriptor is lost with bbolt's DB value; the process
// is about to refuse to start, so that leak is harmless.
func openBolt(path string) (db *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("%w: bbolt panicked opening it: %v", errCorrupt, r)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: stateLockTimeout})
	if errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrVersionMismatch) || errors.Is(err, berrors.ErrChecksum) {
		err = fmt.Errorf("%w: %w", errCorrupt, err)
	}
	return db, err
}

// check runs bbolt's consistency check, which reads every page: cheap for
// a state file of certificates, and it finds damage at start rather than as
// a panic in the middle of serving.
func check(db *bolt.DB) error {
	return db.View(func(tx *bolt.Tx) error {
		var first error
		for err := range tx.Check() {
			if first == nil {
				first = err
			}
		}
		if first != nil {
			return fmt.Errorf("%w: consistency check: %w", errCorrupt, first)
		}
		return nil
	})
}

// moveAside renames a corrupt state file out of the way and returns the
// refusal that names both files.
func moveAside(path string, cause error, log zerolog.Logger) error {
	aside := path + ".corrupt-" + time.Now().UTC().Format("20060102T150405Z")
	for i := 1; ; i++ {
		if _, err := os.Lstat(aside); errors.Is(err, fs.ErrNotExist) {
			break
		}
		aside = fmt.Sprintf("%s.corrupt-%s.%d", path, time.Now().UTC().Format("20060102T150405Z"), i)
	}
	if err := os.Rename(path, aside); err != nil {
		return fmt.Errorf("state file %s is corrupt (%w) and could not be moved aside: %w; move or restore it by hand", path, cause, err)
	}
	log.Error().Str("file", path).Str("moved_to", aside).Err(cause).Msg("state file is corrupt; moved it aside")
	return fmt.Errorf("state file %s is corrupt (%w): moved it aside to %s and refusing to start with an empty state, which would lose its certificates and account; restore it from a backup, or start again to begin empty", path, cause, aside)
}

// SaveDocument persists u as the last good routing document, with its
// fingerprint and fetch time, replacing the one before.
func SaveDocument(db *bolt.DB, u Update) error {
	if len(u.Body) == 0 {
		return errors.New("save routing document: empty body")
	}
	fp := u.Fingerprint
	if fp == "" {
		fp = Fingerprint(u.Body)
	}
	at, err := u.FetchedAt.UTC().MarshalText()
	if err != nil {
		return fmt.Errorf("save routing document: fetch time: %w", err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(routingBucket)
		if err != nil {
			return err
		}
		for _, kv := range [][2][]byte{{keyBody, u.Body}, {keyFingerprint, []byte(fp)}, {keyFetchedAt, at}} {
			if err := b.Put(kv[0], kv[1]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("save routing document: %w", err)
	}
	return nil
}

// LoadDocument returns the persisted routing document, re-parsed and
// marked Stale, or nil and no error when none was ever saved. A persisted
// body that no longer parses (saved by another version, say) or that does
// not match its fingerprint is an error; the caller starts without it.
func LoadDocument(db *bolt.DB) (*Update, error) {
	var body, fp, at []byte
	err := db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(routingBucket)
		if b == nil {
			return nil
		}
		// Values are only valid inside the transaction: copy them out.
		body = bytes.Clone(b.Get(keyBody))
		fp = bytes.Clone(b.Get(keyFingerprint))
		at = bytes.Clone(b.Get(keyFetchedAt))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load routing document: %w", err)
	}
	if body == nil {
		return nil, nil
	}
	got := Fingerprint(body)
	if string(fp) != got {
		return nil, fmt.Errorf("load routing document: stored fingerprint %.12s does not match the body's %.12s", fp, got)
	}
	doc, err := Parse(body)
	if err != nil {
		return nil, fmt.Errorf("load routing document: %w", err)
	}
	u := &Update{Doc: doc, Body: body, Fingerprint: got, Stale: true}
	if err := u.FetchedAt.UnmarshalText(at); err != nil {
		return nil, fmt.Errorf("load routing document: fetch time: %w", err)
	}
	return u, nil
}
