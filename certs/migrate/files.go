package migrate

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// Size caps of what the import reads; a larger file is refused unread.
const (
	// MaxPEMFile caps a Caddy certificate chain or key file: a chain of a
	// leaf and two intermediates with RSA 4096 keys is under 10 KiB.
	MaxPEMFile = 1 << 20
	// MaxAcmeJSON caps Traefik's acme.json, which holds every certificate
	// of every resolver: about 10 KiB each (the chain and key as base64),
	// so 64 MiB is some 6,000 certificates, above what one Traefik keeps,
	// and an import holding it in memory a few times over stays far below
	// a box's memory.
	MaxAcmeJSON = 64 << 20
)

// Reasons a file is not read.
var (
	ErrNotRegular = errors.New("not a regular file")
	ErrTooLarge   = errors.New("file too large")
)

// readRegular returns the contents of the regular file at path, of at
// most max bytes. With noFollow a symbolic link at path is refused, for
// files found inside a directory another proxy (or an attacker) laid
// out; without it the operator's own path may be a link, to a regular
// file. The file is opened non-blocking, so a FIFO is refused at once
// instead of waiting for a writer, and checked after opening, so what is
// checked is what is read: a device (/dev/zero) never is.
func readRegular(path string, max int64, noFollow bool) ([]byte, error) {
	flags := os.O_RDONLY | syscall.O_NONBLOCK
	if noFollow {
		flags |= syscall.O_NOFOLLOW
	}
	f, err := os.OpenFile(path, flags, 0)
	if errors.Is(err, syscall.ELOOP) && noFollow {
		return nil, fmt.Errorf("read %q: %w (a symbolic link)", path, ErrNotRegular)
	}
	if err != nil {
		return nil, fmt.Errorf("read %q: %w", path, bare(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read %q: %w", path, bare(err))
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("read %q: %w (%s)", path, ErrNotRegular, kind(fi.Mode()))
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("read %q: %w: %d bytes, more than %d", path, ErrTooLarge, fi.Size(), max)
	}
	// The file may grow after Stat: read one byte past the cap to see it.
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %q: %w", path, bare(err))
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("read %q: %w: more than %d bytes", path, ErrTooLarge, max)
	}
	return b, nil
}

// bare drops the path an *fs.PathError repeats, so that the caller's
// quoted path is the only spelling of it in the message.
func bare(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// kind names what a non-regular file is, for the report.
func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	}
	return "mode " + m.String()
}

// ReadTraefikFile reads the acme.json at path (the operator's own path,
// so it may be a link, to a regular file of at most MaxAcmeJSON bytes)
// and returns its certificates as ReadTraefik does.
func ReadTraefikFile(path string) ([]Candidate, error) {
	data, err := readRegular(path, MaxAcmeJSON, false)
	if errors.Is(err, ErrTooLarge) {
		return nil, fmt.Errorf("%w (split it by resolver, e.g. jq '{le}' acme.json > le.json, and import each)", err)
	}
	if err != nil {
		return nil, err
	}
	return ReadTraefik(data)
}
