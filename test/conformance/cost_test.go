package conformance

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestOtherProtocolFigureIsTheOtherProtocolsBytes drives one event
// sequence through a SotW and a Delta copy of the same scope, one proxy
// each, and checks after every step that what each scope says the other
// protocol would have sent is what the other scope sent: to the byte,
// except where a reconnecting SotW proxy's claim cannot show what it holds.
func TestOtherProtocolFigureIsTheOtherProtocolsBytes(t *testing.T) {
	p := newPlane(t)
	const ns = "honest"
	addrs := map[string][]string{"a": {"10.0.0.1", "10.0.0.2", "10.0.0.3"}, "b": {"10.0.1.1"}, "c": {"10.0.2.1", "10.0.2.2"}}
	for name, a := range addrs {
		p.Catalog.UpsertService(testkit.Service(ns, name, a...))
	}
	sotwKey, deltaKey := model.Key{Namespace: ns, Name: "sotw"}, model.Key{Namespace: ns, Name: "delta"}
	p.Catalog.UpsertScope(envoyScope(ns, sotwKey.Name, model.SotW))
	p.Catalog.UpsertScope(envoyScope(ns, deltaKey.Name, model.Delta))
	p.Sync()

	var rejectClusters atomic.Bool
	client := func(pr adsclient.Protocol, node, scope string) *adsclient.Client {
		cfg := testkit.WildcardClient(pr, testkit.Node(node, scope))
		cfg.Reject = func(typeURL string, _ []*anypb.Any, _ []string) string {
			if typeURL == xdstype.Cluster.URL() && rejectClusters.Load() {
				return "cluster rejected by the test"
			}
			return ""
		}
		return adsclient.New(cfg)
	}
	sc, dc := client(adsclient.SotW, "s-1", sotwKey.String()), client(adsclient.Delta, "d-1", deltaKey.String())
	var sp, dp *proxy
	both := func(cond func(*adsclient.Client) bool, what string) {
		t.Helper()
		sp.wait(what, cond)
		dp.wait(what, cond)
		sp.settled()
		dp.settled()
	}
	syncedBoth := func(clusters ...string) {
		t.Helper()
		synced(sp, clusters...)
		synced(dp, clusters...)
		sp.settled()
		dp.settled()
	}
	endpoint := func(name, addr string) func(*adsclient.Client) bool {
		return func(c *adsclient.Client) bool {
			return strings.Contains(c.State(xdstype.Endpoint.URL())[ns+"/"+name+":80"].Resource.String(), addr)
		}
	}

	steps := []struct {
		name string
		do   func()
	}{
		{"initial sync", func() {
			sp, dp = p.run(sc, adsclient.SotW), p.run(dc, adsclient.Delta)
			syncedBoth("honest/a:80", "honest/b:80", "honest/c:80")
		}},
		{"endpoint change", func() {
			p.Catalog.UpsertService(testkit.Service(ns, "b", "10.0.1.9"))
			p.Sync()
			both(endpoint("b", "10.0.1.9"), "the moved endpoint")
		}},
		{"node drain", func() {
			p.Catalog.UpsertService(testkit.Service(ns, "a", "10.0.0.3"))
			p.Catalog.UpsertService(testkit.Service(ns, "c", "10.0.2.2"))
			p.Sync()
			both(func(c *adsclient.Client) bool {
				return !endpoint("a", "10.0.0.1")(c) && !endpoint("c", "10.0.2.1")(c)
			}, "the drained endpoints gone")
		}},
		{"Service added", func() {
			p.Catalog.UpsertService(testkit.Service(ns, "d", "10.0.3.1"))
			p.Sync()
			syncedBoth("honest/a:80", "honest/b:80", "honest/c:80", "honest/d:80")
		}},
		{"Service removed", func() {
			p.Catalog.DeleteService(model.Key{Namespace: ns, Name: "c"})
			p.Sync()
			syncedBoth("honest/a:80", "honest/b:80", "honest/d:80")
		}},
		{"reconnect", func() {
			sp.stop()
			dp.stop()
			sp, dp = p.run(sc, adsclient.SotW), p.run(dc, adsclient.Delta)
			syncedBoth("honest/a:80", "honest/b:80", "honest/d:80")
		}},
		{"NACK", func() {
			rejectClusters.Store(true)
			p.Catalog.UpsertService(testkit.Service(ns, "e", "10.0.4.1"))
			p.Sync()
			both(func(c *adsclient.Client) bool { return c.Stats().NACKs > 0 }, "the NACK")
		}},
		{"after the NACK", func() {
			// The proxies kept the clusters they held before the rejected
			// response: what the next change costs is priced from those.
			rejectClusters.Store(false)
			p.Catalog.UpsertService(testkit.Service(ns, "f", "10.0.5.1"))
			p.Sync()
			syncedBoth("honest/a:80", "honest/b:80", "honest/d:80", "honest/e:80", "honest/f:80")
		}},
	}

	var table strings.Builder
	fmt.Fprintf(&table, "%-16s %10s %12s %10s %12s\n", "step", "SotW sent", "SotW→delta", "delta sent", "delta→SotW")
	for _, step := range steps {
		s0, d0 := p.Feedback.Get(sotwKey).Total, p.Feedback.Get(deltaKey).Total
		step.do()
		s, d := diff(p.Feedback.Get(sotwKey).Total, s0), diff(p.Feedback.Get(deltaKey).Total, d0)
		fmt.Fprintf(&table, "%-16s %10d %12d %10d %12d\n", step.name, s.Bytes, s.OtherBytes, d.Bytes, d.OtherBytes)
		if step.name == "reconnect" {
			// A reconnecting SotW proxy names one version per type. Where it
			// names the served one it holds it all and is sent nothing, and
			// delta is priced at what a delta proxy then gets: an empty
			// response. A claim that does not match is priced as a full
			// resend: an upper bound, never less than what delta sent.
			if s.OtherBytes < d.Bytes || d.OtherBytes != s.Bytes {
				t.Errorf("reconnect: the SotW scope priced delta at %d, under the %d delta sent; the delta scope priced SotW at %d, SotW sent %d",
					s.OtherBytes, d.Bytes, d.OtherBytes, s.Bytes)
			}
		} else if s.OtherBytes != d.Bytes || d.OtherBytes != s.Bytes {
			t.Errorf("%s: the SotW scope sent %d and priced delta at %d; the delta scope sent %d and priced SotW at %d",
				step.name, s.Bytes, s.OtherBytes, d.Bytes, d.OtherBytes)
		}
		if step.name == "reconnect" && (s.Connects == 0 || d.Connects == 0 || s.ConnectBytes != s.Bytes) {
			t.Errorf("reconnect not counted as connects: SotW %+v, delta %+v", s, d)
		}
		if step.name == "NACK" && (s.HeldBack != d.OtherHeldBack || d.HeldBack != s.OtherHeldBack || s.HeldBack <= d.HeldBack) {
			t.Errorf("NACK blast radius: SotW held back %d (delta would have: %d), delta held back %d (SotW would have: %d)",
				s.HeldBack, s.OtherHeldBack, d.HeldBack, d.OtherHeldBack)
		}
	}
	t.Logf("bytes per step, actual and priced in the other protocol:\n%s", table.String())
}

func diff(after, before feedback.Cost) feedback.Cost {
	return feedback.Cost{
		Pushes: after.Pushes - before.Pushes, Bytes: after.Bytes - before.Bytes, OtherBytes: after.OtherBytes - before.OtherBytes,
		Connects: after.Connects - before.Connects, ConnectBytes: after.ConnectBytes - before.ConnectBytes,
		ConnectOtherBytes: after.ConnectOtherBytes - before.ConnectOtherBytes,
		NACKs:             after.NACKs - before.NACKs, HeldBack: after.HeldBack - before.HeldBack, OtherHeldBack: after.OtherHeldBack - before.OtherHeldBack,
	}
}

// TestUsageFollowsByNameSubscriptions: a client that subscribes by name,
// as gRPC's does, asks for the Services it names and no other; one that
// subscribes with a wildcard, as Envoy does, asks for all of them.
func TestUsageFollowsByNameSubscriptions(t *testing.T) {
	p := newPlane(t)
	for _, name := range []string{"a", "b", "c"} {
		p.Catalog.UpsertService(testkit.Service("use", name, "10.0.0.1"))
	}
	sc := envoyScope("use", "grpc", model.SotW)
	sc.Listener = model.Listener{Mode: model.ListenerProxylessGRPC}
	p.Catalog.UpsertScope(sc)
	p.Sync()
	key := model.Key{Namespace: "use", Name: "grpc"}
	for _, pr := range []adsclient.Protocol{adsclient.SotW, adsclient.Delta} {
		if pr == adsclient.Delta {
			sc.Protocol = model.Delta
			p.Catalog.UpsertScope(sc)
			p.Sync()
		}
		cfg := adsclient.Config{Protocol: pr, Node: testkit.Node("app-"+pr.String(), key.String()), Types: xdstype.URLs(),
			Names: map[string][]string{
				xdstype.Listener.URL(): {"a.use.svc.cluster.local:80"},
				xdstype.Cluster.URL():  {"use/a:80"},
				xdstype.Endpoint.URL(): {"use/a:80"},
			}}
		app := p.connect(cfg)
		app.wait("the listener of a", holds(xdstype.Listener.URL(), "a.use.svc.cluster.local:80"))
		u := p.Feedback.Get(key).Usage
		if u.All || len(u.Services) != 1 || !u.Services[model.Key{Namespace: "use", Name: "a"}] {
			t.Errorf("%s: usage %+v, want only use/a", pr, u)
		}
		app.stop()
	}
	sc.Protocol = model.SotW
	p.Catalog.UpsertScope(sc)
	p.Sync()
	envoy := p.connect(testkit.WildcardClient(adsclient.SotW, testkit.Node("envoy", key.String())))
	envoy.wait("the clusters", holds(xdstype.Cluster.URL(), "use/a:80", "use/b:80", "use/c:80"))
	if u := p.Feedback.Get(key).Usage; !u.All {
		t.Errorf("a wildcard subscriber does not ask for all: %+v", u)
	}
}
