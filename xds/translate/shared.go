package translate

import (
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The parts below are the same in every resource that holds them, so
// every resource shares one copy: like every message the package returns,
// they are read-only, and a caller that must change a resource clones it
// (as WithEpoch does). At 100,000 Services a copy of each per cluster,
// route and endpoint would hold tens of megabytes.
var (
	// adsSource tells the client to fetch a resource on the same ADS
	// stream, which is the only source grpc-go accepts besides self.
	adsSource = &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		ResourceApiVersion:    corev3.ApiVersion_V3,
	}
	// edsType is the discovery type of an EDS cluster.
	edsType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}
	// connectTimeout is ConnectTimeout as every cluster holds it.
	connectTimeout = durationpb.New(ConnectTimeout)
	// http2Options are the protocol options of a cluster whose backend
	// speaks HTTP/2 cleartext (see isHTTP2).
	http2Options = map[string]*anypb.Any{
		httpProtocolOptionsKey: mustAny(&upstreamhttpv3.HttpProtocolOptions{
			UpstreamProtocolOptions: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_{
				ExplicitHttpConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig{
					ProtocolConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
						Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
					},
				},
			},
		}),
	}
	// weights holds the weights an endpoint or locality is given (1, or
	// its number of endpoints), up to a locality of maxSharedWeight.
	weights = func() (w [maxSharedWeight + 1]*wrapperspb.UInt32Value) {
		for i := range w {
			w[i] = wrapperspb.UInt32(uint32(i))
		}
		return w
	}()
	// matchAll matches every path.
	matchAll = &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}
)

// maxSharedWeight is the largest weight weights holds.
const maxSharedWeight = 64

// weight is the weight n, shared up to maxSharedWeight.
func weight(n uint32) *wrapperspb.UInt32Value {
	if n <= maxSharedWeight {
		return weights[n]
	}
	return wrapperspb.UInt32(n)
}
