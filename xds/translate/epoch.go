package translate

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/scopeplane/scopeplane/xds/model"
)

// EpochMetadataKey is the filter_metadata key under which every Listener
// and RouteConfiguration of a ProxylessGRPC scope carries the scope's
// epoch: the ProxyScope's metadata.generation, as {"generation": N}.
//
// The epoch exists because grpc-js-xds and gRPC C-core cache a resource
// after the server removed it, and ignore a later copy byte-identical to
// the cached one: a Service removed from a scope and re-added would come
// back exactly as it left, and those clients would keep failing with
// "listener does not exist" until restarted. Removing a Service from a
// scope and adding it back takes two edits of the ProxyScope, each of
// which raises its generation, so the re-added listener and route
// configuration differ from every copy served before the removal, and are
// versioned, pushed and priced like any other change.
//
// It is the generation, and not a count of removals kept in memory,
// because every replica must build the same content-addressed versions
// from the same objects: the generation is what every replica, a restarted
// one included, reads from the API server. The price is that any edit of
// a scope's spec changes all of its listeners and route configurations
// once. Envoy, grpc-go and the other xDS clients ignore Listener and
// RouteConfiguration metadata; nothing routes by it.
//
// Envoy-mode scopes are not stamped: their listener and route
// configuration are the scope's own, a Service's removal and return
// changes the route configuration's virtual hosts, and Envoy applies a
// resource that returns unchanged. (Their route configuration stays its
// name plus its virtual hosts, which a delta stream prices it by.)
//
// A Service that leaves a scope by its own labels or its namespace's (no
// edit of the ProxyScope) and returns to it unchanged is not marked: no
// object every replica agrees on records that it left.
const EpochMetadataKey = "scopeplane.dev/epoch"

// Stamped reports whether the scope's listeners and route configurations
// carry its epoch: those of ProxylessGRPC scopes do.
func Stamped(sc *model.Scope) bool { return sc.Listener.Mode == model.ListenerProxylessGRPC }

// epochMetadata is the metadata that stamps a resource with the scope's
// epoch.
func epochMetadata(sc *model.Scope) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		EpochMetadataKey: {Fields: map[string]*structpb.Value{"generation": structpb.NewNumberValue(float64(sc.Generation))}},
	}}
}

// HasEpoch reports whether m, a Listener or a RouteConfiguration, carries
// the scope's epoch already.
func HasEpoch(sc *model.Scope, m proto.Message) bool {
	var md *corev3.Metadata
	switch r := m.(type) {
	case *listenerv3.Listener:
		md = r.GetMetadata()
	case *routev3.RouteConfiguration:
		md = r.GetMetadata()
	default:
		return false
	}
	v, ok := md.GetFilterMetadata()[EpochMetadataKey].GetFields()["generation"]
	return ok && len(md.GetFilterMetadata()) == 1 && v.GetNumberValue() == float64(sc.Generation)
}

// WithEpoch returns m stamped with the scope's epoch (see
// EpochMetadataKey), if the scope is Stamped: m itself when it carries it
// already, else a copy, so
// that the fragments every scope shares are never modified. Other types
// than Listener and RouteConfiguration are returned as they are.
func WithEpoch(sc *model.Scope, m proto.Message) proto.Message {
	if !Stamped(sc) {
		return m
	}
	switch r := m.(type) {
	case *listenerv3.Listener:
		if HasEpoch(sc, r) {
			return r
		}
		c := proto.Clone(r).(*listenerv3.Listener)
		c.Metadata = epochMetadata(sc)
		return c
	case *routev3.RouteConfiguration:
		if HasEpoch(sc, r) {
			return r
		}
		c := proto.Clone(r).(*routev3.RouteConfiguration)
		c.Metadata = epochMetadata(sc)
		return c
	}
	return m
}

// stampEpoch stamps the scope's listeners and route configurations in
// place of the slices' elements.
func stampEpoch(sc *model.Scope, r *Resources) {
	for i, l := range r.Listeners {
		r.Listeners[i] = WithEpoch(sc, l).(*listenerv3.Listener)
	}
	for i, rc := range r.Routes {
		r.Routes[i] = WithEpoch(sc, rc).(*routev3.RouteConfiguration)
	}
}
