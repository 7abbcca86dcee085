package auth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

const testIssuer = "https://kubernetes.default.svc.cluster.local"

// issuer is a local service-account issuer: one signing key, and a Keys
// whose availability a test switches off as an API-server outage would.
type issuer struct {
	t   testing.TB
	key *ecdsa.PrivateKey
	kid string

	mu      sync.Mutex
	down    bool
	fetches int
}

func newIssuer(t testing.TB, kid string) *issuer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &issuer{t: t, key: k, kid: kid}
}

func (i *issuer) Fetch(context.Context) (string, jose.JSONWebKeySet, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.fetches++
	if i.down {
		return "", jose.JSONWebKeySet{}, errors.New("connection refused")
	}
	return testIssuer, jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: i.key.Public(), KeyID: i.kid, Algorithm: string(jose.ES256), Use: "sig"}}}, nil
}

func (i *issuer) setDown(down bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.down = down
}

// claims are a ServiceAccount token's claims as kube-apiserver writes them
// for a projected volume of a pod.
type claims struct {
	jwt.Claims
	Kubernetes map[string]any `json:"kubernetes.io"`
}

func saClaims(ns, sa, aud string, notBefore, expiry time.Time) claims {
	return claims{
		Claims: jwt.Claims{
			Issuer: testIssuer, Subject: "system:serviceaccount:" + ns + ":" + sa, Audience: jwt.Audience{aud},
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

func (i *issuer) sign(c claims) string {
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: i.key}, (&jose.SignerOptions{}).WithHeader(jose.HeaderKey("kid"), i.kid))
	if err != nil {
		i.t.Fatal(err)
	}
	raw, err := jwt.Signed(s).Claims(c).Serialize()
	if err != nil {
		i.t.Fatal(err)
	}
	return raw
}

// ca is a test certificate authority issuing client certificates.
type ca struct {
	t    testing.TB
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
}

func newCA(t testing.TB, name string) *ca {
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
	return &ca{t: t, key: k, cert: c}
}

// leaf issues a client certificate with uri as URI SAN (none when empty),
// returning its DER and key.
func (c *ca) leaf(uri string) ([]byte, *ecdsa.PrivateKey) {
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
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, k.Public(), c.key)
	if err != nil {
		c.t.Fatal(err)
	}
	return der, k
}
