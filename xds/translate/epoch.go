package translate

import (
	"fmt"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// EpochMetadataKey is the filter_metadata key under which every Listener,
// RouteConfiguration and Cluster of a ProxylessGRPC scope carries the
// scope's epoch: the ProxyScope's metadata.generation, as
// {"generation": N}.
//
// The epoch exists because grpc-js-xds and gRPC C-core cache a resource
// after the server removed it, and ignore a later copy equal to the cached
// one: a Service removed from a scope and re-added would come
// back exactly as it left, and those clients would keep failing with
// "listener does not exist" or "cluster does not exist" until restarted.
// (Assignments need no epoch: SotW never deletes one by omission, so the
// clients' copy stays valid.) Removing a Service from a scope and adding
// it back takes two edits of the ProxyScope, each of which raises its
// generation, so the re-added listeners, route configuration and clusters
// differ from every copy served before the removal, and are versioned,
// pushed and priced like any other change.
//
// The clients compare what they parsed, not bytes: C-core's listener holds
// the HTTP filters' names and its route configuration the virtual hosts'
// domains, not the metadata. So a stamped listener's router filter is
// named "<router>/epoch-N" (the router is found by its type; the name only
// labels it) and a stamped route configuration's virtual hosts also list
// EpochDomain, a name no client dials.
//
// It is the generation, and not a count of removals kept in memory,
// because every replica must build the same content-addressed versions
// from the same objects: the generation is what every replica, a restarted
// one included, reads from the API server. The price is that any edit of
// a scope's spec changes all of its listeners, route configurations and
// clusters once. The gRPC clients route by none of these marks.
//
// Envoy-mode scopes are not stamped: Envoy applies a resource that
// returns unchanged, and their listener and route configuration are the
// scope's own anyway. (Their route configuration stays its
// name plus its virtual hosts, which a delta stream prices it by.)
//
// grpc-js-xds compares a cluster as it parsed it (type, EDS name, circuit
// breaker, outlier detection, LB policy, TLS), not its metadata. So a
// stamped cluster also carries an outlier detection that ejects nothing,
// with the epoch as its max_ejection_time (epochOutlierDetection): with
// enforcing_success_rate and enforcing_failure_percentage 0, gRFC A50
// configures neither ejection algorithm, and grpc-js-xds, grpc-go and
// C-core then count no calls, run no ejection timer and eject no address,
// exactly as for a cluster without outlier detection (which all three also
// run through a no-op outlier detection policy). max_ejection_time only
// bounds how long an ejected address stays out, and none is ever ejected.
//
// A Service that leaves a scope by its own labels or its namespace's (no
// edit of the ProxyScope) and returns to it unchanged is not marked: no
// object every replica agrees on records that it left. (The Service's or
// Namespace's resourceVersion moves with every write to it, status and
// annotations included, and would resend its resources each time.) The
// next edit of the scope's spec restamps everything and brings the
// clients back.
const EpochMetadataKey = "scopeplane.dev/epoch"

// EpochDomain is the domain a stamped route configuration's virtual hosts
// list besides their own: a name under .invalid (RFC 2606), which no
// client dials, so it matches nothing.
func EpochDomain(sc *model.Scope) string {
	return fmt.Sprintf("epoch-%d.scopeplane.invalid", sc.Generation)
}

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

// maxDurationSeconds is the largest number of seconds a
// google.protobuf.Duration may hold (10,000 years); gRPC clients reject a
// cluster whose outlier detection holds more.
const maxDurationSeconds = 315_576_000_000

// epochSeconds is the scope's epoch as the seconds of a valid Duration:
// the generation itself (a generation is at least 1), wrapped into
// (0, maxDurationSeconds] so that no generation makes an invalid one.
func epochSeconds(sc *model.Scope) int64 {
	s := sc.Generation % maxDurationSeconds
	if s <= 0 {
		s += maxDurationSeconds
	}
	return s
}

// epochOutlierDetection is the outlier detection of a stamped cluster: one
// that ejects nothing (enforcing_success_rate and
// enforcing_failure_percentage 0 leave gRFC A50 no ejection algorithm) and
// holds the scope's epoch as its max_ejection_time, which bounds only how
// long an ejected address stays out. See EpochMetadataKey.
func epochOutlierDetection(sc *model.Scope) *clusterv3.OutlierDetection {
	return &clusterv3.OutlierDetection{
		EnforcingSuccessRate:       wrapperspb.UInt32(0),
		EnforcingFailurePercentage: wrapperspb.UInt32(0),
		MaxEjectionTime:            &durationpb.Duration{Seconds: epochSeconds(sc)},
	}
}

// HasEpoch reports whether m, a Listener, RouteConfiguration or Cluster,
// carries the scope's epoch already (a Cluster also in its outlier
// detection).
func HasEpoch(sc *model.Scope, m proto.Message) bool {
	var md *corev3.Metadata
	switch r := m.(type) {
	case *listenerv3.Listener:
		md = r.GetMetadata()
	case *routev3.RouteConfiguration:
		md = r.GetMetadata()
	case *clusterv3.Cluster:
		md = r.GetMetadata()
		if !proto.Equal(r.GetOutlierDetection(), epochOutlierDetection(sc)) {
			return false
		}
	default:
		return false
	}
	v, ok := md.GetFilterMetadata()[EpochMetadataKey].GetFields()["generation"]
	return ok && v.GetNumberValue() == float64(sc.Generation)
}

// WithEpoch returns m stamped with the scope's epoch (see
// EpochMetadataKey), if the scope is Stamped: m itself when it carries it
// already, else a copy, so that the fragments every scope shares are never
// modified. A stamped cluster's outlier detection is
// epochOutlierDetection's: the translator configures none of its own
// (its tests hold it to that). Other types than Listener,
// RouteConfiguration and Cluster are returned as they are.
func WithEpoch(sc *model.Scope, m proto.Message) proto.Message {
	if !Stamped(sc) || HasEpoch(sc, m) {
		return m
	}
	switch r := m.(type) {
	case *listenerv3.Listener:
		c := proto.Clone(r).(*listenerv3.Listener)
		c.Metadata = epochMetadata(sc)
		if api := c.GetApiListener().GetApiListener(); api != nil {
			hcm := &hcmv3.HttpConnectionManager{}
			if err := api.UnmarshalTo(hcm); err == nil {
				for _, f := range hcm.GetHttpFilters() {
					if f.GetName() == wellknown.Router {
						f.Name = fmt.Sprintf("%s/epoch-%d", wellknown.Router, sc.Generation)
					}
				}
				c.ApiListener.ApiListener = mustAny(hcm)
			}
		}
		return c
	case *routev3.RouteConfiguration:
		c := proto.Clone(r).(*routev3.RouteConfiguration)
		c.Metadata = epochMetadata(sc)
		for _, vh := range c.GetVirtualHosts() {
			vh.Domains = append(vh.Domains, EpochDomain(sc))
		}
		return c
	case *clusterv3.Cluster:
		c := proto.Clone(r).(*clusterv3.Cluster)
		c.Metadata = epochMetadata(sc)
		c.OutlierDetection = epochOutlierDetection(sc)
		return c
	}
	return m
}

// EpochTypes reports whether resources of type t carry the epoch in a
// Stamped scope.
func EpochTypes(t xdstype.Type) bool {
	return t == xdstype.Listener || t == xdstype.Route || t == xdstype.Cluster
}

// stampEpoch stamps the scope's listeners, route configurations and
// clusters in place of the slices' elements.
func stampEpoch(sc *model.Scope, r *Resources) {
	if !Stamped(sc) {
		return
	}
	for i, l := range r.Listeners {
		r.Listeners[i] = WithEpoch(sc, l).(*listenerv3.Listener)
	}
	for i, rc := range r.Routes {
		r.Routes[i] = WithEpoch(sc, rc).(*routev3.RouteConfiguration)
	}
	for i, c := range r.Clusters {
		r.Clusters[i] = WithEpoch(sc, c).(*clusterv3.Cluster)
	}
}
