// Package xdstype is the one table of the xDS resource types scopeplane
// serves. The catalog, the snapshots, the ADS server, the test client, the
// benchmark and the tests all iterate it instead of keeping lists of their
// own, so adding a type (SDS, VHDS, ECDS) is one entry here plus its
// translator.
//
// The types are numbered in ADS order: clusters before their endpoints,
// listeners before their routes, so iterating 0..Count sends each type after
// the ones it depends on.
package xdstype

import (
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"
)

// Type is one served resource type; its value is its place in ADS order.
type Type uint8

// The served types, in ADS order.
const (
	Cluster Type = iota
	Endpoint
	Listener
	Route
	// VirtualHost is VHDS: the virtual hosts of a delta Envoy-mode scope's
	// route configuration, one resource each (see package translate).
	VirtualHost
	// Count is the number of served types: arrays indexed by Type have this length.
	Count
)

// Info describes how one type is served.
type Info struct {
	// URL is the type URL on the wire.
	URL string
	// Short is the xDS service's name (CDS, EDS, …), for logs and test output.
	Short string
	// FullState is true where every SotW response carries the complete set
	// of the subscription, so that omission deletes (Listener and Cluster);
	// other types are sent by name and omission deletes nothing.
	FullState bool
	// Parent is the type whose resources name this type's resources (a
	// cluster names its assignment, a listener its route configuration);
	// HasParent is false for types nothing references.
	Parent    Type
	HasParent bool
	// VersionFollowsParent says a resource's version mixes in the version of
	// its parent of the same name: Envoy finishes warming a changed cluster
	// only when an EDS response for it follows, so an assignment is
	// re-versioned (and re-sent) whenever its cluster changes.
	VersionFollowsParent bool
	// RemovedLast says removals of this type wait until listeners and routes
	// stopped referencing what is removed: make before break.
	RemovedLast bool
	// DeltaOnly says only incremental xDS carries the type: Envoy reads VHDS
	// over delta alone, and a SotW proxy gets the same virtual hosts inline
	// in its route configuration instead.
	DeltaOnly bool
	// NameOf returns the resource name of one of this type's messages.
	NameOf func(proto.Message) string
}

var table = [Count]Info{
	Cluster: {
		URL: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Short: "CDS",
		FullState: true, RemovedLast: true,
		NameOf: func(m proto.Message) string { return m.(*clusterv3.Cluster).GetName() },
	},
	Endpoint: {
		URL: "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment", Short: "EDS",
		Parent: Cluster, HasParent: true, VersionFollowsParent: true, RemovedLast: true,
		NameOf: func(m proto.Message) string { return m.(*endpointv3.ClusterLoadAssignment).GetClusterName() },
	},
	Listener: {
		URL: "type.googleapis.com/envoy.config.listener.v3.Listener", Short: "LDS",
		FullState: true,
		NameOf:    func(m proto.Message) string { return m.(*listenerv3.Listener).GetName() },
	},
	Route: {
		URL: "type.googleapis.com/envoy.config.route.v3.RouteConfiguration", Short: "RDS",
		Parent: Listener, HasParent: true,
		NameOf: func(m proto.Message) string { return m.(*routev3.RouteConfiguration).GetName() },
	},
	VirtualHost: {
		URL: "type.googleapis.com/envoy.config.route.v3.VirtualHost", Short: "VHDS",
		DeltaOnly: true,
		NameOf:    func(m proto.Message) string { return m.(*routev3.VirtualHost).GetName() },
	},
}

// Info returns the table entry of t.
func (t Type) Info() *Info { return &table[t] }

// URL returns t's type URL.
func (t Type) URL() string { return table[t].URL }

// String returns t's short name (CDS, EDS, LDS, RDS, VHDS).
func (t Type) String() string {
	if t >= Count {
		return "unknown"
	}
	return table[t].Short
}

// FullState reports whether SotW responses of t carry the complete set.
func (t Type) FullState() bool { return table[t].FullState }

// ByURL returns the type of a type URL, and false for a type scopeplane does
// not serve.
func ByURL(url string) (Type, bool) {
	for t := range Count {
		if table[t].URL == url {
			return t, true
		}
	}
	return 0, false
}

// All returns every served type in ADS order.
func All() []Type {
	out := make([]Type, Count)
	for t := range Count {
		out[t] = t
	}
	return out
}

// URLs returns every served type URL in ADS order.
func URLs() []string {
	out := make([]string, Count)
	for t := range Count {
		out[t] = table[t].URL
	}
	return out
}
