package server_test

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// rawSotW is one SotW stream driven request by request, to state exactly
// what a reconnecting proxy names.
type rawSotW struct {
	t      *testing.T
	stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	cancel context.CancelFunc
	// userAgent is the node's user_agent_name: "" plays Envoy's part (any
	// client that is not gRPC's).
	userAgent string
	// bytes is what the stream received, by type URL.
	bytes map[string]int
}

func openSotW(t *testing.T, cp *controlPlane) *rawSotW {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cp.conn).StreamAggregatedResources(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r := &rawSotW{t: t, stream: stream, cancel: cancel, bytes: map[string]int{}}
	t.Cleanup(r.close)
	return r
}

func (r *rawSotW) close() { r.cancel() }

func (r *rawSotW) send(req *discoveryv3.DiscoveryRequest) {
	r.t.Helper()
	req.Node = testkit.Node("raw-proxy", "default/sotw")
	req.Node.UserAgentName = r.userAgent
	if err := r.stream.Send(req); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawSotW) recv() *discoveryv3.DiscoveryResponse {
	r.t.Helper()
	resp, err := r.stream.Recv()
	if err != nil {
		r.t.Fatal(err)
	}
	r.bytes[resp.GetTypeUrl()] += proto.Size(resp)
	return resp
}

// ack answers resp with an ACK naming names.
func (r *rawSotW) ack(resp *discoveryv3.DiscoveryResponse, names []string) {
	r.t.Helper()
	r.send(&discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(), ResourceNames: names})
}

func namesOf(resp *discoveryv3.DiscoveryResponse) []string {
	var out []string
	for _, a := range resp.GetResources() {
		out = append(out, stringFieldOne(a.GetValue()))
	}
	slices.Sort(out)
	return out
}

// stringFieldOne is the name of a Cluster, ClusterLoadAssignment (field
// cluster_name), Listener or RouteConfiguration: field 1 of each.
func stringFieldOne(b []byte) string {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			return string(v)
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return ""
		}
		b = b[n:]
	}
	return ""
}

// TestSotWReconnectAtServedVersionIsSentNothing checks the free SotW
// reconnect over real gRPC: a new stream whose first request of a type
// names the version the scope serves for that subscription (the type's
// version by wildcard, the type's and the names' by name) is sent nothing
// of it, is counted in sync and answered, costs nothing in the scope's
// figures, and gets the next change as if it had been sent the set. One
// naming another version, or another name set, or repeating a rejection,
// is sent the full set; a gRPC client naming its assignments' served
// version is sent them again (sotw.adopt says why).
func TestSotWReconnectAtServedVersionIsSentNothing(t *testing.T) {
	svcA := testkit.Service("default", "a", "10.0.0.1", "10.0.0.2")
	cp, key := startEnvoySotW(t, svcA, testkit.Service("default", "b", "10.0.0.3"))
	cds, eds, lds := xdstype.Cluster.URL(), xdstype.Endpoint.URL(), xdstype.Listener.URL()
	edsNames := []string{"default/a:80", "default/b:80"}

	// The first stream: clusters by wildcard, endpoints by name.
	first := openSotW(t, cp)
	first.send(&discoveryv3.DiscoveryRequest{TypeUrl: cds})
	clusters := first.recv()
	first.ack(clusters, nil)
	first.send(&discoveryv3.DiscoveryRequest{TypeUrl: eds, ResourceNames: edsNames})
	endpoints := first.recv()
	first.ack(endpoints, edsNames)
	if got := namesOf(endpoints); !slices.Equal(got, edsNames) {
		t.Fatalf("endpoints %v, want %v", got, edsNames)
	}
	var typeVersion [xdstype.Count]string
	cp.Store.Get(key).Read(func(v snapshot.View) {
		for ty := range xdstype.Count {
			typeVersion[ty] = v.TypeVersion(ty)
		}
	})
	if clusters.GetVersionInfo() != typeVersion[xdstype.Cluster] {
		t.Errorf("a wildcard subscription's version %q, want the type's %q", clusters.GetVersionInfo(), typeVersion[xdstype.Cluster])
	}
	byName := snapshot.SubsetVersion(typeVersion[xdstype.Endpoint], snapshot.NameDigest(edsNames[0])^snapshot.NameDigest(edsNames[1]))
	if endpoints.GetVersionInfo() != byName {
		t.Errorf("a by-name subscription's version %q, want the type's over its names %q", endpoints.GetVersionInfo(), byName)
	}
	first.close()
	// A response is counted once sent, which the proxy may see first.
	testkit.Eventually(t, "the first stream's two responses are counted", func() (bool, string) {
		n := cp.Feedback.Get(key).Total.Connects
		return n == 2, strconv.FormatInt(n, 10) + " connects"
	})
	before := cp.Feedback.Get(key).Total

	// Reconnect at the served versions: nothing is sent of the clusters
	// or the assignments. The listener request that follows is a barrier:
	// the stream handles requests in order, so the listeners come first
	// only if the others were sent nothing.
	second := openSotW(t, cp)
	second.send(&discoveryv3.DiscoveryRequest{TypeUrl: cds, VersionInfo: clusters.GetVersionInfo()})
	second.send(&discoveryv3.DiscoveryRequest{TypeUrl: eds, VersionInfo: endpoints.GetVersionInfo(), ResourceNames: []string{edsNames[1], edsNames[0]}})
	second.send(&discoveryv3.DiscoveryRequest{TypeUrl: lds})
	listeners := second.recv()
	if listeners.GetTypeUrl() != lds {
		t.Fatalf("the reconnect at the served versions was then sent %s (version %s), want the listeners", listeners.GetTypeUrl(), listeners.GetVersionInfo())
	}
	second.ack(listeners, nil)
	testkit.Eventually(t, "the reconnected proxy is counted in sync, at the versions it named", func() (bool, string) {
		ok, why := serverSynced(cp, key, "raw-proxy")
		if !ok {
			return false, why
		}
		for _, fp := range cp.Feedback.Get(key).Proxies {
			if fp.Node == "raw-proxy" && (fp.Acked[cds] != clusters.GetVersionInfo() || fp.Acked[eds] != endpoints.GetVersionInfo()) {
				return false, "acked " + fp.Acked[cds] + ", " + fp.Acked[eds]
			}
		}
		return true, ""
	})
	after := cp.Feedback.Get(key).Total
	if got, want := after.Connects-before.Connects, int64(3); got != want {
		t.Errorf("the reconnect counted %d connects, want %d (one per type, sent or not)", got, want)
	}
	if got, want := after.ConnectBytes-before.ConnectBytes, int64(second.bytes[lds]); got != want {
		t.Errorf("the reconnect's connect bytes %d, want %d: only the listeners were sent", got, want)
	}

	// The next change reaches the stream as a difference from the set it
	// was taken to hold: only the changed assignment, no cluster.
	a := *svcA
	a.Endpoints = slices.Clone(a.Endpoints)
	a.Endpoints[0].Address = "10.0.0.9"
	cp.Catalog.UpsertService(&a)
	cp.Sync()
	change := second.recv()
	if change.GetTypeUrl() != eds || !slices.Equal(namesOf(change), []string{"default/a:80"}) {
		t.Fatalf("after the endpoint change the stream was sent %s %v, want only default/a:80's assignment", change.GetTypeUrl(), namesOf(change))
	}
	second.ack(change, edsNames)
	second.close()

	cp.Store.Get(key).Read(func(v snapshot.View) {
		for ty := range xdstype.Count {
			typeVersion[ty] = v.TypeVersion(ty)
		}
	})
	current := change.GetVersionInfo()
	for _, c := range []struct {
		what string
		req  *discoveryv3.DiscoveryRequest
		want []string
	}{
		{"an older version of the clusters",
			&discoveryv3.DiscoveryRequest{TypeUrl: cds, VersionInfo: clusters.GetVersionInfo() + "0"}, []string{"default/a:80", "default/b:80"}},
		{"the served endpoint version over other names",
			&discoveryv3.DiscoveryRequest{TypeUrl: eds, VersionInfo: current, ResourceNames: edsNames[:1]}, edsNames[:1]},
		{"the endpoints' version from before the change",
			&discoveryv3.DiscoveryRequest{TypeUrl: eds, VersionInfo: endpoints.GetVersionInfo(), ResourceNames: edsNames}, edsNames},
		{"the served version with the rejection it sent last",
			&discoveryv3.DiscoveryRequest{TypeUrl: eds, VersionInfo: current, ResourceNames: edsNames,
				ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "rejected before the reconnect"}}, edsNames},
	} {
		s := openSotW(t, cp)
		s.send(c.req)
		resp := s.recv()
		if resp.GetTypeUrl() != c.req.GetTypeUrl() || !slices.Equal(namesOf(resp), c.want) {
			t.Errorf("a reconnect naming %s was sent %s %v, want the full set %v", c.what, shortType(resp.GetTypeUrl()), namesOf(resp), c.want)
		}
		s.close()
	}

	// A gRPC client drops an assignment its channel stops watching with no
	// response of the type, so its claim is answered with the set again,
	// at the version it named.
	g := openSotW(t, cp)
	g.userAgent = "gRPC Go"
	g.send(&discoveryv3.DiscoveryRequest{TypeUrl: eds, VersionInfo: current, ResourceNames: edsNames})
	if resp := g.recv(); resp.GetTypeUrl() != eds || !slices.Equal(namesOf(resp), edsNames) || resp.GetVersionInfo() != current {
		t.Errorf("a gRPC client's reconnect at the served endpoint version was sent %s %v at %s, want %v again at %s",
			shortType(resp.GetTypeUrl()), namesOf(resp), resp.GetVersionInfo(), edsNames, current)
	}
	g.close()
}

// TestSotWReconnectAfterAClusterCameBackIsSentItsAssignment checks that a
// SotW claim of assignments is taken as proof that the proxy holds them
// only because a proxy that drops one (with its cluster) is first sent a
// response that moves its version. The proxy's cluster b goes: the push
// ends with an empty assignments response versioned over the names the
// proxy keeps, which its unsubscription then states. b comes back
// unchanged before the server reads that unsubscription, and the stream
// breaks after the cluster's return but before b's assignment reached the
// proxy. On the new stream the proxy names the versions it last accepted:
// the clusters' is the served one (sent nothing), the assignments' is an
// empty response's over a's name alone, not the served one over both, so
// it is sent b's assignment.
func TestSotWReconnectAfterAClusterCameBackIsSentItsAssignment(t *testing.T) {
	b := testkit.Service("default", "b", "10.0.0.2")
	cp, key := startEnvoySotW(t, testkit.Service("default", "a", "10.0.0.1"), b)
	cds, eds, lds := xdstype.Cluster.URL(), xdstype.Endpoint.URL(), xdstype.Listener.URL()
	both, onlyA := []string{"default/a:80", "default/b:80"}, []string{"default/a:80"}

	first := openSotW(t, cp)
	first.send(&discoveryv3.DiscoveryRequest{TypeUrl: cds})
	clusters := first.recv()
	first.ack(clusters, nil)
	first.send(&discoveryv3.DiscoveryRequest{TypeUrl: eds, ResourceNames: both})
	endpoints := first.recv()
	first.ack(endpoints, both)

	// b goes: the clusters lose it, and the assignments' version moves to
	// the names the proxy keeps.
	cp.Catalog.DeleteService(b.Key)
	cp.Sync()
	without := first.recv()
	if without.GetTypeUrl() != cds || !slices.Equal(namesOf(without), onlyA) {
		t.Fatalf("after b left, the stream was sent %s %v, want the clusters without b", shortType(without.GetTypeUrl()), namesOf(without))
	}
	gone := first.recv()
	var keeps string
	cp.Store.Get(key).Read(func(v snapshot.View) {
		keeps = snapshot.SubsetVersion(v.TypeVersion(xdstype.Endpoint), snapshot.NameDigest(onlyA[0]))
	})
	if gone.GetTypeUrl() != eds || len(gone.GetResources()) != 0 || gone.GetVersionInfo() != keeps {
		t.Fatalf("after the clusters without b, the stream was sent %s %v at %s, want no assignment at %s (the version over the names the proxy keeps)",
			shortType(gone.GetTypeUrl()), namesOf(gone), gone.GetVersionInfo(), keeps)
	}
	// b comes back unchanged before the server reads the proxy's
	// unsubscription, which Envoy sends on dropping the cluster, before it
	// reads the empty response (so with the superseded nonce), and states
	// again in its ACK of that response.
	cp.Catalog.UpsertService(b)
	cp.Sync()
	first.ack(without, nil)
	first.send(&discoveryv3.DiscoveryRequest{TypeUrl: eds, VersionInfo: endpoints.GetVersionInfo(), ResponseNonce: endpoints.GetNonce(), ResourceNames: onlyA})
	first.ack(gone, onlyA)
	// b's return moved the assignments' type version, so the
	// unsubscription is answered with an empty response at the version
	// over a's name alone.
	moved := first.recv()
	if moved.GetTypeUrl() != eds || len(moved.GetResources()) != 0 || moved.GetVersionInfo() == gone.GetVersionInfo() {
		t.Fatalf("the unsubscription after b's return was answered with %s %v at %s, want no assignment at a version other than %s",
			shortType(moved.GetTypeUrl()), namesOf(moved), moved.GetVersionInfo(), gone.GetVersionInfo())
	}
	first.ack(moved, onlyA)
	back := first.recv()
	if back.GetTypeUrl() != cds || !slices.Equal(namesOf(back), both) || back.GetVersionInfo() != clusters.GetVersionInfo() {
		t.Fatalf("after b came back, the stream was sent %s %v at %s, want the first clusters again at %s",
			shortType(back.GetTypeUrl()), namesOf(back), back.GetVersionInfo(), clusters.GetVersionInfo())
	}
	first.ack(back, nil)
	first.send(&discoveryv3.DiscoveryRequest{TypeUrl: eds, VersionInfo: moved.GetVersionInfo(), ResponseNonce: moved.GetNonce(), ResourceNames: both})
	// The stream breaks before b's assignment reaches the proxy.
	first.close()

	second := openSotW(t, cp)
	second.send(&discoveryv3.DiscoveryRequest{TypeUrl: cds, VersionInfo: back.GetVersionInfo()})
	second.send(&discoveryv3.DiscoveryRequest{TypeUrl: eds, VersionInfo: moved.GetVersionInfo(), ResourceNames: both})
	second.send(&discoveryv3.DiscoveryRequest{TypeUrl: lds})
	got := second.recv()
	if got.GetTypeUrl() != eds {
		t.Fatalf("the reconnect naming the empty response's version was sent %s (version %s) first, and no assignment: b's cluster would wait for one",
			shortType(got.GetTypeUrl()), got.GetVersionInfo())
	}
	if !slices.Equal(namesOf(got), both) || got.GetVersionInfo() != endpoints.GetVersionInfo() {
		t.Errorf("the reconnect was sent the assignments %v at %s, want %v at the served %s", namesOf(got), got.GetVersionInfo(), both, endpoints.GetVersionInfo())
	}
	second.ack(got, both)
	if listeners := second.recv(); listeners.GetTypeUrl() != lds {
		t.Errorf("then %s, want the listeners: the clusters at the served version are sent nothing", shortType(listeners.GetTypeUrl()))
	}
}

// startEnvoySotW starts a control plane whose one scope, default/sotw, is
// an Envoy scope over SotW selecting every Service of default, the
// services; it stops when the test ends. It returns the scope's key.
func startEnvoySotW(t *testing.T, services ...*model.Service) (*controlPlane, model.Key) {
	t.Helper()
	key := model.Key{Namespace: "default", Name: "sotw"}
	return startEnvoyScopes(t, map[model.Key]model.Protocol{key: model.SotW}, services...), key
}

// startEnvoyScopes serves services in namespace default, each scope of
// scopes an Envoy-mode scope of its protocol selecting all of them, and
// stops the control plane when the test ends.
func startEnvoyScopes(t *testing.T, scopes map[model.Key]model.Protocol, services ...*model.Service) *controlPlane {
	t.Helper()
	w := newWorld()
	w.namespaces["default"] = map[string]string{}
	for _, svc := range services {
		w.services[svc.Key] = svc
	}
	for key, p := range scopes {
		w.scopes[key] = &model.Scope{
			Key: key, Generation: 1, Protocol: p,
			Listener:   model.Listener{Mode: model.ListenerEnvoy, Port: 10080},
			Selections: []model.Selection{{Namespace: "default", Selector: labels.Everything()}},
		}
	}
	cp, err := startControlPlane(w, server.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.stop(); err != nil {
			t.Error(err)
		}
	})
	return cp
}

// rawDelta is one delta stream driven request by request, to state exactly
// what a reconnecting proxy declares it holds.
type rawDelta struct {
	t      *testing.T
	stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	cancel context.CancelFunc
}

func openDelta(t *testing.T, cp *controlPlane) *rawDelta {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cp.conn).DeltaAggregatedResources(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r := &rawDelta{t: t, stream: stream, cancel: cancel}
	t.Cleanup(cancel)
	return r
}

func (r *rawDelta) send(req *discoveryv3.DeltaDiscoveryRequest) {
	r.t.Helper()
	req.Node = testkit.Node("raw-proxy", "default/delta")
	if err := r.stream.Send(req); err != nil {
		r.t.Fatal(err)
	}
}

// recv receives a response and ACKs it.
func (r *rawDelta) recv() *discoveryv3.DeltaDiscoveryResponse {
	r.t.Helper()
	resp, err := r.stream.Recv()
	if err != nil {
		r.t.Fatal(err)
	}
	r.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	return resp
}

// deltaNames is the names a delta response carries, and those it removes,
// each sorted.
func deltaNames(resp *discoveryv3.DeltaDiscoveryResponse) (sent, removed []string) {
	for _, res := range resp.GetResources() {
		sent = append(sent, res.GetName())
	}
	slices.Sort(sent)
	removed = slices.Sorted(slices.Values(resp.GetRemovedResources()))
	return sent, removed
}

// TestDeltaReconnectClaimsAreComparedExactly checks, over real gRPC, what a
// delta stream's first request of a type is sent for what the proxy
// declares it holds (initial_resource_versions): nothing when the claims
// are exactly what the scope serves, by wildcard or by name; the resource
// of every claim at another version (also when as many names are claimed
// as are served), of every served name not claimed, the removal of every
// claimed name the scope does not serve (by wildcard), and of every name
// subscribed that it does not serve, never of a claimed name not
// subscribed to, which subscribing to it later sends. After a reconnect
// that claimed exactly what is served, the next changes reach the stream as
// differences from that set: an update, a removal.
func TestDeltaReconnectClaimsAreComparedExactly(t *testing.T) {
	svcA := testkit.Service("default", "a", "10.0.0.1")
	key := model.Key{Namespace: "default", Name: "delta"}
	cp := startEnvoyScopes(t, map[model.Key]model.Protocol{key: model.Delta},
		svcA, testkit.Service("default", "b", "10.0.0.2"), testkit.Service("default", "c", "10.0.0.3"))
	cds, eds := xdstype.Cluster.URL(), xdstype.Endpoint.URL()
	names := []string{"default/a:80", "default/b:80", "default/c:80"}

	// What the scope serves, as a first stream that claims nothing is sent it.
	served := map[string]map[string]string{}
	first := openDelta(t, cp)
	first.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: cds})
	first.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: names})
	for range 2 {
		resp := first.recv()
		served[resp.GetTypeUrl()] = map[string]string{}
		for _, res := range resp.GetResources() {
			served[resp.GetTypeUrl()][res.GetName()] = res.GetVersion()
		}
	}
	first.cancel()
	for _, u := range []string{cds, eds} {
		if got := slices.Sorted(maps.Keys(served[u])); !slices.Equal(got, names) {
			t.Fatalf("the first stream was sent %s %v, want %v", shortType(u), got, names)
		}
	}
	claims := func(u string, edit func(map[string]string)) map[string]string {
		c := maps.Clone(served[u])
		edit(c)
		return c
	}

	for _, c := range []struct {
		what       string
		req        *discoveryv3.DeltaDiscoveryRequest
		sent, gone []string
	}{
		{"exactly what is served, by wildcard",
			&discoveryv3.DeltaDiscoveryRequest{TypeUrl: cds, InitialResourceVersions: claims(cds, func(map[string]string) {})},
			nil, nil},
		{"exactly what is served, by name",
			&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: names, InitialResourceVersions: claims(eds, func(map[string]string) {})},
			nil, nil},
		{"every served name, one at another version",
			&discoveryv3.DeltaDiscoveryRequest{TypeUrl: cds, InitialResourceVersions: claims(cds, func(m map[string]string) { m["default/a:80"] += "0" })},
			[]string{"default/a:80"}, nil},
		{"as many names as served, one of them unknown",
			&discoveryv3.DeltaDiscoveryRequest{TypeUrl: cds, InitialResourceVersions: claims(cds, func(m map[string]string) {
				delete(m, "default/c:80")
				m["default/gone:80"] = "1"
			})},
			[]string{"default/c:80"}, []string{"default/gone:80"}},
		{"a stale claim, an unknown one, a served name missing",
			&discoveryv3.DeltaDiscoveryRequest{TypeUrl: cds, InitialResourceVersions: claims(cds, func(m map[string]string) {
				m["default/b:80"] = "stale"
				delete(m, "default/c:80")
				m["default/gone:80"] = "1"
				m["default/gone2:80"] = served[cds]["default/a:80"]
			})},
			[]string{"default/b:80", "default/c:80"}, []string{"default/gone2:80", "default/gone:80"}},
		{"by name: a stale claim, a claim not subscribed to, a name subscribed the scope does not serve",
			&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{"default/a:80", "default/b:80", "default/nosuch:80"},
				InitialResourceVersions: claims(eds, func(m map[string]string) {
					m["default/b:80"] = "stale"
					m["default/unsubscribed:80"] = "1"
				})},
			[]string{"default/b:80"}, []string{"default/nosuch:80"}},
	} {
		s := openDelta(t, cp)
		s.send(c.req)
		resp := s.recv()
		sent, gone := deltaNames(resp)
		if resp.GetTypeUrl() != c.req.GetTypeUrl() || !slices.Equal(sent, c.sent) || !slices.Equal(gone, c.gone) {
			t.Errorf("a reconnect claiming %s was sent %s %v and removals %v, want %v and removals %v",
				c.what, shortType(resp.GetTypeUrl()), sent, gone, c.sent, c.gone)
		}
		for _, res := range resp.GetResources() {
			if res.GetVersion() != served[c.req.GetTypeUrl()][res.GetName()] {
				t.Errorf("a reconnect claiming %s was sent %s at %s, want the served %s", c.what, res.GetName(), res.GetVersion(), served[c.req.GetTypeUrl()][res.GetName()])
			}
		}
		s.cancel()
	}

	// A claim of a name not subscribed to is forgotten (the proxy drops
	// what it does not subscribe to): subscribing to it later sends it,
	// whether the claims were what is served or not.
	for _, stale := range []bool{false, true} {
		s := openDelta(t, cp)
		c := maps.Clone(served[eds])
		if stale {
			c["default/b:80"] = "stale"
		}
		s.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: names[:2], InitialResourceVersions: c})
		sent, gone := deltaNames(s.recv())
		if want := names[1:2]; !stale {
			want = nil
			if len(sent)+len(gone) > 0 {
				t.Errorf("a reconnect claiming what is served (stale %v) was sent %v and removals %v, want %v", stale, sent, gone, want)
			}
		} else if !slices.Equal(sent, want) || len(gone) > 0 {
			t.Errorf("a reconnect claiming what is served (stale %v) was sent %v and removals %v, want %v", stale, sent, gone, want)
		}
		// The listener request is a barrier: the stream handles requests
		// in order, so the listeners come first only if the subscription
		// was sent nothing.
		s.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: names[2:]})
		s.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Listener.URL()})
		resp := s.recv()
		if sent, gone := deltaNames(resp); resp.GetTypeUrl() != eds || !slices.Equal(sent, names[2:]) || len(gone) > 0 {
			t.Errorf("subscribing to %s, claimed but not subscribed to at the reconnect (stale %v), was then sent %s %v and removals %v",
				names[2], stale, shortType(resp.GetTypeUrl()), sent, gone)
		}
		s.cancel()
	}

	// A reconnect claiming exactly the served assignments, then a change
	// of one: only that one is sent, no removal.
	s := openDelta(t, cp)
	s.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: names, InitialResourceVersions: served[eds]})
	if sent, gone := deltaNames(s.recv()); len(sent)+len(gone) > 0 {
		t.Fatalf("a reconnect claiming what is served was sent %v and removals %v", sent, gone)
	}
	a := *svcA
	a.Endpoints = slices.Clone(a.Endpoints)
	a.Endpoints[0].Address = "10.0.0.9"
	cp.Catalog.UpsertService(&a)
	cp.Sync()
	change := s.recv()
	if sent, gone := deltaNames(change); change.GetTypeUrl() != eds || !slices.Equal(sent, names[:1]) || len(gone) > 0 {
		t.Fatalf("after the endpoint change the stream was sent %s %v and removals %v, want only %s", shortType(change.GetTypeUrl()), sent, gone, names[0])
	}
	cp.Catalog.DeleteService(model.Key{Namespace: "default", Name: "c"})
	cp.Sync()
	removal := s.recv()
	if sent, gone := deltaNames(removal); removal.GetTypeUrl() != eds || len(sent) > 0 || !slices.Equal(gone, names[2:]) {
		t.Fatalf("after Service c went the stream was sent %s %v and removals %v, want the removal of %s", shortType(removal.GetTypeUrl()), sent, gone, names[2])
	}
}
