// Package xdstls is the TLS of the xDS port: the serving certificate every
// new handshake gets, loaded from a mounted Secret's files (cert-manager's,
// or one the user makes) and reloaded when they change, or from a CA that
// scopeplane keeps itself in a Secret of its own namespace (SelfSigned). It
// also holds the CA bundle proxies must trust, which the bootstrap
// ConfigMaps carry to them.
package xdstls

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/scopeplane/scopeplane/xds/metrics"
)

// Names of the files in a TLS directory, and of the keys of a TLS Secret:
// the serving certificate (chain), its key, and the CA bundle proxies trust.
const (
	CertFile = corev1.TLSCertKey
	KeyFile  = corev1.TLSPrivateKeyKey
	CAFile   = "ca.crt"
)

// Certificates is the serving certificate and CA bundle in use. New TLS
// handshakes get what was Set last; connections already open keep theirs.
// It is safe for concurrent use.
type Certificates struct {
	mu      sync.Mutex
	cert    *tls.Certificate
	certPEM []byte
	keyPEM  []byte
	ca      []byte
	changed chan struct{}
	now     func() time.Time
}

// NewCertificates returns an empty set; handshakes fail until Set.
func NewCertificates() *Certificates {
	return &Certificates{changed: make(chan struct{}), now: time.Now}
}

// Set replaces the serving certificate (PEM chain and key) and the CA
// bundle proxies trust. It refuses a pair that does not match, a bundle
// that holds no certificate, and a certificate the bundle does not verify
// now, keeping what it had: proxies would refuse it anyway.
func (c *Certificates) Set(certPEM, keyPEM, caPEM []byte) error {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("the serving certificate (%s, %s): %w", CertFile, KeyFile, err)
	}
	roots := x509.NewCertPool()
	if len(bytes.TrimSpace(caPEM)) == 0 || !roots.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("the CA bundle (%s) holds no PEM certificate: the bootstraps could not tell proxies what to trust", CAFile)
	}
	intermediates := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if ic, err := x509.ParseCertificate(der); err == nil {
			intermediates.AddCert(ic)
		}
	}
	chains, err := cert.Leaf.Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: intermediates, CurrentTime: c.now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("the serving certificate (%s) does not verify against the CA bundle (%s), so proxies would refuse it: %w", CertFile, CAFile, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if bytes.Equal(c.certPEM, certPEM) && bytes.Equal(c.keyPEM, keyPEM) && bytes.Equal(c.ca, caPEM) {
		return nil
	}
	c.cert, c.certPEM, c.keyPEM, c.ca = &cert, bytes.Clone(certPEM), bytes.Clone(keyPEM), bytes.Clone(caPEM)
	metrics.CertificateExpiry.WithLabelValues(metrics.CertificateServing).Set(float64(cert.Leaf.NotAfter.Unix()))
	metrics.CertificateExpiry.WithLabelValues(metrics.CertificateCA).Set(float64(chainExpiry(chains).Unix()))
	close(c.changed)
	c.changed = make(chan struct{})
	return nil
}

// CABundle is the PEM bundle proxies must trust, nil before the first Set.
func (c *Certificates) CABundle() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ca
}

// Changed is closed at the next Set that changes something.
func (c *Certificates) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// Names reports whether the serving certificate names every one of dns
// and ips (false before the first Set).
func (c *Certificates) Names(dns []string, ips []net.IP) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert == nil {
		return false
	}
	leaf := c.cert.Leaf
	for _, name := range dns {
		if !slices.Contains(leaf.DNSNames, name) {
			return false
		}
	}
	for _, ip := range ips {
		if !slices.ContainsFunc(leaf.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// Loaded reports whether a certificate is there to serve.
func (c *Certificates) Loaded() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert == nil {
		return errNoCertificate
	}
	return nil
}

// chainExpiry is when the CA that verifies the serving certificate expires:
// the latest expiry of the roots its verified chains end in. Other CAs of the
// bundle (an old one kept during a rotation) do not count: the server's
// certificate does not depend on them.
func chainExpiry(chains [][]*x509.Certificate) time.Time {
	var latest time.Time
	for _, chain := range chains {
		if root := chain[len(chain)-1]; root.NotAfter.After(latest) {
			latest = root.NotAfter
		}
	}
	return latest
}

var errNoCertificate = errors.New("no xDS serving certificate loaded yet")

// ServerConfig is the TLS configuration of the xDS port: TLS 1.2 at least
// (1.3 when the proxy offers it, which Envoy and gRPC do), HTTP/2 by ALPN,
// and the certificate of the moment for each handshake. A client
// certificate is requested but neither required nor verified here: proxy
// authentication verifies it inside the gRPC handler, so that a refusal
// is a gRPC status the proxy can read rather than a failed handshake.
func (c *Certificates) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
		ClientAuth: tls.RequestClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.cert == nil {
				return nil, errNoCertificate
			}
			return c.cert, nil
		},
	}
}
