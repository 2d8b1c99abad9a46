package migrate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"github.com/caddyserver/certmagic"
)

// Store is what Write needs of a certificate store: certmagic.Storage
// has these methods, and so has NodeStore for the fleet store.
type Store interface {
	// Load returns the value at key, or an error matching fs.ErrNotExist.
	Load(ctx context.Context, key string) ([]byte, error)
	Store(ctx context.Context, key string, value []byte) error
}

// IssuerKey is the storage key component certmagic's ACME issuer files
// certificates under for the ACME directory ca ("acme-v02.api.letsencrypt.org-directory"):
// the edge, started with the same --acme-ca, looks there.
func IssuerKey(ca string) string {
	return (&certmagic.ACMEIssuer{CA: ca}).IssuerKey()
}

// Outcome says what Write did with each name of a certificate.
type Outcome struct {
	// Written are the names stored now; Unchanged those already holding
	// exactly this certificate and key.
	Written, Unchanged []string
	// Kept are the names whose stored certificate, a different one, is
	// valid for longer (the edge renewed it, or a later one was imported
	// first): left as they are.
	Kept []string
}

// meta is certmagic's CertificateResource as stored beside the files
// (certificates/<issuer>/<name>/<name>.json). certmagic loads a
// certificate only when all three keys are there.
type meta struct {
	SANs []string `json:"sans"`
}

// Write stores c under each of its names, with the keys certmagic's
// issuer issuerKey reads (StorageKeys.SiteCert, SitePrivateKey,
// SiteMeta): key and certificate first, the metadata last, so a write cut
// short leaves nothing certmagic would load for a new name, and, for a name
// whose certificate it replaces, the old key put back when the certificate
// could not be written. Writing again what is there
// changes nothing; a name whose stored certificate outlives c is kept.
func Write(ctx context.Context, st Store, issuerKey string, c Cert) (Outcome, error) {
	var out Outcome
	metaJSON, err := json.MarshalIndent(meta{SANs: c.Names}, "", "\t")
	if err != nil {
		return out, err
	}
	for _, name := range c.Names {
		keys := struct{ cert, key, meta string }{
			certmagic.StorageKeys.SiteCert(issuerKey, name),
			certmagic.StorageKeys.SitePrivateKey(issuerKey, name),
			certmagic.StorageKeys.SiteMeta(issuerKey, name),
		}
		same, newer, prevKey, err := stored(ctx, st, keys.cert, keys.key, keys.meta, c)
		if err != nil {
			return out, fmt.Errorf("read stored certificate for %s: %w", name, err)
		}
		switch {
		case same:
			out.Unchanged = append(out.Unchanged, name)
			continue
		case newer:
			out.Kept = append(out.Kept, name)
			continue
		}
		for _, kv := range []struct {
			key string
			val []byte
		}{{keys.key, c.KeyPEM}, {keys.cert, c.CertPEM}, {keys.meta, metaJSON}} {
			if err := st.Store(ctx, kv.key, kv.val); err != nil {
				if kv.key == keys.cert && prevKey != nil {
					// The new key sits beside the old certificate, a pair
					// certmagic refuses: put the old key back so the name
					// keeps its certificate.
					if rerr := st.Store(context.WithoutCancel(ctx), keys.key, prevKey); rerr != nil {
						err = fmt.Errorf("%w (and restoring the previous key failed, so %s's stored certificate does not load until imported again: %v)", err, name, rerr)
					}
				}
				return out, fmt.Errorf("store %s: %w", kv.key, err)
			}
		}
		out.Written = append(out.Written, name)
	}
	return out, nil
}

// stored reports whether the store holds c itself at these keys (all
// three present, certificate and key byte for byte), or a different
// certificate valid for longer than c and for no longer than
// MaxLifetime; prevKey is the stored key when a certificate is stored
// beside it.
func stored(ctx context.Context, st Store, certKey, keyKey, metaKey string, c Cert) (same, newer bool, prevKey []byte, err error) {
	load := func(key string) ([]byte, error) {
		b, err := st.Load(ctx, key)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return b, err
	}
	certPEM, err := load(certKey)
	if err != nil || certPEM == nil {
		return false, false, nil, err
	}
	keyPEM, err := load(keyKey)
	if err != nil {
		return false, false, nil, err
	}
	metaJSON, err := load(metaKey)
	if err != nil {
		return false, false, nil, err
	}
	if bytes.Equal(certPEM, c.CertPEM) && bytes.Equal(keyPEM, c.KeyPEM) && metaJSON != nil {
		return true, false, keyPEM, nil
	}
	// What is stored counts only if certmagic could load it.
	if keyPEM == nil || metaJSON == nil {
		return false, false, keyPEM, nil
	}
	have, _, err := parse(Candidate{CertPEM: certPEM, KeyPEM: keyPEM})
	if err != nil {
		return false, false, keyPEM, nil
	}
	// One valid for longer than a CA issues (imported before Check
	// refused such) keeps nothing out: it would never be renewed.
	return false, withinLifetime(have.Leaf) && have.Leaf.NotAfter.After(c.Leaf.NotAfter), keyPEM, nil
}
