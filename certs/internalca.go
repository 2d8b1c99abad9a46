package certs

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"time"

	"github.com/caddyserver/certmagic"
)

// Storage keys of the internal CA. It lives in the configured storage, so a
// fleet sharing one store also shares one root that clients trust.
const (
	internalRootCertKey = "scafo-internal-ca/root.crt"
	internalRootKeyKey  = "scafo-internal-ca/root.key"
	internalCALock      = "scafo_internal_ca_create"

	internalRootLifetime = 10 * 365 * 24 * time.Hour
	// internalLeafLifetime is short, as Caddy's internal issuer's is: the CA
	// publishes no revocation, so expiry is the only way a key ages out.
	// certmagic renews at a third of the lifetime left.
	internalLeafLifetime = 7 * 24 * time.Hour
)

// internalCA issues certificates from a root kept in storage, for
// `--tls internal`.
type internalCA struct {
	root    *x509.Certificate
	rootPEM []byte
	key     crypto.Signer
}

var _ certmagic.Issuer = (*internalCA)(nil)

// loadOrCreateInternalCA returns the CA kept in s, creating it under a lock
// when there is none, so edges sharing a store agree on one root.
func loadOrCreateInternalCA(ctx context.Context, s certmagic.Storage) (*internalCA, error) {
	if ca, err := loadInternalCA(ctx, s); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return ca, err
	}
	if err := s.Lock(ctx, internalCALock); err != nil {
		return nil, fmt.Errorf("lock internal ca: %w", err)
	}
	defer s.Unlock(context.WithoutCancel(ctx), internalCALock)
	// Another edge may have created it while we waited for the lock.
	if ca, err := loadInternalCA(ctx, s); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return ca, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate internal ca key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "scafo-edge internal root " + serial.Text(16)[:8], Organization: []string{"scafo-edge"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(internalRootLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create internal root: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode internal ca key: %w", err)
	}
	// The key first: a root certificate without its key would be loaded as
	// a broken CA by the next start.
	if err := s.Store(ctx, internalRootKeyKey, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})); err != nil {
		return nil, fmt.Errorf("store internal ca key: %w", err)
	}
	if err := s.Store(ctx, internalRootCertKey, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})); err != nil {
		return nil, fmt.Errorf("store internal root: %w", err)
	}
	return loadInternalCA(ctx, s)
}

func loadInternalCA(ctx context.Context, s certmagic.Storage) (*internalCA, error) {
	certPEM, err := s.Load(ctx, internalRootCertKey)
	if err != nil {
		return nil, fmt.Errorf("load internal root: %w", err)
	}
	keyPEM, err := s.Load(ctx, internalRootKeyKey)
	if err != nil {
		return nil, fmt.Errorf("load internal ca key: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("load internal ca: stored PEM does not decode")
	}
	root, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse internal root: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse internal ca key: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("internal ca key is a %T, not a signer", k)
	}
	return &internalCA{root: root, rootPEM: certPEM, key: signer}, nil
}

func randomSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("random serial: %w", err)
	}
	return serial, nil
}

// IssuerKey names the internal CA's directory in storage.
func (ca *internalCA) IssuerKey() string { return "scafo-internal" }

// Issue signs csr's names with the internal root.
func (ca *internalCA) Issue(_ context.Context, csr *x509.CertificateRequest) (*certmagic.IssuedCertificate, error) {
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("internal ca: check csr: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(internalLeafLifetime),
		DNSNames:     csr.DNSNames,
		IPAddresses:  csr.IPAddresses,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.root, csr.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("internal ca: sign: %w", err)
	}
	return &certmagic.IssuedCertificate{Certificate: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}
