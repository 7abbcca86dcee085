package translate

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	statefulsessionv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/stateful_session/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	cookiesessionv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/stateful_session/cookie/v3"
	headersessionv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/stateful_session/header/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/envoyvalid"
	"github.com/scopeplane/scopeplane/xds/model"
)

// meshWorld is a Service "reviews" with two versions behind it, as a
// canary is set up: reviews-v1 and reviews-v2 each on port 9080.
func meshWorld() (*model.Service, map[model.Key]*model.Service) {
	svc := func(name, uid string) *model.Service {
		return &model.Service{
			Key: model.Key{Namespace: "shop", Name: name}, UID: uid,
			Ports: []model.ServicePort{{Name: "grpc", Port: 9080, Protocol: model.ProtocolTCP, AppProtocol: "grpc", TargetPort: 9080}},
		}
	}
	parent := svc("reviews", "u0")
	return parent, map[model.Key]*model.Service{
		{Namespace: "shop", Name: "reviews-v1"}: svc("reviews-v1", "u1"),
		{Namespace: "shop", Name: "reviews-v2"}: svc("reviews-v2", "u2"),
	}
}

func backend(name string, weight int32) model.RouteBackend {
	return model.RouteBackend{Service: model.Key{Namespace: "shop", Name: name}, Port: 9080, Weight: weight}
}

func ptrTo[T any](v T) *T { return &v }

// canaryRoute sends requests with header "x-canary: yes" to v2, a method
// prefix to v2 with a timeout and a retry, and the rest 90/10.
func canaryRoute() *model.Route {
	return &model.Route{
		Key: model.Key{Namespace: "shop", Name: "reviews"}, Kind: model.HTTPRoute,
		Parents: []model.RouteParent{{Service: model.Key{Namespace: "shop", Name: "reviews"}}},
		Rules: []model.RouteRule{
			{Backends: []model.RouteBackend{backend("reviews-v1", 90), backend("reviews-v2", 10), backend("reviews-v3", 5)}},
			{
				Matches:  []model.RouteMatch{{PathType: model.PathPrefix, Path: "/", Headers: []model.ValueMatch{{Name: "x-canary", Value: "yes"}}}},
				Backends: []model.RouteBackend{backend("reviews-v2", 1)},
			},
			{
				Matches:         []model.RouteMatch{{PathType: model.PathPrefix, Path: "/shop.Reviews/"}, {PathType: model.PathExact, Path: "/x", Query: []model.ValueMatch{{Name: "q", Value: "1"}}}},
				Backends:        []model.RouteBackend{backend("reviews-v2", 1), backend("reviews-v1", 0)},
				Timeout:         ptrTo(2 * time.Second),
				Retry:           &model.RouteRetry{Codes: []int32{503}, Attempts: ptrTo[int32](3)},
				ResponseHeaders: &model.HeaderModifier{Set: []model.Header{{Name: "x-served-by", Value: "canary"}}},
			},
			{Matches: []model.RouteMatch{{PathType: model.PathExact, Path: "/gone"}}, Backends: []model.RouteBackend{backend("missing", 1)}},
		},
	}
}

func routesOf(t *testing.T, f Fragment, mode model.ListenerMode) []*routev3.Route {
	t.Helper()
	if mode == model.ListenerEnvoy {
		if len(f.Hosts) != 1 {
			t.Fatalf("%d virtual hosts, want 1", len(f.Hosts))
		}
		return f.Hosts[0].GetRoutes()
	}
	if len(f.Routes) != 1 {
		t.Fatalf("%d route configurations, want 1", len(f.Routes))
	}
	if err := f.Routes[0].ValidateAll(); err != nil {
		t.Errorf("ValidateAll: %v", err)
	}
	return f.Routes[0].GetVirtualHosts()[0].GetRoutes()
}

// TestMeshRouteEnvoyMode checks the order Gateway API gives the entries
// and what each carries in Envoy mode, where every field is served.
func TestMeshRouteEnvoyMode(t *testing.T) {
	parent, backends := meshWorld()
	f := RoutedService(parent, Profile{Mode: model.ListenerEnvoy}, &Routing{Routes: []*model.Route{canaryRoute()}, Backends: backends})
	routes := routesOf(t, f, model.ListenerEnvoy)
	for _, r := range routes {
		if err := r.ValidateAll(); err != nil {
			t.Errorf("ValidateAll: %v", err)
		}
	}
	// Exact paths first (the /x exact with a query, then /gone), then
	// the longest prefix, then "/" with a header before "/" without.
	var order []string
	for _, r := range routes {
		m := r.GetMatch()
		order = append(order, m.GetPath()+m.GetPathSeparatedPrefix()+m.GetPrefix())
	}
	if want := []string{"/x", "/gone", "/shop.Reviews", "/", "/"}; !slices.Equal(order, want) {
		t.Fatalf("entries %v, want %v", order, want)
	}
	if len(routes[3].GetMatch().GetHeaders()) != 1 || len(routes[4].GetMatch().GetHeaders()) != 0 {
		t.Errorf("the header match must come before the catch-all: %v", routes[3:])
	}
	if got := routes[0].GetMatch().GetQueryParameters(); len(got) != 1 || got[0].GetName() != "q" {
		t.Errorf("query match %v", got)
	}
	if got := routes[1].GetDirectResponse().GetStatus(); got != 500 {
		t.Errorf("a rule whose backends all are missing answers %d, want 500", got)
	}
	split := routes[4].GetRoute().GetWeightedClusters()
	if len(split.GetClusters()) != 2 || split.GetClusters()[0].GetName() != "shop/reviews-v1:9080" || split.GetClusters()[0].GetWeight().GetValue() != 90 || split.GetClusters()[1].GetWeight().GetValue() != 10 {
		t.Errorf("weighted clusters %v, want reviews-v1 90, reviews-v2 10 (the missing v3 left out)", split)
	}
	if split.GetTotalWeight() != nil { //nolint:staticcheck // the deprecated field proxyless clients are sent
		t.Errorf("Envoy deprecates total_weight: %v", split.GetTotalWeight()) //nolint:staticcheck // the deprecated field proxyless clients are sent
	}
	prefix := routes[2]
	if got := prefix.GetRoute().GetCluster(); got != "shop/reviews-v2:9080" {
		t.Errorf("a weight-0 backend is left out, one backend is a plain cluster: %q", got)
	}
	if got := prefix.GetRoute().GetTimeout().AsDuration(); got != 2*time.Second {
		t.Errorf("timeout %v", got)
	}
	rp := prefix.GetRoute().GetRetryPolicy()
	if rp.GetRetryOn() != "retriable-status-codes" || !slices.Equal(rp.GetRetriableStatusCodes(), []uint32{503}) || rp.GetNumRetries().GetValue() != 3 {
		t.Errorf("retry policy %v", rp)
	}
	if got := prefix.GetResponseHeadersToAdd(); len(got) != 1 || got[0].GetHeader().GetKey() != "x-served-by" {
		t.Errorf("response headers %v", got)
	}
}

// TestMeshRouteProxylessMode checks the encodings every gRPC client
// accepts, and that what no gRPC client can honour is left out.
func TestMeshRouteProxylessMode(t *testing.T) {
	parent, backends := meshWorld()
	f := RoutedService(parent, Profile{Mode: model.ListenerProxylessGRPC}, &Routing{Routes: []*model.Route{canaryRoute()}, Backends: backends})
	routes := routesOf(t, f, model.ListenerProxylessGRPC)
	// The query match and the rule with no backend left are not sent.
	if len(routes) != 3 {
		t.Fatalf("%d entries, want 3:\n%v", len(routes), routes)
	}
	if got := routes[0].GetMatch().GetSafeRegex().GetRegex(); got != `/shop\.Reviews(/.*)?` {
		t.Errorf("a prefix goes as a segment-aware regular expression, got %q", got)
	}
	hm := routes[1].GetMatch().GetHeaders()
	if len(hm) != 1 || hm[0].GetExactMatch() != "yes" { //nolint:staticcheck // the deprecated field proxyless clients are sent
		t.Errorf("header matches go in exact_match, which gRPC C-core 1.51 reads: %v", hm)
	}
	split := routes[2].GetRoute().GetWeightedClusters()
	if split.GetTotalWeight().GetValue() != 100 { //nolint:staticcheck // the deprecated field proxyless clients are sent
		t.Errorf("total_weight %v, want the sum 100", split.GetTotalWeight()) //nolint:staticcheck // the deprecated field proxyless clients are sent
	}
	if got := split.GetClusters()[0].GetName(); got != "shop/reviews-v1:9080@u1" {
		t.Errorf("proxyless cluster names carry the backend's UID: %q", got)
	}
	a := routes[0].GetRoute()
	if a.GetTimeout() != nil || a.GetMaxStreamDuration().GetMaxStreamDuration().AsDuration() != 2*time.Second {
		t.Errorf("a timeout goes as max_stream_duration (gRFC A31): %v", a)
	}
	if rp := a.GetRetryPolicy(); rp.GetRetryOn() != "unavailable" || rp.GetNumRetries().GetValue() != 3 || rp.GetRetryBackOff().GetBaseInterval() == nil {
		t.Errorf("retry policy %v, want unavailable, 3 retries and a base interval", rp)
	}
	if len(routes[0].GetResponseHeadersToAdd()) != 0 {
		t.Error("header modifiers are not sent to gRPC clients")
	}
	if got := ProxylessOmissions(canaryRoute()); len(got) != 1 || got[0] != "rule 2: query parameter matches, header modifiers" {
		t.Errorf("omissions %q", got)
	}
}

// TestGRPCRouteWinsOverHTTPRoute checks that a GRPCRoute and an HTTPRoute
// on one port do not merge, and that a GRPCRoute method match is a path.
func TestGRPCRouteWinsOverHTTPRoute(t *testing.T) {
	parent, backends := meshWorld()
	grpc := &model.Route{
		Key: model.Key{Namespace: "shop", Name: "by-method"}, Kind: model.GRPCRoute,
		Parents: []model.RouteParent{{Service: parent.Key, Port: 9080}},
		Rules: []model.RouteRule{
			{Matches: []model.RouteMatch{{GRPC: true, GRPCService: "shop.Reviews", GRPCMethod: "Get"}}, Backends: []model.RouteBackend{backend("reviews-v2", 1)}},
			{Matches: []model.RouteMatch{{GRPC: true, GRPCService: "shop.Reviews"}}, Backends: []model.RouteBackend{backend("reviews-v1", 1)}},
		},
	}
	for _, mode := range []model.ListenerMode{model.ListenerEnvoy, model.ListenerProxylessGRPC} {
		f := RoutedService(parent, Profile{Mode: mode}, &Routing{Routes: []*model.Route{canaryRoute(), grpc}, Backends: backends})
		routes := routesOf(t, f, mode)
		if len(routes) != 2 || routes[0].GetMatch().GetPath() != "/shop.Reviews/Get" || routes[1].GetMatch().GetPrefix() != "/shop.Reviews/" {
			t.Errorf("%s: entries %v, want the GRPCRoute's only, the method first", mode, routes)
		}
	}
}

// TestMeshRoutePortAndNoRoute checks that a route bound to another port
// leaves a port with its one route to its own endpoints, and that a
// proxyless port whose every rule was left out matches no call.
func TestMeshRoutePortAndNoRoute(t *testing.T) {
	parent, backends := meshWorld()
	other := canaryRoute()
	other.Parents[0].Port = 8080
	f := RoutedService(parent, Profile{Mode: model.ListenerProxylessGRPC}, &Routing{Routes: []*model.Route{other}, Backends: backends})
	if routes := routesOf(t, f, model.ListenerProxylessGRPC); len(routes) != 1 || routes[0].GetRoute().GetCluster() != "shop/reviews:9080@u0" || routes[0].GetMatch().GetPrefix() != "/" {
		t.Errorf("routes of an unrouted port %v", routes)
	}
	none := canaryRoute()
	none.Rules = none.Rules[3:] // only the rule whose backend is missing
	f = RoutedService(parent, Profile{Mode: model.ListenerProxylessGRPC}, &Routing{Routes: []*model.Route{none}, Backends: backends})
	if routes := routesOf(t, f, model.ListenerProxylessGRPC); len(routes) != 1 || routes[0].GetMatch().GetPath() != "/" {
		t.Errorf("routes when every rule is left out %v, want one that matches no gRPC method", routes)
	}
}

// TestInvalidEntryIsLeftOut checks that an entry Envoy's validation rejects
// (a header value with a line break, which Gateway API's schema allows) is
// left out of the configuration while the route's other entries are
// served, and that InvalidEntries names it for the route's status.
func TestInvalidEntryIsLeftOut(t *testing.T) {
	parent, backends := meshWorld()
	r := canaryRoute()
	r.Rules[1].ResponseHeaders = &model.HeaderModifier{Set: []model.Header{{Name: "x-note", Value: "a\r\nset-cookie: b"}}}
	f := RoutedService(parent, Profile{Mode: model.ListenerEnvoy}, &Routing{Routes: []*model.Route{r}, Backends: backends})
	routes := routesOf(t, f, model.ListenerEnvoy)
	for _, rt := range routes {
		if err := rt.ValidateAll(); err != nil {
			t.Errorf("an invalid entry was served: %v", err)
		}
		if len(rt.GetMatch().GetHeaders()) > 0 {
			t.Errorf("the entry with the bad header value was served: %v", rt)
		}
	}
	if len(routes) != 4 {
		t.Errorf("%d entries, want the other 4", len(routes))
	}
	if got := InvalidEntries(r); len(got) != 1 || !strings.HasPrefix(got[0], "rule 1 match 0: ") {
		t.Errorf("InvalidEntries %q, want rule 1's entry", got)
	}
	if got := InvalidEntries(canaryRoute()); len(got) != 0 {
		t.Errorf("InvalidEntries of a valid route %q", got)
	}
}

// TestPrefixReplacement checks ReplacePrefixMatch against Gateway API's own
// table of examples (HTTPPathModifier's documentation), applying the regular expression Envoy is sent with Go's
// RE2 (Envoy's \1 as Go's ${1}): segment by segment, and never a double
// slash.
func TestPrefixReplacement(t *testing.T) {
	for _, c := range []struct{ prefix, request, replace, want string }{
		{"/foo", "/foo/bar", "/xyz", "/xyz/bar"},
		{"/foo", "/foo/bar", "/xyz/", "/xyz/bar"},
		{"/foo/", "/foo/bar", "/xyz", "/xyz/bar"},
		{"/foo/", "/foo/bar", "/xyz/", "/xyz/bar"},
		{"/foo", "/foo", "/xyz", "/xyz"},
		{"/foo/", "/foo", "/xyz", "/xyz"},
		{"/foo", "/foo/", "/xyz", "/xyz/"},
		{"/foo", "/foo/bar", "/", "/bar"},
		{"/foo", "/foo", "/", "/"},
		{"/foo", "/foo/", "/", "/"},
		{"/", "/foo", "/xyz", "/xyz/foo"},
		{"/foo", "/foo/bar", "", "/bar"},
		{"/foo", "/foo/", "", "/"},
		{"/foo", "/foo", "", "/"},
	} {
		m := &model.RouteMatch{PathType: model.PathPrefix, Path: c.prefix}
		rw := prefixReplacement(m, c.replace)
		re := regexp.MustCompile(rw.GetPattern().GetRegex())
		got := re.ReplaceAllString(c.request, strings.ReplaceAll(rw.GetSubstitution(), `\1`, "${1}"))
		if got != c.want {
			t.Errorf("prefix %s, %s replaced by %s: %s, want %s", c.prefix, c.request, c.replace, got, c.want)
		}
	}
}

// TestRedirectAndRewrite checks the Envoy actions of RequestRedirect and
// URLRewrite, and that proxyless clients are sent neither a redirect (the
// rule is left out) nor a rewrite.
func TestRedirectAndRewrite(t *testing.T) {
	parent, backends := meshWorld()
	r := canaryRoute()
	r.Rules = []model.RouteRule{
		{
			Matches:  []model.RouteMatch{{PathType: model.PathPrefix, Path: "/old"}},
			Redirect: &model.Redirect{Scheme: "https", Hostname: "example.org", Port: 8443, StatusCode: 301, Path: &model.PathModifier{Value: "/new"}},
		},
		{
			Backends: []model.RouteBackend{backend("reviews-v1", 1)},
			Rewrite:  &model.Rewrite{Hostname: "reviews.internal", Path: &model.PathModifier{Full: true, Value: "/v1"}},
		},
	}
	f := RoutedService(parent, Profile{Mode: model.ListenerEnvoy}, &Routing{Routes: []*model.Route{r}, Backends: backends})
	routes := routesOf(t, f, model.ListenerEnvoy)
	if len(routes) != 2 {
		t.Fatalf("%d entries, want 2", len(routes))
	}
	rd := routes[0].GetRedirect()
	if rd.GetSchemeRedirect() != "https" || rd.GetHostRedirect() != "example.org" || rd.GetPortRedirect() != 8443 ||
		rd.GetResponseCode() != routev3.RedirectAction_MOVED_PERMANENTLY || rd.GetRegexRewrite().GetSubstitution() != `/new\1` {
		t.Errorf("redirect %v", rd)
	}
	a := routes[1].GetRoute()
	if a.GetHostRewriteLiteral() != "reviews.internal" || a.GetRegexRewrite().GetSubstitution() != "/v1" || a.GetRegexRewrite().GetPattern().GetRegex() != "^/.*$" {
		t.Errorf("rewrite %v", a)
	}
	f = RoutedService(parent, Profile{Mode: model.ListenerProxylessGRPC}, &Routing{Routes: []*model.Route{r}, Backends: backends})
	routes = routesOf(t, f, model.ListenerProxylessGRPC)
	if len(routes) != 1 || routes[0].GetRoute().GetRegexRewrite() != nil || routes[0].GetRoute().GetHostRewriteLiteral() != "" {
		t.Errorf("proxyless entries %v, want the rewrite's rule alone, without its rewrite", routes)
	}
	if got := ProxylessOmissions(r); len(got) != 2 || !strings.Contains(got[0], "the redirect (the rule is left out)") || !strings.Contains(got[1], "the URL rewrite") {
		t.Errorf("omissions %q", got)
	}
}

// TestBackendHeaderModifiers checks that a backendRef's own header
// modifiers go on its weighted cluster, or on the entry when it is the
// rule's one backend, and never to proxyless clients.
func TestBackendHeaderModifiers(t *testing.T) {
	parent, backends := meshWorld()
	r := canaryRoute()
	v2 := backend("reviews-v2", 10)
	v2.RequestHeaders = &model.HeaderModifier{Set: []model.Header{{Name: "x-version", Value: "v2"}}}
	r.Rules = []model.RouteRule{{Backends: []model.RouteBackend{backend("reviews-v1", 90), v2}}}
	routes := routesOf(t, RoutedService(parent, Profile{Mode: model.ListenerEnvoy}, &Routing{Routes: []*model.Route{r}, Backends: backends}), model.ListenerEnvoy)
	cs := routes[0].GetRoute().GetWeightedClusters().GetClusters()
	if len(cs) != 2 || len(cs[0].GetRequestHeadersToAdd()) != 0 || len(cs[1].GetRequestHeadersToAdd()) != 1 || cs[1].GetRequestHeadersToAdd()[0].GetHeader().GetValue() != "v2" {
		t.Errorf("weighted clusters %v, want x-version: v2 on reviews-v2's alone", cs)
	}
	r.Rules[0].Backends = []model.RouteBackend{v2}
	routes = routesOf(t, RoutedService(parent, Profile{Mode: model.ListenerEnvoy}, &Routing{Routes: []*model.Route{r}, Backends: backends}), model.ListenerEnvoy)
	if got := routes[0].GetRequestHeadersToAdd(); len(got) != 1 || got[0].GetHeader().GetKey() != "x-version" {
		t.Errorf("one backend's modifier on the entry: %v", got)
	}
	routes = routesOf(t, RoutedService(parent, Profile{Mode: model.ListenerProxylessGRPC}, &Routing{Routes: []*model.Route{r}, Backends: backends}), model.ListenerProxylessGRPC)
	if len(routes[0].GetRequestHeadersToAdd()) != 0 {
		t.Error("a backend's header modifier was sent to proxyless clients")
	}
}

// TestMirrorsAndSessions checks that a rule's mirrors become request
// mirror policies with their share, that a mirror whose backend cannot be
// served is left out, that a session becomes the entry's stateful session
// (a cookie scoped to the entry's path, or a header), and that proxyless
// clients get neither and the route's status says so.
func TestMirrorsAndSessions(t *testing.T) {
	parent, backends := meshWorld()
	r := canaryRoute()
	mirror := func(name string, n, d int32) model.RouteMirror {
		return model.RouteMirror{Backend: backend(name, 1), Numerator: n, Denominator: d}
	}
	r.Rules = []model.RouteRule{
		{
			Matches:  []model.RouteMatch{{PathType: model.PathPrefix, Path: "/cart/"}},
			Backends: []model.RouteBackend{backend("reviews-v1", 1)},
			Mirrors:  []model.RouteMirror{mirror("reviews-v2", 1, 1), mirror("reviews-v2", 5, 100), mirror("reviews-v2", 1, 3), mirror("missing", 1, 1), mirror("reviews-v2", 0, 1)},
			Session:  &model.SessionPersistence{Name: "sticky", TTL: time.Hour},
		},
		{
			Backends: []model.RouteBackend{backend("reviews-v1", 1)},
			Session:  &model.SessionPersistence{Header: true, Name: "x-session"},
		},
	}
	rt := &Routing{Routes: []*model.Route{r}, Backends: backends}
	envoy := RoutedService(parent, Profile{Mode: model.ListenerEnvoy}, rt)
	for _, vh := range envoy.Hosts {
		if err := envoyvalid.Message(vh); err != nil {
			t.Errorf("Envoy would reject the virtual host: %v", err)
		}
	}
	routes := routesOf(t, envoy, model.ListenerEnvoy)
	if len(routes) != 2 {
		t.Fatalf("%d entries, want 2", len(routes))
	}
	var got []string
	for _, p := range routes[0].GetRoute().GetRequestMirrorPolicies() {
		f := p.GetRuntimeFraction().GetDefaultValue()
		got = append(got, fmt.Sprintf("%s %d/%s", p.GetCluster(), f.GetNumerator(), f.GetDenominator()))
	}
	v2 := clusterName(backends[model.Key{Namespace: "shop", Name: "reviews-v2"}], 9080, model.ListenerEnvoy)
	if want := []string{v2 + " 0/HUNDRED", v2 + " 5/HUNDRED", v2 + " 333333/MILLION"}; !slices.Equal(got, want) {
		t.Errorf("mirror policies %q, want %q (all: no fraction)", got, want)
	}
	if routes[0].GetRoute().GetRequestMirrorPolicies()[0].GetRuntimeFraction() != nil {
		t.Error("a mirror of every request has a runtime fraction")
	}
	session := func(r *routev3.Route) proto.Message {
		t.Helper()
		per := &statefulsessionv3.StatefulSessionPerRoute{}
		if err := r.GetTypedPerFilterConfig()[StatefulSessionFilter].UnmarshalTo(per); err != nil {
			t.Fatalf("the entry's stateful session: %v", err)
		}
		m, err := per.GetStatefulSession().GetSessionState().GetTypedConfig().UnmarshalNew()
		if err != nil {
			t.Fatalf("its session state: %v", err)
		}
		return m
	}
	if c, ok := session(routes[0]).(*cookiesessionv3.CookieBasedSessionState); !ok || c.GetCookie().GetName() != "sticky" || c.GetCookie().GetPath() != "/cart" || c.GetCookie().GetTtl().AsDuration() != time.Hour {
		t.Errorf("cookie session %v, want sticky on /cart for 1h", c)
	}
	if h, ok := session(routes[1]).(*headersessionv3.HeaderBasedSessionState); !ok || h.GetName() != "x-session" {
		t.Errorf("header session %v, want x-session", h)
	}
	// A path that would end the cookie's Path attribute and begin another.
	r.Rules[0].Matches[0].Path = "/cart;Domain=.example.org"
	routes = routesOf(t, RoutedService(parent, Profile{Mode: model.ListenerEnvoy}, rt), model.ListenerEnvoy)
	if c := session(routes[0]).(*cookiesessionv3.CookieBasedSessionState); c.GetCookie().GetPath() != "/" {
		t.Errorf("cookie path %q, want / for a path with a ;", c.GetCookie().GetPath())
	}
	r.Rules[0].Matches[0].Path = "/cart/"

	for _, e := range routesOf(t, RoutedService(parent, Profile{Mode: model.ListenerProxylessGRPC}, rt), model.ListenerProxylessGRPC) {
		if len(e.GetRoute().GetRequestMirrorPolicies()) != 0 || len(e.GetTypedPerFilterConfig()) != 0 {
			t.Errorf("proxyless entry %v carries a mirror or a session", e)
		}
	}
	if got := ProxylessOmissions(r); len(got) != 2 || !strings.Contains(got[0], "request mirrors, session persistence") || !strings.Contains(got[1], "session persistence") {
		t.Errorf("omissions %q", got)
	}
}

// TestListenerCarriesStatefulSession checks that every Envoy-mode listener
// has the stateful session filter, unconfigured, before the router, so that
// a route's session persistence never changes the listener.
func TestListenerCarriesStatefulSession(t *testing.T) {
	hcm := &hcmv3.HttpConnectionManager{}
	if err := httpListener(8080).GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	fs := hcm.GetHttpFilters()
	if len(fs) != 2 || fs[0].GetName() != StatefulSessionFilter || fs[1].GetName() != wellknown.Router {
		t.Fatalf("HTTP filters %v, want the stateful session filter, then the router", fs)
	}
	s := &statefulsessionv3.StatefulSession{}
	if err := fs[0].GetTypedConfig().UnmarshalTo(s); err != nil || s.GetSessionState() != nil {
		t.Errorf("stateful session %v (%v), want it unconfigured", s, err)
	}
}
