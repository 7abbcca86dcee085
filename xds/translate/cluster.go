package translate

import (
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/scopeplane/scopeplane/xds/model"
)

// ConnectTimeout is every cluster's connect timeout: long enough for a pod
// on a busy node, short enough that a dead endpoint is skipped quickly.
const ConnectTimeout = 5 * time.Second

// httpProtocolOptionsKey is the typed_extension_protocol_options key under
// which Envoy looks for upstream HTTP protocol options; the key must be the
// options message's full name.
const httpProtocolOptionsKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

// isHTTP2 reports whether a Service port's backend speaks HTTP/2 cleartext
// (gRPC is HTTP/2), so the proxy must not talk HTTP/1.1 to it: its
// appProtocol says so or, when it sets none, its name does, by the
// "<protocol>[-<suffix>]" naming meshes read (grpc, grpc-*, h2c, http2),
// as Gateway API's own conformance Services name their gRPC ports.
func isHTTP2(port *model.ServicePort) bool {
	switch port.AppProtocol {
	case "grpc", "h2c", "http2", "kubernetes.io/h2c":
		return true
	case "":
		proto, _, _ := strings.Cut(port.Name, "-")
		return proto == "grpc" || proto == "h2c" || proto == "http2"
	}
	return false
}

// cluster builds the Cluster of one Service port: an EDS cluster fed over
// ADS, or for an ExternalName Service a DNS cluster, since such a Service has
// no endpoints to send.
func cluster(svc *model.Service, port *model.ServicePort, mode model.ListenerMode) *clusterv3.Cluster {
	name := clusterName(svc, port.Port, mode)
	c := &clusterv3.Cluster{
		Name:           name,
		ConnectTimeout: connectTimeout,
		LbPolicy:       clusterv3.Cluster_ROUND_ROBIN,
	}
	if svc.ExternalName != "" {
		externalName(c, svc.ExternalName, port.Port, mode)
	} else {
		c.ClusterDiscoveryType = edsType
		c.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{
			EdsConfig:   adsSource,
			ServiceName: name,
		}
	}
	if isHTTP2(port) {
		c.TypedExtensionProtocolOptions = http2Options
	}
	return c
}

// externalName makes c resolve an ExternalName Service's DNS name itself,
// with an inline load assignment of (host, port) and no EDS.
//
// Envoy gets STRICT_DNS, which balances over every address the name resolves
// to. gRPC gets LOGICAL_DNS, the only DNS cluster type grpc-go accepts (it
// rejects STRICT_DNS as an unsupported cluster type, which would NACK the
// whole CDS response); grpc-go then requires exactly one locality holding
// exactly one endpoint, which is what is built here for both.
func externalName(c *clusterv3.Cluster, host string, port int32, mode model.ListenerMode) {
	typ := clusterv3.Cluster_STRICT_DNS
	if mode == model.ListenerProxylessGRPC {
		typ = clusterv3.Cluster_LOGICAL_DNS
	}
	c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: typ}
	c.DnsLookupFamily = clusterv3.Cluster_V4_PREFERRED
	c.LoadAssignment = &endpointv3.ClusterLoadAssignment{
		ClusterName: c.GetName(),
		Endpoints: []*endpointv3.LocalityLbEndpoints{{
			Locality:    &corev3.Locality{},
			LbEndpoints: []*endpointv3.LbEndpoint{lbEndpoint(host, uint32(port), corev3.HealthStatus_UNKNOWN)},
		}},
	}
}
