package auth

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"k8s.io/apimachinery/pkg/util/validation"
)

// SPIFFEVerifier verifies client certificates as X.509 SVIDs of one trust
// domain against a trust bundle read from a PEM file. The file is read
// again when its modification time or size changes, checked at most once
// a second, so a rotated bundle takes effect without a restart; a file
// that stops parsing keeps the last good bundle and the error is returned
// by Reload for the caller to log.
type SPIFFEVerifier struct {
	trustDomain spiffeid.TrustDomain
	path        string

	mu      sync.Mutex
	bundle  *x509bundle.Bundle
	modTime time.Time
	size    int64
	checked time.Time
	now     func() time.Time
}

// NewSPIFFEVerifier reads the bundle at path for trustDomain (for example
// "cluster.local"); it fails when the trust domain is not valid or the file
// holds no certificate.
func NewSPIFFEVerifier(trustDomain, path string) (*SPIFFEVerifier, error) {
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		return nil, fmt.Errorf("SPIFFE trust domain %q: %w", trustDomain, err)
	}
	v := &SPIFFEVerifier{trustDomain: td, path: path, now: time.Now}
	if err := v.Reload(); err != nil {
		return nil, err
	}
	return v, nil
}

// Reload reads the bundle file again when it changed since the last read.
func (v *SPIFFEVerifier) Reload() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.reloadLocked()
}

func (v *SPIFFEVerifier) reloadLocked() error {
	v.checked = v.now()
	fi, err := os.Stat(v.path)
	if err != nil {
		return fmt.Errorf("SPIFFE trust bundle: %w", err)
	}
	if v.bundle != nil && fi.ModTime().Equal(v.modTime) && fi.Size() == v.size {
		return nil
	}
	b, err := x509bundle.Load(v.trustDomain, v.path)
	if err != nil {
		return fmt.Errorf("SPIFFE trust bundle %s: %w", v.path, err)
	}
	if b.Empty() {
		return fmt.Errorf("SPIFFE trust bundle %s holds no certificate", v.path)
	}
	v.bundle, v.modTime, v.size = b, fi.ModTime(), fi.Size()
	return nil
}

func (v *SPIFFEVerifier) current() *x509bundle.Bundle {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.now().Sub(v.checked) >= time.Second {
		// A failed reload keeps the last good bundle; the next one retries.
		_ = v.reloadLocked()
	}
	return v.bundle
}

// Verify checks a client's certificate chain (leaf first, DER) against the
// bundle and returns the ServiceAccount its SPIFFE ID names.
func (v *SPIFFEVerifier) Verify(raw [][]byte) (*Identity, error) {
	certs := make([]*x509.Certificate, 0, len(raw))
	for _, r := range raw {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return nil, errors.New("it does not parse as X.509")
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no certificate was presented")
	}
	if _, err := x509svid.IDFromCert(certs[0]); err != nil {
		return nil, fmt.Errorf("it carries no SPIFFE ID (want one URI SAN spiffe://%s/ns/<namespace>/sa/<serviceaccount>)", v.trustDomain)
	}
	id, _, err := x509svid.Verify(certs, v.current(), x509svid.WithTime(v.now()))
	if err != nil {
		return nil, fmt.Errorf("it does not verify against the trust bundle of %s (--xds-spiffe-trust-bundle): %w", v.trustDomain, err)
	}
	ns, sa, err := serviceAccountOf(id.Path())
	if err != nil {
		return nil, fmt.Errorf("SPIFFE ID %s: %w", id, err)
	}
	return &Identity{Method: MethodSPIFFE, Namespace: ns, ServiceAccount: sa, SPIFFEID: id.String()}, nil
}

// serviceAccountOf parses the Kubernetes form of a SPIFFE ID path,
// /ns/<namespace>/sa/<serviceaccount>.
func serviceAccountOf(path string) (string, string, error) {
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	if len(parts) != 4 || parts[0] != "ns" || parts[2] != "sa" {
		return "", "", errors.New("the path is not /ns/<namespace>/sa/<serviceaccount>")
	}
	if errs := validation.IsDNS1123Label(parts[1]); len(errs) > 0 {
		return "", "", fmt.Errorf("the namespace %s", strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(parts[3]); len(errs) > 0 {
		return "", "", fmt.Errorf("the ServiceAccount %s", strings.Join(errs, "; "))
	}
	return parts[1], parts[3], nil
}
