// Package authtest makes the credentials tests authenticate with: a local
// service-account issuer signing tokens, and a CA issuing SPIFFE client
// certificates and the server's TLS certificate.
package authtest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// IssuerURL is the issuer the tokens of an Issuer name.
const IssuerURL = "https://kubernetes.default.svc.cluster.local"

// Issuer is a local service-account issuer: one signing key, and a Keys
// whose availability a test switches off as an API-server outage would.
type Issuer struct {
	t   testing.TB
	key crypto.Signer
	alg jose.SignatureAlgorithm
	kid string

	mu   sync.Mutex
	down bool
	// Fetches counts the calls of Fetch.
	Fetches int
}

// NewIssuer makes an issuer with one ES256 key named kid.
func NewIssuer(t testing.TB, kid string) *Issuer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &Issuer{t: t, key: k, alg: jose.ES256, kid: kid}
}

// NewRSAIssuer makes an issuer with one RS256 key (2048 bits) named kid,
// the kind of key kube-apiserver signs ServiceAccount tokens with by default.
func NewRSAIssuer(t testing.TB, kid string) *Issuer {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return &Issuer{t: t, key: k, alg: jose.RS256, kid: kid}
}

// Fetch implements auth.Keys.
func (i *Issuer) Fetch(context.Context) (string, jose.JSONWebKeySet, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.Fetches++
	if i.down {
		return "", jose.JSONWebKeySet{}, errors.New("connection refused")
	}
	return IssuerURL, jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: i.key.Public(), KeyID: i.kid, Algorithm: string(i.alg), Use: "sig"}}}, nil
}

// FetchCount is Fetches, read under the issuer's lock: fetches run in the
// background.
func (i *Issuer) FetchCount() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.Fetches
}

// SetDown makes Fetch fail, as when the API server is away.
func (i *Issuer) SetDown(down bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.down = down
}

// Claims are a ServiceAccount token's claims as kube-apiserver writes them
// for a projected volume of a pod.
type Claims struct {
	jwt.Claims
	Kubernetes map[string]any `json:"kubernetes.io"`
}

// SAClaims are the claims of a token of ServiceAccount ns/sa, bound to a pod.
func SAClaims(ns, sa, aud string, notBefore, expiry time.Time) Claims {
	return Claims{
		Claims: jwt.Claims{
			Issuer: IssuerURL, Subject: "system:serviceaccount:" + ns + ":" + sa, Audience: jwt.Audience{aud},
			NotBefore: jwt.NewNumericDate(notBefore), IssuedAt: jwt.NewNumericDate(notBefore), Expiry: jwt.NewNumericDate(expiry),
		},
		Kubernetes: map[string]any{
			"namespace":      ns,
			"serviceaccount": map[string]string{"name": sa, "uid": "0a1b"},
			"pod":            map[string]string{"name": "envoy-7f9", "uid": "c2d3"},
			"node":           map[string]string{"name": "node-1", "uid": "e4f5"},
		},
	}
}

// Sign signs c with the issuer's key.
func (i *Issuer) Sign(c Claims) string {
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: i.alg, Key: i.key}, (&jose.SignerOptions{}).WithHeader(jose.HeaderKey("kid"), i.kid))
	if err != nil {
		i.t.Fatal(err)
	}
	raw, err := jwt.Signed(s).Claims(c).Serialize()
	if err != nil {
		i.t.Fatal(err)
	}
	return raw
}

// CA is a test certificate authority issuing client certificates.
type CA struct {
	t    testing.TB
	key  *ecdsa.PrivateKey
	Cert *x509.Certificate
}

// NewCA makes a self-signed CA named name.
func NewCA(t testing.TB, name string) *CA {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{t: t, key: k, Cert: c}
}

// Leaf issues a client certificate with uri as URI SAN (none when empty),
// returning its DER and key.
func (c *CA) Leaf(uri string) ([]byte, *ecdsa.PrivateKey) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		c.t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "proxy"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if uri != "" {
		u, err := url.Parse(uri)
		if err != nil {
			c.t.Fatal(err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.Cert, k.Public(), c.key)
	if err != nil {
		c.t.Fatal(err)
	}
	return der, k
}

// ServerTLS is a TLS configuration for a server on 127.0.0.1 with a
// certificate of c, asking clients for a certificate without verifying it,
// as the xDS server's does: the SPIFFE verifier checks it.
func (c *CA) ServerTLS() *tls.Config {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		c.t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "scopeplane"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.Cert, k.Public(), c.key)
	if err != nil {
		c.t.Fatal(err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: k}},
		ClientAuth:   tls.RequestClientCert, MinVersion: tls.VersionTLS12,
	}
}

// ClientTLS is a TLS configuration trusting c's server certificates,
// presenting the client certificate der (none when nil).
func (c *CA) ClientTLS(der []byte, key *ecdsa.PrivateKey) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(c.Cert)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if der != nil {
		cfg.Certificates = []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}
	}
	return cfg
}

// BundleFile writes the certificates of cas as a PEM trust bundle in dir.
func BundleFile(t testing.TB, dir string, cas ...*CA) string {
	var b []byte
	for _, c := range cas {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Cert.Raw})...)
	}
	p := filepath.Join(dir, "bundle.pem")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
