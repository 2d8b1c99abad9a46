// Package migrate brings the certificates another proxy holds (Traefik's
// acme.json, Caddy's certmagic storage) into the edge's certificate store,
// under the keys the edge's own ACME issuer looks for, so the edge serves
// them at once and renews them with its own account when they are due: a
// switch from Traefik or Caddy costs no certificate order.
//
// It reads, checks and writes; it never talks to a CA and never deletes.
// A certificate that fails its check (unparsable PEM, a key that does not
// match, expired, a name that is no host name) is refused and nothing is written for it.
package migrate

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Candidate is one certificate found in another proxy's store, unchecked.
type Candidate struct {
	// Source says where it was found, for the report: a resolver and
	// index of acme.json, or a file path.
	Source string
	// Names are the names the source filed it under (Traefik's
	// domain.main and domain.sans, Caddy's directory name); the report
	// shows them when the certificate itself cannot be read.
	Names []string
	// CertPEM is the certificate and its chain, leaf first; KeyPEM its
	// private key.
	CertPEM, KeyPEM []byte
	// Err is why the source entry could not be read at all (bad base64,
	// a missing key file); Check returns it.
	Err error
}

// Cert is a Candidate that passed Check: what Write stores.
type Cert struct {
	Source string
	// Names are the leaf's DNS names, lower-cased, in the leaf's order:
	// the keys it is stored under.
	Names []string
	Leaf  *x509.Certificate
	// CertPEM and KeyPEM are re-encoded from the parsed blocks: the chain's
	// CERTIFICATE blocks and the one key block, nothing else.
	CertPEM, KeyPEM []byte
}

// Reasons a certificate is refused; Check wraps one of them.
var (
	ErrUnparsable  = errors.New("unparsable PEM")
	ErrKeyMismatch = errors.New("key does not match the certificate")
	ErrExpired     = errors.New("expired")
	ErrNoNames     = errors.New("certificate names no DNS name")
	ErrBadName     = errors.New("certificate names a DNS name that is no hostname")
)

// Check parses c and decides whether it may be imported at now: a chain
// of one or more certificates, a private key whose public half is the
// leaf's, a leaf not expired, naming at least one DNS name and none that
// is no host name.
func Check(c Candidate, now time.Time) (Cert, error) {
	if c.Err != nil {
		return Cert{}, c.Err
	}
	var chain [][]byte
	rest := c.CertPEM
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			chain = append(chain, b.Bytes)
		}
	}
	if len(chain) == 0 {
		return Cert{}, fmt.Errorf("%w: no CERTIFICATE block", ErrUnparsable)
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return Cert{}, fmt.Errorf("%w: certificate: %v", ErrUnparsable, err)
	}
	for i, der := range chain[1:] {
		if _, err := x509.ParseCertificate(der); err != nil {
			return Cert{}, fmt.Errorf("%w: chain certificate %d: %v", ErrUnparsable, i+2, err)
		}
	}
	keyBlock, key, err := parseKey(c.KeyPEM)
	if err != nil {
		return Cert{}, err
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(leaf.PublicKey) {
		return Cert{}, ErrKeyMismatch
	}
	if !now.Before(leaf.NotAfter) {
		return Cert{}, fmt.Errorf("%w on %s", ErrExpired, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	var names []string
	for _, n := range leaf.DNSNames {
		n = strings.TrimSuffix(strings.ToLower(n), ".")
		if n != "" && !hostname(n) {
			return Cert{}, fmt.Errorf("%w: %q", ErrBadName, n)
		}
		if n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return Cert{}, ErrNoNames
	}
	var certPEM bytes.Buffer
	for _, der := range chain {
		pem.Encode(&certPEM, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	return Cert{
		Source:  c.Source,
		Names:   names,
		Leaf:    leaf,
		CertPEM: certPEM.Bytes(),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: keyBlock.Type, Bytes: keyBlock.Bytes}),
	}, nil
}

// hostname reports whether n (lower-cased) is a host name, or "*." and
// one: labels of letters, digits, hyphens and underscores. Anything else
// certmagic would file under another name's keys (KeyBuilder.Safe drops
// "/", "..", spaces, and maps "*" anywhere), replacing its certificate.
func hostname(n string) bool {
	n = strings.TrimPrefix(n, "*.")
	for label := range strings.SplitSeq(n, ".") {
		if label == "" || strings.Trim(label, "abcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			return false
		}
	}
	return true
}

// parseKey returns the first private key block of b and its key, in any
// of the encodings Go's TLS stack reads (PKCS #8, PKCS #1, SEC 1).
func parseKey(b []byte) (*pem.Block, crypto.Signer, error) {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return nil, nil, fmt.Errorf("%w: no private key block", ErrUnparsable)
		}
		if block.Type != "PRIVATE KEY" && !strings.HasSuffix(block.Type, " PRIVATE KEY") {
			continue
		}
		if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
			switch k := k.(type) {
			case *rsa.PrivateKey, *ecdsa.PrivateKey, ed25519.PrivateKey:
				return block, k.(crypto.Signer), nil
			}
			return nil, nil, fmt.Errorf("%w: private key of type %T", ErrUnparsable, k)
		}
		if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
			return block, k, nil
		}
		if k, err := x509.ParseECPrivateKey(block.Bytes); err == nil {
			return block, k, nil
		}
		return nil, nil, fmt.Errorf("%w: private key (%s) is not PKCS #8, PKCS #1 or SEC 1", ErrUnparsable, block.Type)
	}
}
