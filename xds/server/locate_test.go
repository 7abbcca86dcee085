package server

import (
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/model"
)

// zones is a Node → zone table, as nodezones reads it from the API server.
type zones map[string]string

func (z zones) Zone(node string) (string, bool) {
	zone, ok := z[node]
	return zone, ok
}

func TestLocate(t *testing.T) {
	onNode := &auth.Identity{Namespace: "shop", ServiceAccount: "envoy", PodName: "envoy-1", NodeName: "node-a"}
	declaring := func(zone string) *corev3.Node { return &corev3.Node{Id: "p", Locality: &corev3.Locality{Zone: zone}} }
	for _, tc := range []struct {
		name  string
		zones Zones
		id    *auth.Identity
		node  *corev3.Node
		want  model.Location
	}{
		{"the token's Node wins over the bootstrap", zones{"node-a": "zone-a"}, onNode, declaring("zone-x"),
			model.Location{Zone: "zone-a", Node: "node-a", Source: model.LocatedByNode}},
		{"a Node not known yet: the bootstrap, still naming the Node", zones{}, onNode, declaring("zone-x"),
			model.Location{Zone: "zone-x", Node: "node-a", Source: model.LocatedByBootstrap}},
		{"no Nodes watched", nil, onNode, declaring("zone-x"), model.Location{Zone: "zone-x", Node: "node-a", Source: model.LocatedByBootstrap}},
		{"a token of no pod", zones{"node-a": "zone-a"}, &auth.Identity{Namespace: "shop", ServiceAccount: "envoy"}, declaring("zone-b"),
			model.Location{Zone: "zone-b", Source: model.LocatedByBootstrap}},
		{"anonymous, declaring nothing", zones{"node-a": "zone-a"}, nil, &corev3.Node{Id: "p"}, model.Location{}},
		{"a declared zone is cut to what a label holds, as valid UTF-8", nil, nil, declaring(strings.Repeat("z", 100) + "\xff"),
			model.Location{Zone: strings.Repeat("z", 63), Source: model.LocatedByBootstrap}},
		{"invalid UTF-8 declared", nil, nil, declaring("a\xffb"), model.Location{Zone: "a\uFFFDb", Source: model.LocatedByBootstrap}},
	} {
		s := &Server{opts: Options{Zones: tc.zones}}
		if got := s.locate(tc.id, tc.node); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
