package adsclient

import (
	"fmt"
	"slices"

	// Registered so that names are found by descriptor and Config.Validate can decode the
	// types scopeplane serves, and the extensions they pack, even when the caller imports
	// none of them.
	_ "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/stateful_session/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/http/stateful_session/cookie/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/http/stateful_session/header/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/scopeplane/scopeplane/xds/envoyvalid"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// resourceWrapperType is the type URL of discoveryv3.Resource, which a SotW response may use to
// wrap a resource (to give it a TTL, or to send a TTL heartbeat without a payload).
const resourceWrapperType = "type.googleapis.com/envoy.service.discovery.v3.Resource"

// fullState reports whether SotW responses of typeURL carry the complete set, so that omission
// means deletion: the xDS spec says so for Listener and Cluster (xdstype's table), and by-name
// types, served or not, are merged instead.
func fullState(typeURL string) bool {
	t, ok := xdstype.ByURL(typeURL)
	return ok && t.FullState()
}

// nameField finds which field of typeURL's message holds the resource name: "name" for nearly
// every xDS type, "cluster_name" for ClusterLoadAssignment. Unknown types fall back to field 1,
// which is the name in every xDS resource type.
func nameField(typeURL string) protowire.Number {
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(typeURL)
	if err != nil {
		return 1
	}
	fields := mt.Descriptor().Fields()
	for _, n := range []protoreflect.Name{"name", "cluster_name"} {
		if fd := fields.ByName(n); fd != nil && fd.Kind() == protoreflect.StringKind && fd.Cardinality() != protoreflect.Repeated {
			return fd.Number()
		}
	}
	return 1
}

// wireName reads the string field num from a serialised message without decoding the rest, so
// that keying resources by name stays cheap for thousands of simulated proxies.
func wireName(b []byte, num protowire.Number) (string, error) {
	name := ""
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return "", protowire.ParseError(l)
		}
		b = b[l:]
		if n == num && typ == protowire.BytesType {
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return "", protowire.ParseError(l)
			}
			name = string(v) // the last occurrence wins, as in proto3 decoding
			b = b[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(n, typ, b)
		if l < 0 {
			return "", protowire.ParseError(l)
		}
		b = b[l:]
	}
	return name, nil
}

// validate decodes a and validates it as Envoy does before accepting a
// resource: its generated rules and those of every message it packs.
func validate(a *anypb.Any) error {
	m, err := a.UnmarshalNew()
	if err != nil {
		return fmt.Errorf("cannot decode %s: %w", a.GetTypeUrl(), err)
	}
	return envoyvalid.Message(m)
}

// received is one resource of a response, reduced to what the client keeps.
type received struct {
	name    string
	version string     // Delta only
	payload *anypb.Any // nil for a heartbeat (wrapped SotW resource or Delta resource without payload)
}

// parseSotW checks a SotW response the way Envoy's GrpcMuxImpl and the LDS/CDS subscriptions do
// and returns its resources by name, or the error detail to NACK with.
func (c *Client) parseSotW(resp *discoveryv3.DiscoveryResponse) ([]received, string) {
	t := resp.GetTypeUrl()
	num := nameField(t)
	out := make([]received, 0, len(resp.GetResources()))
	seen := make(map[string]struct{}, len(resp.GetResources()))
	for _, a := range resp.GetResources() {
		r := received{payload: a}
		if a.GetTypeUrl() == resourceWrapperType {
			var w discoveryv3.Resource
			if err := a.UnmarshalTo(&w); err != nil {
				return nil, fmt.Sprintf("cannot decode wrapped resource: %v", err)
			}
			r.name, r.payload = w.GetName(), w.GetResource()
			if r.payload == nil && r.name == "" {
				return nil, "wrapped resource without name or payload"
			}
		}
		if r.payload != nil {
			if r.payload.GetTypeUrl() != t {
				return nil, fmt.Sprintf("%s does not match the message-wide type URL %s in DiscoveryResponse (nonce %q)",
					r.payload.GetTypeUrl(), t, resp.GetNonce())
			}
			if r.name == "" {
				name, err := wireName(r.payload.GetValue(), num)
				if err != nil {
					return nil, fmt.Sprintf("cannot decode %s: %v", t, err)
				}
				r.name = name
			}
			if c.cfg.Validate {
				if err := validate(r.payload); err != nil {
					return nil, fmt.Sprintf("%s %q: %v", t, r.name, err)
				}
			}
		}
		if r.name == "" {
			return nil, fmt.Sprintf("%s resource without a name", t)
		}
		if _, dup := seen[r.name]; dup {
			return nil, fmt.Sprintf("duplicate %s %q found", t, r.name)
		}
		seen[r.name] = struct{}{}
		out = append(out, r)
	}
	return out, ""
}

// parseDelta checks a Delta response the way Envoy's DeltaSubscriptionState does and returns its
// resources, the removed names, and the error detail to NACK with.
func (c *Client) parseDelta(resp *discoveryv3.DeltaDiscoveryResponse) ([]received, []string, string) {
	t := resp.GetTypeUrl()
	out := make([]received, 0, len(resp.GetResources()))
	seen := make(map[string]struct{}, len(resp.GetResources())+len(resp.GetRemovedResources()))
	for _, r := range resp.GetResources() {
		name := r.GetName()
		if name == "" {
			name = r.GetResourceName().GetName()
		}
		if name == "" {
			return nil, nil, fmt.Sprintf("%s resource without a name", t)
		}
		if _, dup := seen[name]; dup {
			return nil, nil, fmt.Sprintf("duplicate name %s found among added/updated resources", name)
		}
		seen[name] = struct{}{}
		if p := r.GetResource(); p != nil {
			if p.GetTypeUrl() != t {
				return nil, nil, fmt.Sprintf("type URL %s embedded in an individual Any does not match the message-wide type URL %s in DeltaDiscoveryResponse (nonce %q)",
					p.GetTypeUrl(), t, resp.GetNonce())
			}
			if c.cfg.Validate {
				if err := validate(p); err != nil {
					return nil, nil, fmt.Sprintf("%s %q: %v", t, name, err)
				}
			}
		}
		out = append(out, received{name: name, version: r.GetVersion(), payload: r.GetResource()})
	}
	// Cloned so that appending never writes into the response.
	removed := slices.Clone(resp.GetRemovedResources())
	for _, rn := range resp.GetRemovedResourceNames() {
		removed = append(removed, rn.GetName())
	}
	for _, name := range removed {
		if _, dup := seen[name]; dup {
			return nil, nil, fmt.Sprintf("duplicate name %s found in the union of added+removed resources", name)
		}
		seen[name] = struct{}{}
	}
	return out, removed, ""
}
