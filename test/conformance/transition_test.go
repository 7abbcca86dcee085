package conformance

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestProtocolSwitchIsARollout switches a scope from SotW to Delta while
// three SotW proxies are connected, then restarts them one by one as delta
// proxies: during the transition every proxy, old and new, keeps receiving
// the scope's changes.
func TestProtocolSwitchIsARollout(t *testing.T) {
	p := world(t, model.SotW)
	key := model.Key{Namespace: "shop", Name: "gw"}
	scope := func(pr model.Protocol) *model.Scope {
		sc := envoyScope("shop", "gw", pr)
		sc.TransitionWindow = time.Hour
		return sc
	}
	p.Catalog.UpsertScope(scope(model.SotW))
	p.Sync()
	var proxies [3]*proxy
	for i := range proxies {
		proxies[i] = p.connect(testkit.WildcardClient(adsclient.SotW, testkit.Node(fmt.Sprintf("envoy-%d", i), key.String())))
		synced(proxies[i], "shop/a:80", "shop/b:80", "shop/c:80")
	}

	p.Catalog.UpsertScope(scope(model.Delta))
	p.Sync()
	move := 0
	everyoneFollows := func(when string) {
		t.Helper()
		move++
		addr := fmt.Sprintf("10.0.9.%d", move)
		p.Catalog.UpsertService(testkit.Service("shop", "b", addr))
		p.Sync()
		for _, px := range proxies {
			px.wait(when+": the endpoint "+addr, func(c *adsclient.Client) bool {
				return strings.Contains(c.State(xdstype.Endpoint.URL())["shop/b:80"].Resource.String(), addr)
			})
		}
	}
	oldProxies := func() int {
		n := 0
		for _, px := range p.Feedback.Get(key).Proxies {
			if px.Protocol == model.SotW {
				n++
			}
		}
		return n
	}
	everyoneFollows("after the switch")
	if n := oldProxies(); n != 3 {
		t.Fatalf("%d SotW proxies connected after the switch, want 3", n)
	}
	for i := range proxies {
		proxies[i].stop()
		proxies[i] = p.connect(testkit.WildcardClient(adsclient.Delta, testkit.Node(fmt.Sprintf("envoy-%d", i), key.String())))
		synced(proxies[i], "shop/a:80", "shop/b:80", "shop/c:80")
		everyoneFollows(fmt.Sprintf("after restarting envoy-%d as delta", i))
		if n := oldProxies(); n != 2-i {
			t.Errorf("after restarting envoy-%d: %d SotW proxies, want %d", i, n, 2-i)
		}
	}
	if got := p.Feedback.Get(key).Refused["WrongProtocol"]; got != 0 {
		t.Errorf("%d streams refused during the transition", got)
	}
}

// TestProtocolTransitionEnds: when the window is over, streams of the old
// protocol are closed and new ones refused, as without a transition.
func TestProtocolTransitionEnds(t *testing.T) {
	p := world(t, model.SotW)
	sc := envoyScope("shop", "gw", model.SotW)
	sc.TransitionWindow = 2 * time.Second
	p.Catalog.UpsertScope(sc)
	p.Sync()
	old := p.connect(testkit.WildcardClient(adsclient.SotW, testkit.Node("envoy-old", "shop/gw")))
	synced(old, "shop/a:80", "shop/b:80", "shop/c:80")

	next := envoyScope("shop", "gw", model.Delta)
	next.TransitionWindow = sc.TransitionWindow
	p.Catalog.UpsertScope(next)
	p.Sync()
	// Served during the window...
	p.Catalog.UpsertService(testkit.Service("shop", "b", "10.0.9.9"))
	p.Sync()
	old.wait("a change during the transition", func(c *adsclient.Client) bool {
		return strings.Contains(c.State(xdstype.Endpoint.URL())["shop/b:80"].Resource.String(), "10.0.9.9")
	})
	// ...and closed after it.
	var err error
	select {
	case err = <-old.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the SotW stream outlived its transition")
	}
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "requires the Delta protocol") {
		t.Errorf("the SotW stream ended with %v, want FailedPrecondition naming Delta", err)
	}
	late := p.connect(testkit.WildcardClient(adsclient.SotW, testkit.Node("envoy-late", "shop/gw")))
	if err := <-late.done; status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a SotW stream after the transition: %v, want FailedPrecondition", err)
	}
}

// TestProtocolTransitionSurvivesARestart: a replica that starts while a
// transition is in progress (a restart, a new leader) learns it from the
// ProxyScope's status and keeps admitting and serving the old protocol's
// proxies until it ends.
func TestProtocolTransitionSurvivesARestart(t *testing.T) {
	p := newPlane(t)
	for _, name := range []string{"a", "b", "c"} {
		p.Catalog.UpsertService(testkit.Service("shop", name, "10.0.0.1", "10.0.0.2"))
	}
	ps := &xdsv1alpha1.ProxyScope{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "gw", Generation: 2},
		Spec: xdsv1alpha1.ProxyScopeSpec{
			Protocol: xdsv1alpha1.ProtocolDelta, ProtocolTransitionSeconds: ptr.To[int32](3600),
			Services: []xdsv1alpha1.ServiceSelection{{Selector: &metav1.LabelSelector{}}},
			Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](10080)},
		},
		// Written by the replica that saw spec.protocol change.
		Status: xdsv1alpha1.ProxyScopeStatus{ProtocolTransition: &xdsv1alpha1.ProtocolTransition{
			From: xdsv1alpha1.ProtocolSotW, Until: metav1.NewTime(time.Now().Add(time.Hour)), Proxies: 1,
		}},
	}
	upsert := func() {
		t.Helper()
		sc, err := convert.Scope(ps)
		if err != nil {
			t.Fatal(err)
		}
		p.Catalog.UpsertScope(sc)
		p.Sync()
	}
	upsert()

	old := p.connect(testkit.WildcardClient(adsclient.SotW, testkit.Node("envoy-old", "shop/gw")))
	synced(old, "shop/a:80", "shop/b:80", "shop/c:80")
	next := p.connect(testkit.WildcardClient(adsclient.Delta, testkit.Node("envoy-new", "shop/gw")))
	synced(next, "shop/a:80", "shop/b:80", "shop/c:80")

	// Another edit of the scope, now known to this replica, keeps the transition.
	ps.Generation++
	ps.Spec.Services = append(ps.Spec.Services, xdsv1alpha1.ServiceSelection{Names: []xdsv1alpha1.DNSLabel{"a"}})
	upsert()
	p.Catalog.UpsertService(testkit.Service("shop", "b", "10.0.9.9"))
	p.Sync()
	for _, px := range []*proxy{old, next} {
		px.wait("a change during the transition", func(c *adsclient.Client) bool {
			return strings.Contains(c.State(xdstype.Endpoint.URL())["shop/b:80"].Resource.String(), "10.0.9.9")
		})
	}
	// A SotW proxy that restarts (still on its old bootstrap) is admitted too.
	synced(p.connect(testkit.WildcardClient(adsclient.SotW, testkit.Node("envoy-old-2", "shop/gw"))), "shop/a:80", "shop/b:80", "shop/c:80")
	if got := p.Feedback.Get(model.Key{Namespace: "shop", Name: "gw"}).Refused["WrongProtocol"]; got != 0 {
		t.Errorf("%d streams refused during the transition", got)
	}
	if !old.Running() {
		t.Errorf("the SotW stream ended during the transition: %v", old.Err())
	}
}
