package cost

import (
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// body is an Any whose encoding has about n bytes of value.
func body(n int) *anypb.Any {
	return &anypb.Any{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Value: []byte(strings.Repeat("x", n))}
}

// Sizes chosen to cross varint length boundaries (127/128, 16383/16384).
var sizes = []int{0, 1, 100, 127, 128, 300, 16383, 16384, 70000}

func TestSotWResponseSize(t *testing.T) {
	for _, version := range []string{"", "0", "8f267db5939fb937"} {
		for _, nonce := range []string{"", "7", "123456"} {
			resp := &discoveryv3.DiscoveryResponse{VersionInfo: version, TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Nonce: nonce}
			want := Header(version, resp.TypeUrl, nonce)
			for _, n := range sizes {
				a := body(n)
				resp.Resources = append(resp.Resources, a)
				want += SotWEntry(proto.Size(a))
			}
			if got := proto.Size(resp); got != want {
				t.Errorf("version %q nonce %q: proto.Size %d, formula %d", version, nonce, got, want)
			}
		}
	}
}

func TestDeltaResponseSize(t *testing.T) {
	resp := &discoveryv3.DeltaDiscoveryResponse{SystemVersionInfo: "8f267db5939fb937", TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Nonce: "42"}
	want := Header(resp.SystemVersionInfo, resp.TypeUrl, resp.Nonce)
	for i, n := range sizes {
		a := body(n)
		name := strings.Repeat("n", i*40) // "" first: an empty name is left out
		resp.Resources = append(resp.Resources, &discoveryv3.Resource{Name: name, Version: "v" + name, Resource: a})
		want += DeltaEntry(name, "v"+name, proto.Size(a))
	}
	for _, name := range []string{"shop/a:80", strings.Repeat("r", 200)} {
		resp.RemovedResources = append(resp.RemovedResources, name)
		want += Removed(name)
	}
	if got := proto.Size(resp); got != want {
		t.Errorf("proto.Size %d, formula %d", got, want)
	}
}
