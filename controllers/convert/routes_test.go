package convert

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/model"
)

var serviceParent = testkit.ServiceParent

func backendRef(ns, name string, port int32, weight *int32) gatewayv1.BackendRef {
	b := testkit.BackendRef(ns, name, port)
	b.Weight = weight
	return b
}

func httpRoute(rules ...gatewayv1.HTTPRouteRule) *gatewayv1.HTTPRoute {
	return &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "split", Generation: 3, CreationTimestamp: metav1.Unix(1000, 0)},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{serviceParent("", "reviews", 80)}},
			Rules:           rules,
		},
	}
}

func TestHTTPRoute(t *testing.T) {
	hr := httpRoute(
		gatewayv1.HTTPRouteRule{
			Name: ptr.To(gatewayv1.SectionName("canary")),
			Matches: []gatewayv1.HTTPRouteMatch{
				{
					Path:        &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchExact), Value: ptr.To("/v2")},
					Method:      ptr.To(gatewayv1.HTTPMethodGet),
					Headers:     []gatewayv1.HTTPHeaderMatch{{Name: "X-Canary", Value: "yes"}, {Type: ptr.To(gatewayv1.HeaderMatchRegularExpression), Name: "User-Agent", Value: "^curl/.*"}},
					QueryParams: []gatewayv1.HTTPQueryParamMatch{{Name: "Debug", Value: "1"}},
				},
				{}, // no path: every path
				{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchRegularExpression), Value: ptr.To("/a/[0-9]+")}},
			},
			Filters: []gatewayv1.HTTPRouteFilter{
				{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{
					Set: []gatewayv1.HTTPHeader{{Name: "X-Route", Value: "canary"}}, Add: []gatewayv1.HTTPHeader{{Name: "X-Add", Value: "1"}}, Remove: []string{"X-Drop"},
				}},
				{Type: gatewayv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gatewayv1.HTTPHeaderFilter{Remove: []string{"Server"}}},
			},
			BackendRefs: []gatewayv1.HTTPBackendRef{
				{BackendRef: backendRef("", "reviews-v1", 80, ptr.To[int32](90))},
				{BackendRef: backendRef("other", "reviews-v2", 8080, nil)},
			},
			Timeouts: &gatewayv1.HTTPRouteTimeouts{Request: ptr.To(gatewayv1.Duration("1m30s")), BackendRequest: ptr.To(gatewayv1.Duration("0s"))},
			Retry:    &gatewayv1.HTTPRouteRetry{Codes: []gatewayv1.HTTPRouteRetryStatusCode{503, 504}, Attempts: ptr.To(3), Backoff: ptr.To(gatewayv1.Duration("100ms"))},
		},
		gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
			Group: ptr.To(gatewayv1.Group("multicluster.x-k8s.io")), Kind: ptr.To(gatewayv1.Kind("ServiceImport")), Name: "far", Port: ptr.To[int32](80),
		}}}}},
	)
	hr.Spec.ParentRefs = append(hr.Spec.ParentRefs,
		gatewayv1.ParentReference{Name: "mesh-gateway"}, // a Gateway: not ours
		serviceParent("other", "ratings", 0),
		serviceParent("", "reviews", 80),                                                     // the same parent again
		gatewayv1.ParentReference{Kind: ptr.To(gatewayv1.Kind("Service")), Name: "no-group"}, // group defaults to Gateway API's
	)
	d := func(v time.Duration) *time.Duration { return &v }
	want := &model.Route{
		Key: model.Key{Namespace: "shop", Name: "split"}, Kind: model.HTTPRoute, Generation: 3, Created: time.Unix(1000, 0),
		Parents: []model.RouteParent{{Service: model.Key{Namespace: "shop", Name: "reviews"}, Port: 80}, {Service: model.Key{Namespace: "other", Name: "ratings"}}},
		Rules: []model.RouteRule{
			{
				Name: "canary",
				Matches: []model.RouteMatch{
					{PathType: model.PathExact, Path: "/v2", Method: "GET",
						Headers: []model.ValueMatch{{Name: "x-canary", Value: "yes"}, {Name: "user-agent", Value: "^curl/.*", Regex: true}},
						Query:   []model.ValueMatch{{Name: "Debug", Value: "1"}}},
					{PathType: model.PathPrefix, Path: "/"},
					{PathType: model.PathRegex, Path: "/a/[0-9]+"},
				},
				Backends: []model.RouteBackend{
					{Service: model.Key{Namespace: "shop", Name: "reviews-v1"}, Port: 80, Weight: 90},
					{Service: model.Key{Namespace: "other", Name: "reviews-v2"}, Port: 8080, Weight: 1},
				},
				Timeout: d(90 * time.Second), BackendTimeout: d(0),
				Retry:           &model.RouteRetry{Codes: []int32{503, 504}, Attempts: ptr.To[int32](3), Backoff: d(100 * time.Millisecond)},
				RequestHeaders:  &model.HeaderModifier{Set: []model.Header{{Name: "x-route", Value: "canary"}}, Add: []model.Header{{Name: "x-add", Value: "1"}}, Remove: []string{"x-drop"}},
				ResponseHeaders: &model.HeaderModifier{Remove: []string{"server"}},
			},
			{Backends: []model.RouteBackend{{
				Service: model.Key{Namespace: "shop", Name: "far"}, Port: 80, Weight: 1,
				Invalid: `rule 1: backendRefs[0]: a backend must be a core Service, not a "ServiceImport" of group "multicluster.x-k8s.io"`,
			}}},
		},
	}
	if diff := cmp.Diff(want, HTTPRoute(hr)); diff != "" {
		t.Errorf("HTTPRoute (-want +got):\n%s", diff)
	}
}

func TestRouteWithoutServiceParentHasNoParents(t *testing.T) {
	hr := httpRoute()
	hr.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "gw"}, {Group: ptr.To(gatewayv1.Group("")), Kind: ptr.To(gatewayv1.Kind("ConfigMap")), Name: "x"}}
	if got := HTTPRoute(hr); len(got.Parents) != 0 || got.Refused != "" {
		t.Errorf("parents %v, refused %q: want none", got.Parents, got.Refused)
	}
}

func TestGRPCRoute(t *testing.T) {
	gr := &gatewayv1.GRPCRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "echo", Generation: 1},
		Spec: gatewayv1.GRPCRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{serviceParent("", "echo", 9090)}},
			Rules: []gatewayv1.GRPCRouteRule{{
				Matches: []gatewayv1.GRPCRouteMatch{
					{Method: &gatewayv1.GRPCMethodMatch{Service: ptr.To("echo.Echo"), Method: ptr.To("Say")}, Headers: []gatewayv1.GRPCHeaderMatch{{Name: "X-Tenant", Value: "a"}}},
					{Method: &gatewayv1.GRPCMethodMatch{Type: ptr.To(gatewayv1.GRPCMethodMatchRegularExpression), Service: ptr.To(`echo\..*`)}},
					{},
				},
				Filters:     []gatewayv1.GRPCRouteFilter{{Type: gatewayv1.GRPCRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{Add: []gatewayv1.HTTPHeader{{Name: "X-A", Value: "b"}}}}},
				BackendRefs: []gatewayv1.GRPCBackendRef{{BackendRef: backendRef("", "echo-v2", 9090, ptr.To[int32](0))}},
			}},
		},
	}
	want := &model.Route{
		Key: model.Key{Namespace: "shop", Name: "echo"}, Kind: model.GRPCRoute, Generation: 1,
		Parents: []model.RouteParent{{Service: model.Key{Namespace: "shop", Name: "echo"}, Port: 9090}},
		Rules: []model.RouteRule{{
			Matches: []model.RouteMatch{
				{GRPC: true, GRPCService: "echo.Echo", GRPCMethod: "Say", Headers: []model.ValueMatch{{Name: "x-tenant", Value: "a"}}},
				{GRPC: true, GRPCService: `echo\..*`, GRPCRegex: true},
				{GRPC: true},
			},
			RequestHeaders: &model.HeaderModifier{Add: []model.Header{{Name: "x-a", Value: "b"}}},
			Backends:       []model.RouteBackend{{Service: model.Key{Namespace: "shop", Name: "echo-v2"}, Port: 9090, Weight: 0}},
		}},
	}
	if diff := cmp.Diff(want, GRPCRoute(gr)); diff != "" {
		t.Errorf("GRPCRoute (-want +got):\n%s", diff)
	}
}

// TestRouteMirrorsAndSessions checks the conversion of RequestMirror
// filters (their backends, and the share of requests each copies) and of
// sessionPersistence, on both route kinds.
func TestRouteMirrorsAndSessions(t *testing.T) {
	mirror := func(name string, percent *int32, fraction *gatewayv1.Fraction) *gatewayv1.HTTPRequestMirrorFilter {
		return &gatewayv1.HTTPRequestMirrorFilter{BackendRef: backendRef("audit", name, 80, nil).BackendObjectReference, Percent: percent, Fraction: fraction}
	}
	hr := httpRoute(gatewayv1.HTTPRouteRule{
		Filters: []gatewayv1.HTTPRouteFilter{
			{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{Remove: []string{"x"}}},
			{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: mirror("all", nil, nil)},
			{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: mirror("some", ptr.To[int32](5), nil)},
			{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: mirror("third", nil, &gatewayv1.Fraction{Numerator: 1, Denominator: ptr.To[int32](3)})},
			{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: mirror("half", nil, &gatewayv1.Fraction{Numerator: 50})},
		},
		SessionPersistence: &gatewayv1.SessionPersistence{},
	}, gatewayv1.HTTPRouteRule{
		SessionPersistence: &gatewayv1.SessionPersistence{SessionName: ptr.To("Sticky"), AbsoluteTimeout: ptr.To(gatewayv1.Duration("1h30m")),
			CookieConfig: &gatewayv1.CookieConfig{LifetimeType: ptr.To(gatewayv1.PermanentCookieLifetimeType)}},
	})
	got := HTTPRoute(hr)
	if got.Refused != "" {
		t.Fatalf("refused: %s", got.Refused)
	}
	at := func(name string) model.RouteBackend {
		return model.RouteBackend{Service: model.Key{Namespace: "audit", Name: name}, Port: 80, Weight: 1}
	}
	wantMirrors := []model.RouteMirror{
		{Backend: at("all"), Numerator: 1, Denominator: 1, Filter: 1},
		{Backend: at("some"), Numerator: 5, Denominator: 100, Filter: 2},
		{Backend: at("third"), Numerator: 1, Denominator: 3, Filter: 3},
		{Backend: at("half"), Numerator: 50, Denominator: 100, Filter: 4},
	}
	if diff := cmp.Diff(wantMirrors, got.Rules[0].Mirrors); diff != "" {
		t.Errorf("mirrors (-want +got):\n%s", diff)
	}
	var fields []string
	for f, b := range got.Rules[0].Refs() {
		fields = append(fields, f.String()+"="+b.Service.Name)
	}
	if want := []string{"filters[1].requestMirror.backendRef=all", "filters[2].requestMirror.backendRef=some", "filters[3].requestMirror.backendRef=third", "filters[4].requestMirror.backendRef=half"}; !slices.Equal(fields, want) {
		t.Errorf("Refs = %q, want %q", fields, want)
	}
	if diff := cmp.Diff(&model.SessionPersistence{Name: "scopeplane-session"}, got.Rules[0].Session); diff != "" {
		t.Errorf("default session (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&model.SessionPersistence{Name: "Sticky", TTL: 90 * time.Minute}, got.Rules[1].Session); diff != "" {
		t.Errorf("permanent cookie (-want +got):\n%s", diff)
	}

	gr := &gatewayv1.GRPCRoute{Spec: gatewayv1.GRPCRouteSpec{Rules: []gatewayv1.GRPCRouteRule{{
		Filters:            []gatewayv1.GRPCRouteFilter{{Type: gatewayv1.GRPCRouteFilterRequestMirror, RequestMirror: mirror("all", nil, nil)}},
		BackendRefs:        []gatewayv1.GRPCBackendRef{{BackendRef: backendRef("", "b", 80, nil)}},
		SessionPersistence: &gatewayv1.SessionPersistence{Type: ptr.To(gatewayv1.HeaderBasedSessionPersistence), SessionName: ptr.To("X-Session")},
	}}}}
	g := GRPCRoute(gr)
	if g.Refused != "" {
		t.Fatalf("GRPCRoute refused: %s", g.Refused)
	}
	if diff := cmp.Diff([]model.RouteMirror{{Backend: at("all"), Numerator: 1, Denominator: 1}}, g.Rules[0].Mirrors); diff != "" {
		t.Errorf("GRPCRoute mirrors (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&model.SessionPersistence{Header: true, Name: "x-session"}, g.Rules[0].Session); diff != "" {
		t.Errorf("header session (-want +got):\n%s", diff)
	}
}

// TestRouteRefusals checks that what no client can serve refuses the
// route with a sentence that names the rule, the field and the fix.
func TestRouteRefusals(t *testing.T) {
	named := ptr.To(gatewayv1.SectionName("main"))
	for _, tc := range []struct {
		name string
		rule gatewayv1.HTTPRouteRule
		want []string
	}{
		{"path regex", gatewayv1.HTTPRouteRule{Name: named, Matches: []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchRegularExpression), Value: ptr.To("/(a")}}}},
			[]string{`rule 0 ("main"): matches[0].path.value: the regular expression "/(a" does not compile in RE2 syntax`, "write it in RE2 syntax"}},
		{"lookahead in a header", gatewayv1.HTTPRouteRule{Matches: []gatewayv1.HTTPRouteMatch{{Headers: []gatewayv1.HTTPHeaderMatch{{Type: ptr.To(gatewayv1.HeaderMatchRegularExpression), Name: "a", Value: "(?=x)"}}}}},
			[]string{"rule 0: matches[0].headers[0].value: the regular expression"}},
		{"query regex", gatewayv1.HTTPRouteRule{Matches: []gatewayv1.HTTPRouteMatch{{QueryParams: []gatewayv1.HTTPQueryParamMatch{{Type: ptr.To(gatewayv1.QueryParamMatchRegularExpression), Name: "a", Value: `\1`}}}}},
			[]string{"rule 0: matches[0].queryParams[0].value"}},
		{"rewrite, mirror, CORS, external auth, extension", gatewayv1.HTTPRouteRule{Filters: []gatewayv1.HTTPRouteFilter{
			{Type: gatewayv1.HTTPRouteFilterURLRewrite}, {Type: gatewayv1.HTTPRouteFilterRequestMirror}, {Type: gatewayv1.HTTPRouteFilterCORS},
			{Type: gatewayv1.HTTPRouteFilterExternalAuth}, {Type: gatewayv1.HTTPRouteFilterExtensionRef}}},
			[]string{`filters[1].requestMirror: the filter has no requestMirror; give its backendRef`, `"CORS"`, `"ExternalAuth"`, `filters[4]: the filter type "ExtensionRef"`}},
		{"mirror shares", gatewayv1.HTTPRouteRule{Filters: []gatewayv1.HTTPRouteFilter{
			{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{BackendRef: backendRef("", "a", 80, nil).BackendObjectReference, Percent: ptr.To[int32](5), Fraction: &gatewayv1.Fraction{Numerator: 1}}},
			{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{BackendRef: backendRef("", "a", 80, nil).BackendObjectReference, Fraction: &gatewayv1.Fraction{Numerator: 3, Denominator: ptr.To[int32](2)}}}}},
			[]string{"rule 0: filters[0].requestMirror: both percent and fraction are given; give one", "rule 0: filters[1].requestMirror: 3/2 is not a share of requests"}},
		{"mirror of a Gateway", gatewayv1.HTTPRouteRule{Filters: []gatewayv1.HTTPRouteFilter{
			{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{BackendRef: gatewayv1.BackendObjectReference{Kind: ptr.To(gatewayv1.Kind("Gateway")), Name: "g"}}}}},
			nil},
		{"backend filters", gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: backendRef("", "a", 80, nil)}, {BackendRef: backendRef("", "b", 80, nil), Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier}, {Type: gatewayv1.HTTPRouteFilterRequestMirror}}}}},
			[]string{`rule 0: backendRefs[1].filters[1]: the filter type "RequestMirror" is not supported here`, "on a rule also RequestRedirect, URLRewrite and RequestMirror"}},
		{"session name", gatewayv1.HTTPRouteRule{SessionPersistence: &gatewayv1.SessionPersistence{SessionName: ptr.To("a b;")}},
			[]string{`rule 0: sessionPersistence.sessionName: "a b;" cannot name a cookie or a header`}},
		{"header session with a timeout", gatewayv1.HTTPRouteRule{SessionPersistence: &gatewayv1.SessionPersistence{Type: ptr.To(gatewayv1.HeaderBasedSessionPersistence), AbsoluteTimeout: ptr.To(gatewayv1.Duration("1h"))}},
			[]string{"rule 0: sessionPersistence.absoluteTimeout: a header-based session has no lifetime to bound"}},
		{"session cookie with a timeout", gatewayv1.HTTPRouteRule{SessionPersistence: &gatewayv1.SessionPersistence{AbsoluteTimeout: ptr.To(gatewayv1.Duration("1h"))}},
			[]string{"rule 0: sessionPersistence.absoluteTimeout: a Session cookie is kept until the client's session ends", "set cookieConfig.lifetimeType to Permanent"}},
		{"permanent cookie without a lifetime", gatewayv1.HTTPRouteRule{SessionPersistence: &gatewayv1.SessionPersistence{CookieConfig: &gatewayv1.CookieConfig{LifetimeType: ptr.To(gatewayv1.PermanentCookieLifetimeType)}, AbsoluteTimeout: ptr.To(gatewayv1.Duration("0s"))}},
			[]string{"rule 0: sessionPersistence.absoluteTimeout: a Permanent cookie needs its lifetime"}},
		{"weights past 2^32-1", gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{
			{BackendRef: backendRef("", "a", 80, ptr.To[int32](2147483647))}, {BackendRef: backendRef("", "b", 80, ptr.To[int32](2147483647))}, {BackendRef: backendRef("", "c", 80, ptr.To[int32](2))}}},
			[]string{"rule 0: backendRefs: the weights sum to 4294967296, past 4294967295; scale them down"}},
		{"bad duration", gatewayv1.HTTPRouteRule{Timeouts: &gatewayv1.HTTPRouteTimeouts{Request: ptr.To(gatewayv1.Duration("1.5s"))}},
			[]string{`rule 0: timeouts.request: "1.5s" is not a Gateway API duration`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A good rule first, so that the index named is the bad one's.
			hr := httpRoute(tc.rule)
			got := HTTPRoute(hr).Refused
			if len(tc.want) == 0 && got != "" {
				t.Errorf("Refused = %q, want it served", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("Refused = %q, want it to contain %q", got, w)
				}
			}
		})
	}
	// Weights that sum to exactly 2^32-1 are served.
	ok := httpRoute(gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{
		{BackendRef: backendRef("", "a", 80, ptr.To[int32](2147483647))}, {BackendRef: backendRef("", "b", 80, ptr.To[int32](2147483647))}, {BackendRef: backendRef("", "c", 80, ptr.To[int32](1))}}})
	if r := HTTPRoute(ok).Refused; r != "" {
		t.Errorf("weights summing to 2^32-1: refused %q", r)
	}
}

func TestGRPCRouteRefusals(t *testing.T) {
	gr := &gatewayv1.GRPCRoute{Spec: gatewayv1.GRPCRouteSpec{Rules: []gatewayv1.GRPCRouteRule{
		{},
		{
			Matches: []gatewayv1.GRPCRouteMatch{{Method: &gatewayv1.GRPCMethodMatch{Type: ptr.To(gatewayv1.GRPCMethodMatchRegularExpression), Method: ptr.To("Say(")}}},
			Filters: []gatewayv1.GRPCRouteFilter{{Type: gatewayv1.GRPCRouteFilterRequestMirror}},
		},
	}}}
	got := GRPCRoute(gr).Refused
	for _, w := range []string{`rule 1: matches[0].method.method: the regular expression "Say("`, `rule 1: filters[0].requestMirror: the filter has no requestMirror`} {
		if !strings.Contains(got, w) {
			t.Errorf("Refused = %q, want it to contain %q", got, w)
		}
	}
}

func TestRouteGrants(t *testing.T) {
	from := func(group, kind, ns string) gatewayv1beta1.ReferenceGrantFrom {
		return gatewayv1beta1.ReferenceGrantFrom{Group: gatewayv1beta1.Group(group), Kind: gatewayv1beta1.Kind(kind), Namespace: gatewayv1beta1.Namespace(ns)}
	}
	svc := func(name string) gatewayv1beta1.ReferenceGrantTo {
		r := gatewayv1beta1.ReferenceGrantTo{Kind: "Service"}
		if name != "" {
			r.Name = ptr.To(gatewayv1beta1.ObjectName(name))
		}
		return r
	}
	gw := "gateway.networking.k8s.io"
	grant := func(f []gatewayv1beta1.ReferenceGrantFrom, to ...gatewayv1beta1.ReferenceGrantTo) gatewayv1beta1.ReferenceGrant {
		return gatewayv1beta1.ReferenceGrant{Spec: gatewayv1beta1.ReferenceGrantSpec{From: f, To: to}}
	}
	got := RouteGrants([]gatewayv1beta1.ReferenceGrant{
		grant([]gatewayv1beta1.ReferenceGrantFrom{from(gw, "HTTPRoute", "a"), from(gw, "GRPCRoute", "b")}, svc("api")),
		grant([]gatewayv1beta1.ReferenceGrantFrom{from(gw, "HTTPRoute", "a")}, svc("")),
		grant([]gatewayv1beta1.ReferenceGrantFrom{from("xds.scopeplane.dev", "ProxyScope", "c"), from(gw, "TLSRoute", "d"), from("", "HTTPRoute", "e")}, svc("")),
	})
	want := map[model.RouteKind]model.Grants{model.HTTPRoute: {"a": nil}, model.GRPCRoute: {"b": {"api": {}}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("RouteGrants = %v, want %v", got, want)
	}
	if got := RouteGrants(nil); len(got) != 0 {
		t.Errorf("RouteGrants(nil) = %v, want empty", got)
	}
}

// TestRedirectAndRewriteConverted checks the RequestRedirect and URLRewrite
// filters' conversion, each path modifier type included.
func TestRedirectAndRewriteConverted(t *testing.T) {
	hr := httpRoute(
		gatewayv1.HTTPRouteRule{Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{
			Scheme: ptr.To("https"), Hostname: ptr.To(gatewayv1.PreciseHostname("example.org")), Port: ptr.To(gatewayv1.PortNumber(8443)), StatusCode: ptr.To(301),
			Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/new")},
		}}}},
		gatewayv1.HTTPRouteRule{Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{
			Hostname: ptr.To(gatewayv1.PreciseHostname("internal")),
			Path:     &gatewayv1.HTTPPathModifier{Type: gatewayv1.FullPathHTTPPathModifier, ReplaceFullPath: ptr.To("/v1")},
		}}}},
	)
	r := HTTPRoute(hr)
	if r.Refused != "" {
		t.Fatalf("refused: %s", r.Refused)
	}
	want := &model.Redirect{Scheme: "https", Hostname: "example.org", Port: 8443, StatusCode: 301, Path: &model.PathModifier{Value: "/new"}}
	if !reflect.DeepEqual(r.Rules[0].Redirect, want) {
		t.Errorf("redirect %+v, want %+v", r.Rules[0].Redirect, want)
	}
	if got := r.Rules[1].Rewrite; got == nil || got.Hostname != "internal" || got.Path == nil || !got.Path.Full || got.Path.Value != "/v1" {
		t.Errorf("rewrite %+v", got)
	}
}
