package xdstls

import (
	"bytes"
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
	"maps"
	"math/big"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Lifetimes of the self-managed CA and serving certificate. The CA is
// replaced at two thirds of its life: the new CA joins the bundle (ca.crt)
// next to the old one, which stays trusted until it expires, and the
// serving certificate is renewed one last time by the old CA at that
// moment. The new CA signs only at the next renewal, two thirds of a
// serving lifetime (20 days) later, so the bootstrap ConfigMaps have
// carried it to every proxy long before any server presents a
// certificate that needs it.
const (
	CALifetime      = 365 * 24 * time.Hour
	ServingLifetime = 30 * 24 * time.Hour
)

// CAKey is the Secret key of the signing CA's private key.
const CAKey = "ca.key"

// SelfSigned keeps a CA and a serving certificate for the xDS port in one
// Secret of scopeplane's own namespace. The leader creates the Secret when
// it is missing and renews what is due (Rotate); every replica serves what
// the Secret holds (Load).
type SelfSigned struct {
	// Reader reads the Secret from the API server, uncached: the manager's
	// cache holds no Secrets, and needs no list or watch on them.
	Reader client.Reader
	// Writer creates and updates it (the leader's client).
	Writer client.Client
	Secret types.NamespacedName
	// DNSNames and IPs are the serving certificate's subject alternative
	// names: what proxies dial (see ServingNames).
	DNSNames []string
	IPs      []net.IP
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

func (s *SelfSigned) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Load sets c from the Secret.
func (s *SelfSigned) Load(ctx context.Context, c *Certificates) error {
	sec := &corev1.Secret{}
	if err := s.Reader.Get(ctx, s.Secret, sec); err != nil {
		return fmt.Errorf("reading the xDS TLS Secret %s: %w", s.Secret, err)
	}
	if err := c.Set(sec.Data[CertFile], sec.Data[KeyFile], sec.Data[CAFile]); err != nil {
		return fmt.Errorf("the xDS TLS Secret %s: %w", s.Secret, err)
	}
	return nil
}

// Rotate creates the Secret when it is missing and renews what is due
// in it, then sets c from it. Only a leader calls it, but with shards
// every shard's leader does: when another's write came first (a conflict,
// or a Secret created meanwhile), Rotate reads the Secret again and takes
// what that leader wrote, renewing only what is still due for its own
// names. A later conflict is retried at the next call.
func (s *SelfSigned) Rotate(ctx context.Context, c *Certificates) error {
	err := s.rotate(ctx, c)
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		err = s.rotate(ctx, c)
	}
	return err
}

func (s *SelfSigned) rotate(ctx context.Context, c *Certificates) error {
	sec := &corev1.Secret{}
	switch err := s.Reader.Get(ctx, s.Secret, sec); {
	case apierrors.IsNotFound(err):
		sec = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.Secret.Namespace, Name: s.Secret.Name, Labels: map[string]string{
				"app.kubernetes.io/managed-by": "scopeplane",
			}},
			Type: corev1.SecretTypeTLS,
		}
		if sec.Data, _, err = s.renew(nil); err != nil {
			return err
		}
		if err := s.Writer.Create(ctx, sec); apierrors.IsForbidden(err) {
			// The chart creates the Secret (empty) and grants no create.
			return fmt.Errorf("the xDS TLS Secret %s is missing and scopeplane may not create it (the Helm chart creates it empty; `helm upgrade` creates it again): %w", s.Secret, err)
		} else if err != nil {
			return fmt.Errorf("creating the xDS TLS Secret %s: %w", s.Secret, err)
		}
	case err != nil:
		return fmt.Errorf("reading the xDS TLS Secret %s: %w", s.Secret, err)
	default:
		data, changed, err := s.renew(sec.Data)
		if err != nil {
			return err
		}
		if changed {
			sec.Data = data
			if err := s.Writer.Update(ctx, sec); err != nil {
				return fmt.Errorf("renewing the xDS TLS Secret %s: %w", s.Secret, err)
			}
		}
	}
	if err := c.Set(sec.Data[CertFile], sec.Data[KeyFile], sec.Data[CAFile]); err != nil {
		return fmt.Errorf("the xDS TLS Secret %s: %w", s.Secret, err)
	}
	return nil
}

// Run calls Rotate (leading) or Load (not leading) at once and then every
// period until ctx ends; every second until the first success (a replica
// starting next to a leader that has not yet created the Secret); while
// the certificate it read lacks a name this replica's flags ask for (every
// slot's, when sharding was just turned on and no leader issued it yet),
// after a second, then twice as long each time up to lackingRetry, so that
// it serves what proxies dial soon after a leader writes it without
// reading the Secret every second for as long as no leader can; and at
// once when the replica becomes the leader, which issues the certificate
// again when it lacks such a name. Errors are logged and retried.
func (s *SelfSigned) Run(ctx context.Context, c *Certificates, leading func() bool, period time.Duration, log logr.Logger) error {
	loaded := false
	retry := time.Second
	for {
		var err error
		lead := leading()
		if lead {
			err = s.Rotate(ctx, c)
		} else {
			err = s.Load(ctx, c)
		}
		wait := period
		if err != nil {
			if loaded || !apierrors.IsNotFound(err) {
				log.Error(err, "the self-managed xDS certificate")
			}
		} else {
			loaded = true
		}
		switch {
		case !loaded:
			wait = min(period, time.Second)
		case err == nil && !c.Names(s.DNSNames, s.IPs):
			wait = min(period, retry)
			retry = min(2*retry, lackingRetry)
		default:
			retry = time.Second
		}
		if !s.await(ctx, wait, lead, leading) {
			return nil
		}
	}
}

// leadershipCheck is how often Run looks whether its replica became the
// leader, and lackingRetry the longest it waits to read the Secret again
// while the certificate lacks a name it serves.
const (
	leadershipCheck = time.Second
	lackingRetry    = 10 * time.Second
)

// await waits for wait, or less when a replica that was not leading
// (lead) becomes the leader; it reports false once ctx ends.
func (s *SelfSigned) await(ctx context.Context, wait time.Duration, lead bool, leading func() bool) bool {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	var check <-chan time.Time
	if !lead {
		t := time.NewTicker(leadershipCheck)
		defer t.Stop()
		check = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return true
		case <-check:
			if leading() {
				return true
			}
		}
	}
}

// renew returns the Secret data with whatever is due renewed, and whether
// anything changed. Data that does not parse is replaced by a new CA.
func (s *SelfSigned) renew(data map[string][]byte) (map[string][]byte, bool, error) {
	now := s.now()
	signer, signerKey, bundle, err := parseCA(data)
	if err != nil {
		ca, key, err := s.newCA(now)
		if err != nil {
			return nil, false, err
		}
		return s.withServing(ca, key, []*x509.Certificate{ca}, key, now, nil, nil)
	}
	// CAs that expired leave the bundle.
	bundle = slices.DeleteFunc(bundle, func(ca *x509.Certificate) bool { return !now.Before(ca.NotAfter) })
	if !now.Before(twoThirds(signer)) {
		// The outgoing CA signs one last serving certificate; the new one
		// joins the bundle and signs from the next renewal on.
		next, nextKey, err := s.newCA(now)
		if err != nil {
			return nil, false, err
		}
		return s.withServing(signer, signerKey, append(bundle, next), nextKey, now, nil, nil)
	}
	if due, keepDNS, keepIPs := s.servingDue(data, bundle, now); due {
		return s.withServing(signer, signerKey, bundle, signerKey, now, keepDNS, keepIPs)
	}
	if len(bundle) != len(parseCerts(data[CAFile])) {
		out := maps.Clone(data)
		out[CAFile] = encodeCerts(bundle)
		return out, true, nil
	}
	return data, false, nil
}

// servingDue reports whether the serving certificate in data must be
// issued again: missing, unreadable, past two thirds of its life, not
// verified by the bundle, or lacking a host of s. One due only for the
// hosts it lacks keeps the hosts it names (keepDNS, keepIPs): leaders that
// ask for different names (of two shard counts, while the count changes)
// then converge on a certificate naming all of them instead of each
// issuing its own in turn. The names no leader asks for go at the next
// renewal.
func (s *SelfSigned) servingDue(data map[string][]byte, bundle []*x509.Certificate, now time.Time) (due bool, keepDNS []string, keepIPs []net.IP) {
	certs := parseCerts(data[CertFile])
	if len(certs) == 0 || len(data[KeyFile]) == 0 {
		return true, nil, nil
	}
	leaf := certs[0]
	if !now.Before(twoThirds(leaf)) {
		return true, nil, nil
	}
	roots := x509.NewCertPool()
	for _, ca := range bundle {
		roots.AddCert(ca)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return true, nil, nil
	}
	for _, name := range s.DNSNames {
		if !slices.Contains(leaf.DNSNames, name) {
			return true, leaf.DNSNames, leaf.IPAddresses
		}
	}
	for _, ip := range s.IPs {
		if !slices.ContainsFunc(leaf.IPAddresses, ip.Equal) {
			return true, leaf.DNSNames, leaf.IPAddresses
		}
	}
	return false, nil, nil
}

// withServing is data holding bundle, signerKey (the key of the CA that
// signs from now on) and a serving certificate issued now by issuer, for
// s's hosts and those of keepDNS and keepIPs.
func (s *SelfSigned) withServing(issuer *x509.Certificate, issuerKey crypto.Signer, bundle []*x509.Certificate, signerKey crypto.Signer, now time.Time, keepDNS []string, keepIPs []net.IP) (map[string][]byte, bool, error) {
	dns := slices.Clone(s.DNSNames)
	for _, name := range keepDNS {
		if !slices.Contains(dns, name) {
			dns = append(dns, name)
		}
	}
	ips := slices.Clone(s.IPs)
	for _, ip := range keepIPs {
		if !slices.ContainsFunc(ips, ip.Equal) {
			ips = append(ips, ip)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, false, err
	}
	sn, err := serial()
	if err != nil {
		return nil, false, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: "scopeplane xDS server"},
		NotBefore:    now.Add(-time.Minute), // clock skew between replicas and proxies
		NotAfter:     minTime(now.Add(ServingLifetime), issuer.NotAfter),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, key.Public(), issuerKey)
	if err != nil {
		return nil, false, fmt.Errorf("issuing the xDS serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, false, err
	}
	caKeyDER, err := x509.MarshalPKCS8PrivateKey(signerKey)
	if err != nil {
		return nil, false, err
	}
	return map[string][]byte{
		CertFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyFile:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		CAFile:   encodeCerts(bundle),
		CAKey:    pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: caKeyDER}),
	}, true, nil
}

func (s *SelfSigned) newCA(now time.Time) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "scopeplane xDS CA " + now.UTC().Format("2006-01-02T15:04:05Z"), Organization: []string{"scopeplane"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(CALifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the xDS CA: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

// parseCA reads the bundle and the signing key from data; the signer is
// the bundle's certificate that matches the key.
func parseCA(data map[string][]byte) (*x509.Certificate, crypto.Signer, []*x509.Certificate, error) {
	bundle := parseCerts(data[CAFile])
	block, _ := pem.Decode(data[CAKey])
	if block == nil {
		return nil, nil, nil, errors.New("no CA key")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, nil, nil, err
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, nil, errors.New("the CA key is not ECDSA")
	}
	for _, ca := range bundle {
		if pub, ok := ca.PublicKey.(*ecdsa.PublicKey); ok && pub.Equal(key.Public()) && ca.IsCA {
			return ca, key, bundle, nil
		}
	}
	return nil, nil, nil, errors.New("no CA in the bundle matches the CA key")
}

func parseCerts(b []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return out
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil && block.Type == "CERTIFICATE" {
			out = append(out, c)
		}
	}
}

func encodeCerts(certs []*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

// twoThirds is the moment two thirds of c's life have passed.
func twoThirds(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

// serial is a random 127-bit certificate serial number.
func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// ServingNames are the names a serving certificate for addr (host:port,
// what proxies dial) needs: an IP, or the DNS name and, for a Service's
// name `<svc>.<namespace>.svc[.cluster.local]`, its other spellings.
func ServingNames(addr string) (dnsNames []string, ips []net.IP, err error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("xDS server address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip != nil {
		return nil, []net.IP{ip}, nil
	}
	labels := strings.Split(strings.TrimSuffix(host, "."), ".")
	if len(labels) >= 3 && labels[2] == "svc" && (len(labels) == 3 || strings.Join(labels[3:], ".") == "cluster.local") {
		svc, ns := labels[0], labels[1]
		return []string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc.cluster.local"}, nil, nil
	}
	return []string{host}, nil, nil
}
