package handover

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ResetKeyFile holds the key of HTTP/3 stateless resets, inside the state
// directory.
const ResetKeyFile = "quic-reset.key"

// StatelessResetKey returns the key in <dir>/quic-reset.key, creating it
// (random, mode 0600) the first time.
//
// Every edge on the state directory makes its QUIC stateless resets with
// it. A QUIC connection the old edge still held when it stopped (one that
// finished its handshake as the old edge closed, say) has its client's
// next packets reach the new edge, which knows nothing of it: with the same
// key, the new edge's stateless reset is one the client believes, and the
// request fails at once (and is tried again on a new connection) instead
// of waiting out the idle timeout.
func StatelessResetKey(dir string) (key [32]byte, err error) {
	path := filepath.Join(dir, ResetKeyFile)
	for range 2 { // created by another edge between our read and our link: read again
		b, err := os.ReadFile(path)
		switch {
		case err == nil && len(b) == len(key):
			copy(key[:], b)
			return key, nil
		case err == nil:
			return key, fmt.Errorf("stateless reset key %s: %d bytes, want %d", path, len(b), len(key))
		case !errors.Is(err, fs.ErrNotExist):
			return key, fmt.Errorf("stateless reset key: %w", err)
		}
		if err := create(path); err != nil && !errors.Is(err, fs.ErrExist) {
			return key, fmt.Errorf("stateless reset key: %w", err)
		}
	}
	return key, fmt.Errorf("stateless reset key %s: not readable after creating it", path)
}

// create writes a new random key to path, never over an existing one: the
// key is written to a temporary file and linked into place.
func create(path string) error {
	var key [32]byte
	rand.Read(key[:])
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+ResetKeyFile+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.Write(key[:])
	if err := errors.Join(werr, tmp.Sync(), tmp.Close()); err != nil {
		return err
	}
	return os.Link(tmp.Name(), path)
}
