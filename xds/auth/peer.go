package auth

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/grpc/peer"
)

// MethodPeerAddress is an identity derived from the connection's source
// address: the one Running Pod that holds it. It is no credential, only
// where the packets came from, so a scope honours it only when it opts in
// (spec.admitByPeerAddress); docs/bootstrap.md writes down what it trusts.
const MethodPeerAddress Method = "peer-address"

// PublishedKeyID is the key id (a service-account key's private_key_id,
// which gRPC's google_default credentials put in the kid header of the JWT
// they sign) of the identity-less key every bootstrap ConfigMap publishes,
// tls-only-key.json. grpc-js-xds and gRPC C-core need a service-account
// key to speak TLS to the xDS port at all (their google_default channel
// credentials are TLS plus such a JWT); since the key is public, a JWT
// carrying this kid proves nothing and is treated as no credential,
// whoever signed it.
const PublishedKeyID = "scopeplane-tls-only-key"

// Pod is what the peer-address method needs to know of a Pod that holds an
// address.
type Pod struct {
	Namespace, Name, UID string
	ServiceAccount       string
	NodeName             string
	// Running is status.phase Running; Terminal is status.phase Succeeded
	// or Failed; Deleting is a set deletionTimestamp; HostNetwork is
	// spec.hostNetwork.
	Running     bool
	Terminal    bool
	Deleting    bool
	HostNetwork bool
}

// PodIndex finds the Pods that hold an address, from an informer's cache.
type PodIndex interface {
	// Holders returns the Pods whose status.podIPs include addr, and
	// whether addr is some Pod's status.hostIPs (a Node's address). It
	// fails while the index cannot answer yet (not synced).
	Holders(addr netip.Addr) (pods []Pod, nodeAddress bool, err error)
	// Changed returns a channel closed when the Pod of uid no longer
	// holds addr (deleted, its address changed, or it stopped Running),
	// or when another Pod not in a terminal phase lists addr too, and the
	// function that stops watching.
	Changed(uid string, addr netip.Addr) (<-chan struct{}, func())
}

// peerAddr is the client IP address of the stream of ctx, IPv4 addresses
// carried in IPv6 (::ffff:a.b.c.d, how a dual-stack listener reports them)
// unmapped, so that they match the Pods' IPv4 addresses.
func peerAddr(ctx context.Context) (netip.Addr, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}, false
	}
	var addr netip.Addr
	switch a := p.Addr.(type) {
	case *net.TCPAddr:
		addr, ok = netip.AddrFromSlice(a.IP)
	default:
		ap, err := netip.ParseAddrPort(p.Addr.String())
		addr, ok = ap.Addr(), err == nil
	}
	if !ok {
		return netip.Addr{}, false
	}
	return addr.Unmap().WithZone(""), true
}

// errNoHolder is why a peer address names no Pod; it is never shown to
// the caller, whose refusal is the uniform one of a scope that does not
// admit it.
var errNoHolder = errors.New("the address is held by no single Running Pod")

// byPeerAddress derives the identity of a stream that presented no
// credential from its source address: exactly one Running, not deleting,
// not host-network Pod holds it, and it is no Node's address. A Pod in a
// terminal phase (Succeeded, Failed) holds no address: its sandbox is gone
// and the address may already be another Pod's, while the Pod object stays
// until it is deleted (a Job's Pods, kept for their logs, for days). Otherwise it
// returns an identity that names only the address, which every scope
// refuses (Admits), so that the refusal reads as any other.
func (a *Authenticator) byPeerAddress(ctx context.Context) *Identity {
	addr, ok := peerAddr(ctx)
	if !ok {
		return &Identity{Method: MethodPeerAddress}
	}
	id, _ := PeerIdentity(a.Pods, addr)
	return id
}

// PeerIdentity is the identity addr stands for in pods (see
// byPeerAddress), and why it stands for none. The identity is never nil:
// one without a namespace is admitted nowhere.
func PeerIdentity(pods PodIndex, addr netip.Addr) (*Identity, error) {
	id := &Identity{Method: MethodPeerAddress, PeerAddress: addr}
	if pods == nil {
		return id, errors.New("no Pod index")
	}
	all, node, err := pods.Holders(addr)
	var holders []Pod
	for _, p := range all {
		if !p.Terminal {
			holders = append(holders, p)
		}
	}
	switch {
	case err != nil:
		return id, err
	case node:
		return id, fmt.Errorf("%s is a Node's address", addr)
	case len(holders) != 1:
		return id, fmt.Errorf("%w: %d Pods hold %s", errNoHolder, len(holders), addr)
	}
	p := holders[0]
	switch {
	case p.HostNetwork:
		return id, fmt.Errorf("%w: Pod %s/%s is on the host network", errNoHolder, p.Namespace, p.Name)
	case p.Deleting:
		return id, fmt.Errorf("%w: Pod %s/%s is being deleted", errNoHolder, p.Namespace, p.Name)
	case !p.Running:
		return id, fmt.Errorf("%w: Pod %s/%s is not Running", errNoHolder, p.Namespace, p.Name)
	case p.Namespace == "" || p.ServiceAccount == "":
		return id, fmt.Errorf("%w: Pod %s/%s names no ServiceAccount", errNoHolder, p.Namespace, p.Name)
	}
	id.Namespace, id.ServiceAccount, id.PodName, id.PodUID, id.NodeName = p.Namespace, p.ServiceAccount, p.Name, p.UID, p.NodeName
	return id, nil
}

// publishedKeyJWT reports whether token is a JWT whose header names
// PublishedKeyID: the published key's, which is no credential. Only the
// header is read, and the signature is not checked, as it would prove
// nothing; the header's base64url may carry padding, which JWTs must not
// but gRPC C-core 1.51's do.
func publishedKeyJWT(token string) bool {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return false
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[0], "="))
	if err != nil {
		return false
	}
	var header struct {
		KeyID string `json:"kid"`
	}
	return json.Unmarshal(raw, &header) == nil && header.KeyID == PublishedKeyID
}
