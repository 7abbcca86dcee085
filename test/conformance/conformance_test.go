package conformance

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

var protocols = []struct {
	name   string
	client adsclient.Protocol
	scope  model.Protocol
}{{"SotW", adsclient.SotW, model.SotW}, {"Delta", adsclient.Delta, model.Delta}}

// world puts three Services in namespace shop, served by scope shop/gw.
func world(t *testing.T, protocol model.Protocol) *plane {
	p := newPlane(t)
	for _, name := range []string{"a", "b", "c"} {
		p.Catalog.UpsertService(testkit.Service("shop", name, "10.0.0.1", "10.0.0.2"))
	}
	p.Catalog.UpsertScope(envoyScope("shop", "gw", protocol))
	p.Sync()
	return p
}

// synced waits until the proxy holds exactly these clusters with their
// endpoints, the listener and its routes. A SotW proxy never deletes
// endpoints by omission (Envoy drops them with their cluster), so it may
// hold more.
func synced(px *proxy, clusters ...string) {
	px.t.Helper()
	px.wait("the sync", func(c *adsclient.Client) bool {
		eds := holds(xdstype.Endpoint.URL(), clusters...)(c)
		if px.protocol == adsclient.SotW {
			held := c.State(xdstype.Endpoint.URL())
			eds = true
			for _, n := range clusters {
				_, ok := held[n]
				eds = eds && ok
			}
		}
		// A delta proxy of the scope fetches a virtual host per cluster by
		// VHDS after the route configuration.
		vhds := px.protocol == adsclient.SotW || len(c.State(xdstype.VirtualHost.URL())) == len(clusters)
		return holds(xdstype.Cluster.URL(), clusters...)(c) && eds && vhds &&
			holds(xdstype.Listener.URL(), "http-10080")(c) && holds(xdstype.Route.URL(), "http-10080")(c)
	})
}

func TestInitialSyncInADSOrder(t *testing.T) {
	for _, pr := range protocols {
		t.Run(pr.name, func(t *testing.T) {
			p := world(t, pr.scope)
			px := p.connect(testkit.WildcardClient(pr.client, testkit.Node("envoy-1", "shop/gw")))
			synced(px, "shop/a:80", "shop/b:80", "shop/c:80")
			got := summary(px.settled())
			want := []string{"CDS[shop/a:80 shop/b:80 shop/c:80]", "EDS[shop/a:80 shop/b:80 shop/c:80]", "LDS[http-10080]", "RDS[http-10080]"}
			if pr.client == adsclient.Delta {
				// The route configuration names VHDS; its virtual hosts follow.
				want = append(want, "VHDS[http-10080/a.shop:80 http-10080/b.shop:80 http-10080/c.shop:80]")
			}
			if !slices.Equal(sortNames(got), want) {
				t.Errorf("initial sync sent\n%v\nwant one response per type:\n%v", got, want)
			}
			// Clusters before their endpoints, listeners before their routes.
			order := map[string]int{}
			for i, e := range px.Events() {
				order[short(e.TypeURL)] = i
			}
			if order["CDS"] > order["EDS"] || order["LDS"] > order["RDS"] || (pr.client == adsclient.Delta && order["RDS"] > order["VHDS"]) {
				t.Errorf("responses out of ADS order: %v", got)
			}
		})
	}
}

// sortNames sorts the names inside each summary entry ("TYPE[names]" or
// "TYPE[names]-[removed]"), since a response lists resources in no
// particular order, and then the entries.
func sortNames(s []string) []string {
	sortList := func(l string) string {
		names := strings.Fields(strings.Trim(l, "[]"))
		slices.Sort(names)
		return "[" + strings.Join(names, " ") + "]"
	}
	out := make([]string, len(s))
	for i, e := range s {
		typ, rest, _ := strings.Cut(e, "[")
		upserted, removed, hasRemoved := strings.Cut("["+rest, "]-[")
		out[i] = typ + sortList(upserted)
		if hasRemoved {
			out[i] += "-" + sortList(removed)
		}
	}
	slices.Sort(out)
	return out
}

func TestOneEndpointChangeSendsOneAssignment(t *testing.T) {
	for _, pr := range protocols {
		t.Run(pr.name, func(t *testing.T) {
			p := world(t, pr.scope)
			px := p.connect(testkit.WildcardClient(pr.client, testkit.Node("envoy-1", "shop/gw")))
			synced(px, "shop/a:80", "shop/b:80", "shop/c:80")
			before := len(px.settled())
			p.Catalog.UpsertService(testkit.Service("shop", "b", "10.0.0.1", "10.0.0.9"))
			p.Sync()
			px.wait("the new endpoint", func(c *adsclient.Client) bool {
				return strings.Contains(c.State(xdstype.Endpoint.URL())["shop/b:80"].Resource.String(), "10.0.0.9")
			})
			got := summary(px.settled()[before:])
			if want := []string{"EDS[shop/b:80]"}; !slices.Equal(got, want) {
				t.Errorf("one endpoint change sent %v, want %v (no CDS, LDS or RDS)", got, want)
			}
		})
	}
}

func TestServiceAddedAndRemoved(t *testing.T) {
	for _, pr := range protocols {
		t.Run(pr.name, func(t *testing.T) {
			p := world(t, pr.scope)
			px := p.connect(testkit.WildcardClient(pr.client, testkit.Node("envoy-1", "shop/gw")))
			synced(px, "shop/a:80", "shop/b:80", "shop/c:80")

			before := len(px.settled())
			p.Catalog.UpsertService(testkit.Service("shop", "d", "10.0.0.4"))
			p.Sync()
			synced(px, "shop/a:80", "shop/b:80", "shop/c:80", "shop/d:80")
			got := sortNames(summary(px.settled()[before:]))
			// Delta: one virtual host by VHDS, the route configuration as it
			// was; SotW: the route configuration, which carries them all.
			want := []string{"CDS[shop/d:80]", "EDS[shop/d:80]", "VHDS[http-10080/d.shop:80]"}
			if pr.client == adsclient.SotW {
				want = []string{"CDS[shop/a:80 shop/b:80 shop/c:80 shop/d:80]", "EDS[shop/d:80]", "RDS[http-10080]"} // the full set
			}
			if !slices.Equal(got, want) {
				t.Errorf("adding a Service sent %v, want %v", got, want)
			}

			before = len(px.Events())
			p.Catalog.DeleteService(model.Key{Namespace: "shop", Name: "a"})
			p.Sync()
			synced(px, "shop/b:80", "shop/c:80", "shop/d:80")
			got = summary(px.settled()[before:])
			// Children first: a delta proxy is told to drop the assignment
			// before its cluster. A SotW proxy is sent the cluster set once,
			// without the cluster, before the route configuration: the
			// Service's host names go with it, so no request that would have
			// gone anywhere fails meanwhile (TestSotWPortChangeMakesBeforeBreaking
			// is the case that would). It drops the assignment itself with
			// the cluster: nothing is sent for it but, last, an empty response
			// that moves its endpoints' version, so that it names the served
			// one when it reconnects.
			var wantSeq []string
			if pr.client == adsclient.SotW {
				wantSeq = []string{"CDS[3]", "RDS[http-10080]", "EDS[]"}
			} else {
				wantSeq = []string{"VHDS[]-[http-10080/a.shop:80]", "EDS[]-[shop/a:80]", "CDS[]-[shop/a:80]"}
			}
			if fmt.Sprint(normalizeRemoval(got, pr.client)) != fmt.Sprint(wantSeq) {
				t.Errorf("removing a Service sent %v, want %v", got, wantSeq)
			}
			if _, ok := px.State(xdstype.Endpoint.URL())["shop/a:80"]; ok && pr.client == adsclient.Delta {
				t.Error("a delta proxy still holds the removed Service's endpoints")
			}
		})
	}
}

// TestSotWPortChangeMakesBeforeBreaking moves a Service from port 80 to
// 81: its bare host names pass from the departing cluster to the new one,
// so a SotW proxy must be sent the cluster set with both first, then the
// route configuration, and only then the set without the departing one
// (make before break): otherwise the names would route to a cluster the
// proxy no longer holds until the routes arrive.
func TestSotWPortChangeMakesBeforeBreaking(t *testing.T) {
	p := world(t, model.SotW)
	px := p.connect(testkit.WildcardClient(adsclient.SotW, testkit.Node("envoy-1", "shop/gw")))
	synced(px, "shop/a:80", "shop/b:80", "shop/c:80")
	before := len(px.Events())
	moved := testkit.Service("shop", "a", "10.0.0.1", "10.0.0.2")
	moved.Ports[0].Port = 81
	p.Catalog.UpsertService(moved)
	p.Sync()
	synced(px, "shop/a:81", "shop/b:80", "shop/c:80")
	var got []string
	for _, s := range summary(px.settled()[before:]) {
		if strings.HasPrefix(s, "CDS[") || strings.HasPrefix(s, "RDS[") {
			got = append(got, s)
		}
	}
	want := []string{"CDS[shop/a:80 shop/a:81 shop/b:80 shop/c:80]", "RDS[http-10080]", "CDS[shop/a:81 shop/b:80 shop/c:80]"}
	if len(got) == 3 {
		for _, i := range []int{0, 2} {
			names := strings.Fields(strings.Trim(got[i][3:], "[]"))
			slices.Sort(names)
			got[i] = "CDS[" + strings.Join(names, " ") + "]"
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("moving a Service's port sent %v, want %v", got, want)
	}
}

// TestListenerPortChangeRemovesRouteBeforeListener moves an Envoy scope's
// listener to another port: a delta proxy must be told to drop the old
// route configuration before the old listener that names it (children
// first), after the new listener is in place.
func TestListenerPortChangeRemovesRouteBeforeListener(t *testing.T) {
	p := world(t, model.Delta)
	px := p.connect(testkit.WildcardClient(adsclient.Delta, testkit.Node("envoy-1", "shop/gw")))
	synced(px, "shop/a:80", "shop/b:80", "shop/c:80")
	before := len(px.settled())
	sc := envoyScope("shop", "gw", model.Delta)
	sc.Listener.Port = 10081
	p.Catalog.UpsertScope(sc)
	p.Sync()
	px.wait("the new listener alone", holds(xdstype.Listener.URL(), "http-10081"))
	got := summary(px.settled()[before:])
	removes := func(e string) bool { return strings.HasPrefix(e, "RDS[") && strings.HasSuffix(e, "-[http-10080]") }
	rds, lds := slices.IndexFunc(got, removes), slices.Index(got, "LDS[]-[http-10080]")
	add := slices.Index(got, "LDS[http-10081]")
	if rds < 0 || lds < 0 || add < 0 || rds > lds || add > rds {
		t.Errorf("moving the listener sent %v; want LDS[http-10081], then the route http-10080's removal, then LDS[]-[http-10080]", got)
	}
}

// normalizeRemoval abbreviates full cluster sets.
func normalizeRemoval(evs []string, p adsclient.Protocol) []string {
	var out []string
	for _, e := range evs {
		switch {
		case p == adsclient.SotW && strings.HasPrefix(e, "CDS["):
			out = append(out, fmt.Sprintf("CDS[%d]", len(strings.Fields(strings.Trim(e[3:], "[]")))))
		default:
			out = append(out, e)
		}
	}
	if len(out) > 0 && out[0] == "CDS[4]" {
		out[0] = "CDS[all 4]"
	}
	return out
}

func TestDeltaSubscribeAndUnsubscribe(t *testing.T) {
	p := world(t, model.Delta)
	px := p.connect(adsclient.Config{
		Protocol: adsclient.Delta, Node: testkit.Node("envoy-1", "shop/gw"), RecordEvents: true,
		Types: []string{xdstype.Endpoint.URL()}, Names: map[string][]string{xdstype.Endpoint.URL(): {"shop/a:80"}},
	})
	px.wait("the subscribed assignment", holds(xdstype.Endpoint.URL(), "shop/a:80"))
	if err := px.Subscribe(xdstype.Endpoint.URL(), "shop/b:80", "shop/missing:80"); err != nil {
		t.Fatal(err)
	}
	px.wait("the second assignment", holds(xdstype.Endpoint.URL(), "shop/a:80", "shop/b:80"))
	evs := px.settled()
	last := evs[len(evs)-1]
	if !slices.Equal(last.Names, []string{"shop/b:80"}) || !slices.Equal(last.Removed, []string{"shop/missing:80"}) {
		t.Errorf("subscribing to b and a missing name sent %v removed %v; want b, and the missing name announced as removed", last.Names, last.Removed)
	}
	if err := px.Unsubscribe(xdstype.Endpoint.URL(), "shop/a:80"); err != nil {
		t.Fatal(err)
	}
	px.wait("a dropped", holds(xdstype.Endpoint.URL(), "shop/b:80"))
	before := len(px.settled())
	p.Catalog.UpsertService(testkit.Service("shop", "a", "10.0.0.7"))
	p.Sync()
	if got := px.settled()[before:]; len(got) != 0 {
		t.Errorf("an unsubscribed resource was still pushed: %v", summary(got))
	}
}

func TestDeltaReconnectSendsOnlyDifferences(t *testing.T) {
	p := world(t, model.Delta)
	c := adsclient.New(testkit.WildcardClient(adsclient.Delta, testkit.Node("envoy-1", "shop/gw")))
	px := p.run(c, adsclient.Delta)
	synced(px, "shop/a:80", "shop/b:80", "shop/c:80")
	px.stop()

	// Current versions: the reconnect sends nothing but empty first responses.
	before := len(c.Events())
	px = p.run(c, adsclient.Delta)
	px.wait("reconnected", func(c *adsclient.Client) bool { return len(c.Events()) >= before+5 })
	for _, e := range px.settled()[before:] {
		if len(e.Names) != 0 || len(e.Removed) != 0 {
			t.Errorf("a reconnect with current versions got %s %v removed %v", short(e.TypeURL), e.Names, e.Removed)
		}
	}
	px.stop()

	// While disconnected: b's endpoints change, c goes away, d appears.
	p.Catalog.UpsertService(testkit.Service("shop", "b", "10.0.0.8"))
	p.Catalog.DeleteService(model.Key{Namespace: "shop", Name: "c"})
	p.Catalog.UpsertService(testkit.Service("shop", "d", "10.0.0.4"))
	p.Sync()
	before = len(c.Events())
	px = p.run(c, adsclient.Delta)
	synced(px, "shop/a:80", "shop/b:80", "shop/d:80")
	got := sortNames(summary(px.settled()[before:]))
	want := sortNames([]string{"CDS[shop/d:80]-[shop/c:80]", "EDS[shop/b:80 shop/d:80]-[shop/c:80]", "LDS[]", "RDS[]",
		"VHDS[http-10080/d.shop:80]-[http-10080/c.shop:80]"})
	if !slices.Equal(got, want) {
		t.Errorf("a reconnect with stale versions got\n%v\nwant only the differences\n%v", got, want)
	}
}

func TestDeltaReconnectWithInventedVersions(t *testing.T) {
	p := world(t, model.Delta)
	// A proxy that claims a resource that never existed and a wrong version
	// of one that does: the first is removed, the second resent.
	cfg := testkit.WildcardClient(adsclient.Delta, testkit.Node("envoy-1", "shop/gw"))
	cfg.Types = []string{xdstype.Cluster.URL()}
	cfg.Wildcard = map[string]bool{xdstype.Cluster.URL(): true}
	c := adsclient.New(cfg)
	px := p.run(c, adsclient.Delta)
	px.wait("clusters", holds(xdstype.Cluster.URL(), "shop/a:80", "shop/b:80", "shop/c:80"))
	px.stop()
	p.Catalog.DeleteService(model.Key{Namespace: "shop", Name: "c"})
	p.Catalog.UpsertService(testkit.Service("shop", "ghost", "10.0.0.5"))
	p.Sync()
	p.Catalog.DeleteService(model.Key{Namespace: "shop", Name: "ghost"})
	p.Sync()
	before := len(c.Events())
	px = p.run(c, adsclient.Delta)
	px.wait("c removed", holds(xdstype.Cluster.URL(), "shop/a:80", "shop/b:80"))
	got := px.settled()[before:]
	if len(got) != 1 || len(got[0].Names) != 0 || !slices.Equal(got[0].Removed, []string{"shop/c:80"}) {
		t.Errorf("reconnect claiming a deleted cluster got %v", summary(got))
	}
}

func TestNACKIsNotResentUntilANewVersion(t *testing.T) {
	for _, pr := range protocols {
		t.Run(pr.name, func(t *testing.T) {
			p := world(t, pr.scope)
			cfg := testkit.WildcardClient(pr.client, testkit.Node("picky", "shop/gw"))
			cfg.Reject = rejectOnce(xdstype.Cluster.URL(), "cluster shop/a:80: bad timeout")
			px := p.connect(cfg)
			px.wait("the NACK", func(c *adsclient.Client) bool { return c.Stats().NACKs == 1 })
			evs := px.settled()
			cds := 0
			for _, e := range evs {
				if e.TypeURL == xdstype.Cluster.URL() {
					cds++
				}
			}
			if cds != 1 {
				t.Errorf("after a NACK the server sent %d cluster responses, want 1 (no resend loop):\n%s", cds, describe(evs))
			}
			fb := p.Feedback.Get(model.Key{Namespace: "shop", Name: "gw"})
			if len(fb.NACKs) != 1 || fb.NACKs[0].Node != "picky" || fb.NACKs[0].Detail != "cluster shop/a:80: bad timeout" {
				t.Errorf("feedback NACKs: %+v", fb.NACKs)
			}
			// A new version of the clusters is sent and accepted, and with
			// it the rejected clusters the proxy still lacks.
			p.Catalog.UpsertService(testkit.Service("shop", "d", "10.0.0.4"))
			p.Sync()
			px.wait("the fixed version", holds(xdstype.Cluster.URL(), "shop/a:80", "shop/b:80", "shop/c:80", "shop/d:80"))
			px.settled()
			for _, pxy := range p.Feedback.Get(model.Key{Namespace: "shop", Name: "gw"}).Proxies {
				if len(pxy.Nacked) != 0 {
					t.Errorf("the proxy still counts as NACKing after accepting a new version: %v", pxy.Nacked)
				}
			}
		})
	}
}

func TestRefusals(t *testing.T) {
	p := world(t, model.SotW)
	cases := []struct {
		name     string
		protocol adsclient.Protocol
		scope    string
		code     codes.Code
		says     string
	}{
		{"no scope", adsclient.SotW, "", codes.InvalidArgument, `names no ProxyScope: set node.metadata["scopeplane.dev/scope"]`},
		{"malformed scope", adsclient.SotW, "shop", codes.InvalidArgument, `is not "<namespace>/<name>" of a ProxyScope`},
		{"unknown scope", adsclient.SotW, "shop/nope", codes.NotFound, `names ProxyScope "shop/nope", which does not exist`},
		{"wrong protocol", adsclient.Delta, "shop/gw", codes.FailedPrecondition, `ProxyScope "shop/gw" requires the SotW protocol (spec.protocol: SotW) but this proxy opened a Delta stream: set api_type: GRPC`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			px := p.connect(testkit.WildcardClient(tc.protocol, testkit.Node("knocker", tc.scope)))
			err := <-px.done
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.says) {
				t.Errorf("got %v\nwant %v containing %q", err, tc.code, tc.says)
			}
		})
	}
	if got := p.Feedback.Get(model.Key{Namespace: "shop", Name: "gw"}).Refused; got["WrongProtocol"] != 1 {
		t.Errorf("refusals counted for shop/gw: %v", got)
	}

	t.Run("unknown type URL", func(t *testing.T) {
		cfg := testkit.WildcardClient(adsclient.SotW, testkit.Node("odd", "shop/gw"))
		cfg.Types = append(cfg.Types, "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret")
		cfg.Wildcard["type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"] = true
		px := p.connect(cfg)
		err := <-px.done
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "is not served by scopeplane") {
			t.Errorf("an unknown type URL ended the stream with %v", err)
		}
	})
}

// TestWrongProtocolAdviceFitsTheClient: a gRPC client cannot switch to
// delta, so on a Delta scope it is told to change the scope; Envoy is told
// the api_type that fits.
func TestWrongProtocolAdviceFitsTheClient(t *testing.T) {
	p := world(t, model.Delta)
	cases := []struct {
		userAgent string
		says      string
		never     string
	}{
		{"gRPC Go", "gRPC xDS clients speak State of the World only: set the scope's spec.protocol: SotW", "api_type"},
		{"gRPC C-core", "set the scope's spec.protocol: SotW", "api_type"},
		{"gRPC Node Pure JS", "set the scope's spec.protocol: SotW", "api_type"},
		{"envoy", "set api_type: DELTA_GRPC in the ADS config of its bootstrap", "gRPC"},
	}
	for _, tc := range cases {
		t.Run(tc.userAgent, func(t *testing.T) {
			node := testkit.Node("client", "shop/gw")
			node.UserAgentName = tc.userAgent
			px := p.connect(testkit.WildcardClient(adsclient.SotW, node))
			err := <-px.done
			msg := status.Convert(err).Message()
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(msg, tc.says) || strings.Contains(msg, tc.never) {
				t.Errorf("got %v\nwant FailedPrecondition containing %q and not %q", err, tc.says, tc.never)
			}
		})
	}
}

func TestGracefulStopSendsProxiesElsewhere(t *testing.T) {
	for _, pr := range protocols {
		t.Run(pr.name, func(t *testing.T) {
			p := world(t, pr.scope)
			px := p.connect(testkit.WildcardClient(pr.client, testkit.Node("envoy-1", "shop/gw")))
			synced(px, "shop/a:80", "shop/b:80", "shop/c:80")
			p.stop()
			err := <-px.done
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "reconnect") {
				t.Errorf("a stream open during shutdown ended with %v, want Unavailable telling the proxy to reconnect", err)
			}
			if len(px.State(xdstype.Cluster.URL())) != 3 {
				t.Error("the proxy lost its configuration")
			}
		})
	}
}
