// Package auth establishes who a proxy is before its ADS stream is bound to
// a scope: a Kubernetes ServiceAccount token sent as gRPC call credentials
// (metadata "authorization: Bearer <jwt>"), or an mTLS client certificate
// whose URI SAN is a SPIFFE ID of the form
// spiffe://<trust-domain>/ns/<namespace>/sa/<serviceaccount>. Either way the
// result is an Identity naming a namespace and a ServiceAccount, which is
// what a ProxyScope admits (see Admits).
package auth

import (
	"context"
	"net/netip"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Method names how an identity was established.
type Method string

const (
	// MethodToken is a ServiceAccount token (bearer call credentials).
	MethodToken Method = "token"
	// MethodSPIFFE is a SPIFFE X.509 SVID presented as the TLS client certificate.
	MethodSPIFFE Method = "spiffe"
)

// Identity is who a proxy proved to be. Pod and node fields come from a
// token bound to a pod (projected tokens are), or from the Pod holding the
// peer address (MethodPeerAddress); they are empty otherwise.
type Identity struct {
	Method         Method
	Namespace      string
	ServiceAccount string
	// SPIFFEID is the certificate's SPIFFE ID (MethodSPIFFE only).
	SPIFFEID string
	PodName  string
	PodUID   string
	NodeName string
	// ServiceAccountUID is the ServiceAccount's UID a token names, so that
	// a token of a deleted and re-created ServiceAccount is told apart.
	ServiceAccountUID string
	// Expiry is when the credential stops being valid (a token's exp);
	// zero when not known. A stream ends then.
	Expiry time.Time
	// PeerAddress is the source address the identity was derived from
	// (MethodPeerAddress only). Such an identity without a Namespace
	// stands for no Pod and is admitted nowhere.
	PeerAddress netip.Addr
}

// String names the identity as Kubernetes names a ServiceAccount user,
// "system:serviceaccount:<namespace>:<name>", followed by the pod it is
// bound to when known: it is what status, CSDS and the proxy-status view
// show.
func (id *Identity) String() string {
	if id == nil {
		return ""
	}
	if id.Method == MethodPeerAddress && id.Namespace == "" {
		return id.refused()
	}
	s := "system:serviceaccount:" + id.Namespace + ":" + id.ServiceAccount
	switch {
	case id.Method == MethodPeerAddress:
		s += " (pod " + id.PodName + ", by peer address " + id.PeerAddress.String() + ")"
	case id.PodName != "":
		s += " (pod " + id.PodName + ")"
	}
	return s
}

// Refused names the identity in a refusal the caller reads: as String,
// except that an identity derived from the peer address names only the
// address, so that no caller learns which Pod, if any, the server takes an
// address for.
func (id *Identity) Refused() string {
	if id != nil && id.Method == MethodPeerAddress {
		return id.refused()
	}
	return id.String()
}

func (id *Identity) refused() string {
	if !id.PeerAddress.IsValid() {
		return "a client presenting no credential"
	}
	return "the client at " + id.PeerAddress.String() + ", which presented no credential"
}

// Authenticator establishes the identity of a new stream from its gRPC
// context. Tokens and SPIFFE certificates are each used when their verifier
// is set; AllowAnonymous lets a stream without credentials through with no
// identity, which is what the insecure opt-out gives up.
type Authenticator struct {
	Tokens *TokenVerifier
	SPIFFE *SPIFFEVerifier
	// PeerAddress derives the identity of a stream without a credential
	// from the one Pod holding its source address, looked up in Pods; only
	// scopes that opt in admit it (Admits). Without a Pod holding the
	// address the stream is refused as by a scope that does not exist;
	// with AllowAnonymous too, it is anonymous instead.
	PeerAddress    bool
	Pods           PodIndex
	AllowAnonymous bool
	// Bindings, when set, refuses a token whose ServiceAccount or bound Pod
	// no longer exists (or was re-created), and tells a stream when they go.
	Bindings Bindings
}

// Bindings knows which ServiceAccounts and Pods exist, so that a token is
// honoured only while the objects it was issued for do: the API server's
// own TokenReview checks the same, a token verified locally is not checked
// by anyone else.
type Bindings interface {
	// Check returns why id's token is no longer valid, nil while it is.
	Check(id *Identity) error
	// Gone returns a channel closed when an object id's token is bound to
	// is deleted, and the function that stops watching.
	Gone(id *Identity) (<-chan struct{}, func())
}

// Gone is Bindings.Gone of a's bindings: nil (never closed) without them
// or for an identity that is not a token's.
// For an identity derived from the peer address it is closed when that
// Pod no longer holds the address (PodIndex.Changed).
func (a *Authenticator) Gone(id *Identity) (<-chan struct{}, func()) {
	switch {
	case a == nil || id == nil:
	case id.Method == MethodPeerAddress && a.Pods != nil && id.PodUID != "":
		return a.Pods.Changed(id.PodUID, id.PeerAddress)
	case id.Method == MethodToken && a.Bindings != nil:
		return a.Bindings.Gone(id)
	}
	return nil, func() {}
}

// noCredentials is the message of a stream that presented nothing the
// server accepts.
const noCredentials = "no credentials: scopeplane requires a ServiceAccount token (gRPC call credentials, metadata authorization: Bearer <token>) or a SPIFFE client certificate; see docs/bootstrap.md"

// Authenticate returns the identity of the stream ctx belongs to, nil for
// an anonymous stream when AllowAnonymous is set, or an Unauthenticated
// status. A bearer token, when sent, is authoritative: an invalid one is
// refused even if a certificate came with it, so a proxy learns that its
// token is wrong instead of silently being someone else. A JWT of the
// published key (PublishedKeyID) is no credential. A stream with no
// credential gets, with PeerAddress, the identity of the Pod holding its
// address (one that no scope admits when no single Pod does).
func (a *Authenticator) Authenticate(ctx context.Context) (*Identity, error) {
	if token, ok, err := bearer(ctx); err != nil {
		return nil, err
	} else if ok && !publishedKeyJWT(token) {
		if a.Tokens == nil {
			return nil, status.Error(codes.Unauthenticated,
				"a bearer token was sent but this server does not accept ServiceAccount tokens (--xds-auth): present a SPIFFE client certificate")
		}
		id, err := a.Tokens.Verify(ctx, token)
		if err == nil && a.Bindings != nil {
			err = a.Bindings.Check(id)
		}
		if err != nil {
			return nil, status.Error(codes.Unauthenticated, "the ServiceAccount token is not accepted: "+err.Error())
		}
		return id, nil
	}
	if a.SPIFFE != nil {
		if certs := peerCertificates(ctx); len(certs) > 0 {
			id, err := a.SPIFFE.Verify(certs)
			if err != nil {
				return nil, status.Error(codes.Unauthenticated, "the client certificate is not accepted: "+err.Error())
			}
			return id, nil
		}
	}
	if a.PeerAddress {
		id := a.byPeerAddress(ctx)
		if id.Namespace == "" && a.AllowAnonymous {
			return nil, nil
		}
		return id, nil
	}
	if a.AllowAnonymous {
		return nil, nil
	}
	return nil, status.Error(codes.Unauthenticated, noCredentials)
}

// bearer returns the token of the stream's authorization metadata. More
// than one authorization value, or one that is not a bearer token, is
// refused rather than guessed at.
func bearer(ctx context.Context) (string, bool, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get("authorization")
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", false, status.Errorf(codes.Unauthenticated, "%d authorization metadata values were sent; send exactly one, \"Bearer <token>\"", len(values))
	}
	scheme, token, ok := strings.Cut(values[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(token) == "" {
		return "", false, status.Error(codes.Unauthenticated, "the authorization metadata is not \"Bearer <token>\"")
	}
	return strings.TrimSpace(token), true, nil
}

func peerCertificates(ctx context.Context) [][]byte {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil
	}
	raw := make([][]byte, 0, len(info.State.PeerCertificates))
	for _, c := range info.State.PeerCertificates {
		raw = append(raw, c.Raw)
	}
	return raw
}

// Admits reports whether a scope in namespace, narrowed to the named
// ServiceAccounts when proxies is not empty, admits id. A nil id (an
// anonymous stream, allowed only with the insecure opt-out) is admitted
// everywhere: that is what the opt-out gives up. An identity derived from
// the peer address is admitted only by a scope that opts in
// (byPeerAddress), and then by the same rules as a credential's.
func Admits(id *Identity, namespace string, proxies []string, byPeerAddress bool) bool {
	if id == nil {
		return true
	}
	if id.Method == MethodPeerAddress && !byPeerAddress {
		return false
	}
	if id.Namespace == "" || id.Namespace != namespace {
		return false
	}
	if len(proxies) == 0 {
		return true
	}
	for _, p := range proxies {
		if p == id.ServiceAccount {
			return true
		}
	}
	return false
}
