package translate

import (
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/scopeplane/scopeplane/xds/model"
)

// TestSharedPartsStayUnchanged translates every golden case in both
// listener modes, stamps the result with an epoch as a ProxylessGRPC scope
// does, and checks that the parts every resource shares (see adsSource)
// are still what they were built as: a caller that changed one would
// change every resource holding it.
func TestSharedPartsStayUnchanged(t *testing.T) {
	for _, name := range goldenCases(t) {
		scope, services := loadCase(t, name)
		for _, mode := range []model.ListenerMode{model.ListenerEnvoy, model.ListenerProxylessGRPC} {
			sc := *scope
			sc.Listener.Mode, sc.Generation = mode, 7
			res := Translate(&sc, services)
			if _, err := wire(res); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !proto.Equal(adsSource, &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}, ResourceApiVersion: corev3.ApiVersion_V3}) {
		t.Errorf("the ADS config source changed: %v", adsSource)
	}
	if edsType.Type != clusterv3.Cluster_EDS {
		t.Errorf("the EDS discovery type changed: %v", edsType)
	}
	if !proto.Equal(connectTimeout, durationpb.New(ConnectTimeout)) {
		t.Errorf("the connect timeout changed: %v", connectTimeout)
	}
	if !proto.Equal(matchAll, &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}) {
		t.Errorf("the match of every path changed: %v", matchAll)
	}
	if len(http2Options) != 1 || http2Options[httpProtocolOptionsKey] == nil {
		t.Errorf("the HTTP/2 protocol options changed: %v", http2Options)
	}
	for i, w := range weights {
		if w.GetValue() != uint32(i) {
			t.Errorf("weight %d holds %d", i, w.GetValue())
		}
	}
}
