package auth

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Config is the command line's choice of how proxies authenticate.
type Config struct {
	// Methods are the accepted credentials, a comma-separated list of
	// "token", "spiffe" and "peer-address" (no credential: the Pod holding
	// the source address, for scopes that opt in).
	Methods string
	// Audience is the audience a ServiceAccount token must carry.
	Audience string
	// TrustDomain and TrustBundle are the SPIFFE trust domain and the PEM
	// file of its CA certificates, for "spiffe".
	TrustDomain string
	TrustBundle string
	// AllowAnonymous admits streams that present no credentials.
	AllowAnonymous bool
	// MaxTokenLifetime is the longest lifetime of a token accepted.
	MaxTokenLifetime time.Duration
}

// Build makes the authenticator of c, reading keys and reviewing tokens
// through the API server cfg reaches. It fails on an unknown method, and
// on "spiffe" without a readable trust bundle.
func (c Config) Build(cfg *rest.Config) (*Authenticator, error) {
	a := &Authenticator{AllowAnonymous: c.AllowAnonymous}
	for _, m := range strings.Split(c.Methods, ",") {
		switch strings.TrimSpace(m) {
		case "":
		case string(MethodToken):
			if c.Audience == "" {
				return nil, fmt.Errorf("--xds-token-audience is empty: tokens need an audience")
			}
			keys, err := NewAPIServerKeys(cfg)
			if err != nil {
				return nil, err
			}
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return nil, err
			}
			a.Tokens = NewTokenVerifier(c.Audience, keys, &TokenReviewer{Client: cs})
			a.Tokens.MaxLifetime = c.MaxTokenLifetime
		case string(MethodSPIFFE):
			if c.TrustBundle == "" {
				return nil, fmt.Errorf("--xds-auth=spiffe needs --xds-spiffe-trust-bundle, the PEM file of the trust domain's CA certificates")
			}
			v, err := NewSPIFFEVerifier(c.TrustDomain, c.TrustBundle)
			if err != nil {
				return nil, err
			}
			a.SPIFFE = v
		case string(MethodPeerAddress):
			// The Pod index comes from the manager's cache
			// (controlplane.Setup).
			a.PeerAddress = true
		default:
			return nil, fmt.Errorf("--xds-auth: unknown method %q (want token, spiffe, peer-address, comma-separated)", m)
		}
	}
	if a.Tokens == nil && a.SPIFFE == nil && !a.PeerAddress && !a.AllowAnonymous {
		return nil, fmt.Errorf("--xds-auth names no method and --xds-allow-anonymous is false: no proxy could connect")
	}
	return a, nil
}
