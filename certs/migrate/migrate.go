// Package migrate brings the certificates another proxy holds (Traefik's
// acme.json, Caddy's certmagic storage) into the edge's certificate store,
// under the keys the edge's own ACME issuer looks for, so the edge serves
// them at once and renews them with its own account when they are due: a
// switch from Traefik or Caddy costs no certificate order.
//
// It reads, checks and writes; it never talks to a CA and never deletes.
// A certificate that fails its check (unparsable PEM, a key that does not
// match, expired, valid for longer than a CA issues, a name that is no
// hostname or is filed under another name's keys, a chain that leads to
// no trusted root) is refused and nothing is written for it.
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
	// a missing key file, a file that is no regular file or is too
	// large); Check returns it.
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

// Reasons a certificate is refused; Check wraps one of them (or one of
// the name rules' in names.go).
var (
	ErrUnparsable  = errors.New("unparsable PEM")
	ErrKeyMismatch = errors.New("key does not match the certificate")
	ErrExpired     = errors.New("expired")
	ErrNotYetValid = errors.New("not yet valid")
	ErrTooLong     = errors.New("valid for longer than a CA issues")
	ErrNoNames     = errors.New("certificate names no DNS name")
	ErrUntrusted   = errors.New("certificate chain is not trusted")
)

// MaxLifetime is the longest validity a publicly trusted CA issues
// (CA/Browser Forum Baseline Requirements 6.3.2: 398 days; later ballots
// shorten it for new certificates, but one issued under this limit may
// still be valid and is imported).
//
// A certificate valid for longer is refused rather than stored with a
// shorter expiry: certmagic reads the expiry, and the renewal window
// (the last third of NotBefore to NotAfter), from the certificate
// itself, not from anything stored beside it, so only a certificate
// within the cap is renewed on time. And Write keeps whichever
// certificate expires later: one valid until 2126 would keep every
// renewal of its names out of the store.
const MaxLifetime = 398 * 24 * time.Hour

// Policy is what Check holds a certificate to beyond being well formed.
type Policy struct {
	// Now is the time validity is checked at; zero: time.Now().
	Now time.Time
	// Roots are the roots a chain must lead to; nil: the system roots.
	Roots *x509.CertPool
	// AllowUntrusted skips the chain check, for a lab's self-signed
	// certificates; every other rule holds.
	AllowUntrusted bool
}

// Check parses c and decides whether it may be imported under p: a chain
// of one or more certificates, a private key whose public half is the
// leaf's, a leaf valid at p.Now and for no longer than MaxLifetime,
// naming at least one DNS name and none checkName refuses, its chain
// leading to one of p.Roots for server authentication.
func Check(c Candidate, p Policy) (Cert, error) {
	cert, chain, err := parse(c)
	if err != nil {
		return Cert{}, err
	}
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	if err := checkValidity(cert.Leaf, now); err != nil {
		return Cert{}, err
	}
	if cert.Names, err = leafNames(cert.Leaf); err != nil {
		return Cert{}, err
	}
	if !p.AllowUntrusted {
		if err := verify(cert.Leaf, chain, p.Roots, now); err != nil {
			return Cert{}, err
		}
	}
	return cert, nil
}

// parse reads c's chain and key and checks that they belong together;
// chain is the certificates after the leaf. It checks nothing else: it
// also reads what the store holds.
func parse(c Candidate) (cert Cert, chain []*x509.Certificate, err error) {
	if c.Err != nil {
		return Cert{}, nil, c.Err
	}
	var ders [][]byte
	rest := c.CertPEM
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			ders = append(ders, b.Bytes)
		}
	}
	if len(ders) == 0 {
		return Cert{}, nil, fmt.Errorf("%w: no CERTIFICATE block", ErrUnparsable)
	}
	leaf, err := x509.ParseCertificate(ders[0])
	if err != nil {
		return Cert{}, nil, fmt.Errorf("%w: certificate: %v", ErrUnparsable, err)
	}
	for i, der := range ders[1:] {
		ca, err := x509.ParseCertificate(der)
		if err != nil {
			return Cert{}, nil, fmt.Errorf("%w: chain certificate %d: %v", ErrUnparsable, i+2, err)
		}
		chain = append(chain, ca)
	}
	keyBlock, key, err := parseKey(c.KeyPEM)
	if err != nil {
		return Cert{}, nil, err
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(leaf.PublicKey) {
		return Cert{}, nil, ErrKeyMismatch
	}
	var certPEM bytes.Buffer
	for _, der := range ders {
		pem.Encode(&certPEM, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	return Cert{
		Source:  c.Source,
		Leaf:    leaf,
		CertPEM: certPEM.Bytes(),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: keyBlock.Type, Bytes: keyBlock.Bytes}),
	}, chain, nil
}

// checkValidity refuses a leaf expired or not yet valid at now, or valid
// for longer than MaxLifetime. A certificate valid only from a later day
// is refused too: it serves no client now, yet its later NotAfter would
// keep the current certificate's renewals out.
func checkValidity(leaf *x509.Certificate, now time.Time) error {
	if !now.Before(leaf.NotAfter) {
		return fmt.Errorf("%w on %s", ErrExpired, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if now.Before(leaf.NotBefore) {
		return fmt.Errorf("%w until %s", ErrNotYetValid, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	if !withinLifetime(leaf) {
		return fmt.Errorf("%w: %d days from %s to %s, more than %d",
			ErrTooLong, int(leaf.NotAfter.Sub(leaf.NotBefore).Hours()/24),
			leaf.NotBefore.UTC().Format(time.DateOnly), leaf.NotAfter.UTC().Format(time.DateOnly), int(MaxLifetime.Hours()/24))
	}
	return nil
}

// withinLifetime reports whether leaf is valid for no longer than MaxLifetime.
func withinLifetime(leaf *x509.Certificate) bool {
	return leaf.NotAfter.Sub(leaf.NotBefore) <= MaxLifetime
}

// leafNames returns the leaf's DNS names, lower-cased, without a trailing
// dot, each once, in the leaf's order; an error when one is refused by
// checkName or there are none.
func leafNames(leaf *x509.Certificate) ([]string, error) {
	var names []string
	for _, n := range leaf.DNSNames {
		n = strings.TrimSuffix(strings.ToLower(n), ".")
		if err := checkName(n); err != nil {
			return nil, err
		}
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil, ErrNoNames
	}
	return names, nil
}

// verify checks that leaf, with the intermediates of chain, leads to one
// of roots (nil: the system roots) at now, for server authentication.
// The name is not checked here: leafNames checked every name.
func verify(leaf *x509.Certificate, chain []*x509.Certificate, roots *x509.CertPool, now time.Time) error {
	inter := x509.NewCertPool()
	for _, c := range chain {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Intermediates: inter,
		Roots:         roots,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUntrusted, err)
	}
	return nil
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
