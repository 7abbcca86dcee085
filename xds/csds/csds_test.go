package csds

import (
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"

	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

func TestProxyConfigStatusPerType(t *testing.T) {
	cur := [xdstype.Count]string{xdstype.Cluster: "c2", xdstype.Endpoint: "e2", xdstype.Listener: "l1", xdstype.Route: "r1"}
	p := &feedback.Proxy{
		Node: "envoy-1", Protocol: model.SotW, Since: time.Unix(1700000000, 0), Peer: "10.1.2.3:40000",
		Identity: "system:serviceaccount:shop:envoy",
		Acked:    map[string]string{xdstype.Cluster.URL(): "c1", xdstype.Endpoint.URL(): "e2", xdstype.Listener.URL(): "l0"},
		Nacked:   map[string]bool{xdstype.Listener.URL(): true},
		LastNACK: map[string]feedback.NACK{xdstype.Listener.URL(): {Version: "l1", Detail: "bad listener"}},
	}
	want := [xdstype.Count]statusv3.ConfigStatus{
		xdstype.Cluster:     statusv3.ConfigStatus_STALE,
		xdstype.Endpoint:    statusv3.ConfigStatus_SYNCED,
		xdstype.Listener:    statusv3.ConfigStatus_ERROR,
		xdstype.Route:       statusv3.ConfigStatus_NOT_SENT,
		xdstype.VirtualHost: statusv3.ConfigStatus_NOT_SENT,
	}
	cc := proxyConfig(model.Key{Namespace: "ns", Name: "s"}, p, &cur, "v2", nil)
	for i, g := range cc.GetGenericXdsConfigs() {
		if g.GetConfigStatus() != want[i] {
			t.Errorf("%s: %v, want %v", xdstype.Type(i), g.GetConfigStatus(), want[i])
		}
	}
	if e := cc.GetGenericXdsConfigs()[xdstype.Listener].GetErrorState(); e.GetDetails() != "bad listener" || e.GetVersionInfo() != "l1" {
		t.Errorf("LDS error_state: %v", e)
	}
	if got := cc.GetNode().GetMetadata().GetFields()[ConnectedKey].GetStringValue(); got != "2023-11-14T22:13:20Z" {
		t.Errorf("connected-since %q", got)
	}
	if got := cc.GetNode().GetMetadata().GetFields()[IdentityKey].GetStringValue(); got != "system:serviceaccount:shop:envoy" {
		t.Errorf("%s = %q, want the proxy's identity", IdentityKey, got)
	}
	if got := cc.GetNode().GetMetadata().GetFields()[PeerKey].GetStringValue(); got != "10.1.2.3:40000" {
		t.Errorf("peer %q; two gRPC clients of one node id are told apart by it", got)
	}

	// A proxy at the scope's version is in sync in every type it ACKed,
	// even where a type's version moved only in names it does not hold.
	p.Nacked = map[string]bool{}
	p.AtVersion = "v2"
	cc = proxyConfig(model.Key{Namespace: "ns", Name: "s"}, p, &cur, "v2", nil)
	if got := cc.GetGenericXdsConfigs()[xdstype.Cluster].GetConfigStatus(); got != statusv3.ConfigStatus_SYNCED {
		t.Errorf("CDS of a proxy at the scope's version: %v", got)
	}

	// A SotW proxy subscribed by name ACKs the version of what its names
	// cover: it is current when that is the type's version over the names
	// it subscribes to, and stale for other names.
	p.AtVersion = ""
	names := snapshot.NameDigest("a") ^ snapshot.NameDigest("b")
	p.Acked[xdstype.Route.URL()] = snapshot.SubsetVersion("r1", names)
	for _, c := range []struct {
		names []string
		want  statusv3.ConfigStatus
	}{
		{[]string{"a", "b"}, statusv3.ConfigStatus_SYNCED},
		{[]string{"a"}, statusv3.ConfigStatus_STALE},
	} {
		subs := map[string]feedback.Subscription{xdstype.Route.URL(): {Names: c.names}}
		cc = proxyConfig(model.Key{Namespace: "ns", Name: "s"}, p, &cur, "v2", subs)
		if got := cc.GetGenericXdsConfigs()[xdstype.Route].GetConfigStatus(); got != c.want {
			t.Errorf("RDS acked over names a, b, subscribed to %v: %v, want %v", c.names, got, c.want)
		}
	}
}

func TestStringMatchers(t *testing.T) {
	cases := []struct {
		m     *matcherv3.StringMatcher
		value string
		want  bool
	}{
		{&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "Envoy-1"}, IgnoreCase: true}, "envoy-1", true},
		{&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "Envoy-1"}}, "envoy-1", false},
		{&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: "-1"}}, "envoy-1", true},
		{&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Contains{Contains: "voy"}}, "envoy-1", true},
		{&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: "envoy-[0-9]"}}}, "envoy-1", true},
		// safe_regex matches the whole value, as in Envoy.
		{&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: "envoy"}}}, "envoy-1", false},
	}
	for _, c := range cases {
		f, err := compileString(c.m)
		if err != nil {
			t.Fatal(err)
		}
		if got := f(c.value); got != c.want {
			t.Errorf("%v on %q = %v, want %v", c.m, c.value, got, c.want)
		}
	}
	if _, err := compileString(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: "("}}}); err == nil {
		t.Error("an invalid regex compiled")
	}
}

// TestProxyAssignmentsAreComparedWithItsOwnView checks that a proxy's
// assignments are SYNCED when they are its zone's view of the scope, and
// STALE for a proxy elsewhere that holds the same versions.
func TestProxyAssignmentsAreComparedWithItsOwnView(t *testing.T) {
	cat := catalog.New()
	store := snapshot.NewStore()
	b := snapshot.NewBuilder(cat, store, 0)
	key := model.Key{Namespace: "shop", Name: "s"}
	cat.UpsertScope(&model.Scope{Key: key, Protocol: model.SotW, Listener: model.Listener{Mode: model.ListenerProxylessGRPC},
		Selections: []model.Selection{{Namespace: "shop"}}})
	ep := func(addr, zone string) model.Endpoint {
		return model.Endpoint{Address: addr, Family: model.IPv4, Ready: true, Serving: true, Zone: zone, ForZones: []string{zone},
			Ports: []model.EndpointPort{{Name: "grpc", Port: 9000, Protocol: model.ProtocolTCP}}}
	}
	cat.UpsertService(&model.Service{Key: model.Key{Namespace: "shop", Name: "web"}, TrafficDistribution: "PreferClose",
		Ports:     []model.ServicePort{{Name: "grpc", Port: 9000, Protocol: model.ProtocolTCP, TargetPort: 9000}},
		Endpoints: []model.Endpoint{ep("10.0.0.1", "zone-a"), ep("10.0.0.2", "zone-b")}})
	b.Apply(cat.Take())
	var inA string
	store.Get(key).ReadFrom(model.Location{Zone: "zone-a"}, func(v snapshot.View) { inA = v.TypeVersion(xdstype.Endpoint) })

	fb := feedback.New(time.Minute)
	srv := New(store, fb)
	for _, zone := range []string{"zone-a", "zone-b"} {
		id := fb.Connect(key, &corev3.Node{Id: zone}, model.SotW, "", "", model.Location{Zone: zone, Source: model.LocatedByBootstrap})
		fb.ACK(key, id, xdstype.Endpoint.URL(), inA, true)
	}
	resp, err := srv.status(&statusv3.ClientStatusRequest{ExcludeResourceContents: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]statusv3.ConfigStatus{"zone-a": statusv3.ConfigStatus_SYNCED, "zone-b": statusv3.ConfigStatus_STALE}
	seen := 0
	for _, cc := range resp.GetConfig() {
		w, ok := want[cc.GetNode().GetId()]
		if !ok {
			continue
		}
		seen++
		if got := cc.GetGenericXdsConfigs()[xdstype.Endpoint].GetConfigStatus(); got != w {
			t.Errorf("proxy in %s holding zone-a's assignments: EDS %v, want %v", cc.GetNode().GetId(), got, w)
		}
	}
	if seen != len(want) {
		t.Fatalf("CSDS reported %d of the %d proxies", seen, len(want))
	}
}
