package translate

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	statefulsessionv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/stateful_session/v3"
	cookiesessionv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/stateful_session/cookie/v3"
	headersessionv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/stateful_session/header/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/type/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// Routing is what the translation of a Service needs of the mesh routes
// attached to it, as the catalog resolved them for the scopes it is
// translated for: the routes that apply (a consumer namespace's, or the
// producer's; see docs/routes.md), and the backends they may reach.
type Routing struct {
	// Routes are the routes that apply, each attached to the Service.
	// Refused routes are ignored.
	Routes []*model.Route
	// Backends are the Services the routes' backendRefs name that exist and
	// that the routes may reach (their own namespace's, or granted), by key.
	// A backendRef to any other Service is left out of its rule.
	Backends map[model.Key]*model.Service
}

// Entry is one route entry of a Service port: one match of one rule of a
// route, where it stands in Gateway API's precedence, and what the scope's
// clients are sent for it (Route; nil when they cannot be sent it, see
// routeEntry). kubectl scopeplane explain prints them.
type Entry struct {
	Source *model.Route
	// Rule and Match index the rule in the route and the match in the rule
	// (Match is -1 for a rule without matches, which matches everything).
	Rule, Match int
	Route       *routev3.Route
}

// Entries returns the route entries of a Service port, in the order a
// client tries them, and whether any route applies to the port at all
// (when none does, the port keeps its one route to its own endpoints).
//
// A GRPCRoute and an HTTPRoute on one port do not merge: the GRPCRoutes
// win (Gateway API's GEP-1294), and the HTTPRoutes' status says Conflicted.
func Entries(svc *model.Service, port int32, rt *Routing, mode model.ListenerMode) ([]Entry, bool) {
	if rt == nil {
		return nil, false
	}
	var attached []*model.Route
	grpc := false
	for _, r := range rt.Routes {
		if r.Refused == "" && r.Attaches(svc.Key, port) {
			attached = append(attached, r)
			grpc = grpc || r.Kind == model.GRPCRoute
		}
	}
	if len(attached) == 0 {
		return nil, false
	}
	if grpc {
		attached = slices.DeleteFunc(attached, func(r *model.Route) bool { return r.Kind != model.GRPCRoute })
	}
	slices.SortStableFunc(attached, (*model.Route).Compare)
	type matched struct {
		Entry
		match model.RouteMatch
	}
	var entries []matched
	for _, r := range attached {
		for i := range r.Rules {
			if len(r.Rules[i].Matches) == 0 {
				all := model.RouteMatch{PathType: model.PathPrefix, Path: "/", GRPC: r.Kind == model.GRPCRoute}
				entries = append(entries, matched{Entry{Source: r, Rule: i, Match: -1}, all})
				continue
			}
			for j, m := range r.Rules[i].Matches {
				entries = append(entries, matched{Entry{Source: r, Rule: i, Match: j}, m})
			}
		}
	}
	slices.SortStableFunc(entries, func(a, b matched) int { return precedence(a.match, b.match) })
	out := make([]Entry, len(entries))
	for i := range entries {
		e := &entries[i]
		e.Route = routeEntry(&e.match, &e.Source.Rules[e.Rule], rt.Backends, mode)
		out[i] = e.Entry
	}
	return out, true
}

// portRoutes returns what a Service port's clients are sent of its route
// entries (see Entries), and whether any route applies to the port.
func portRoutes(svc *model.Service, port int32, rt *Routing, mode model.ListenerMode) ([]*routev3.Route, bool) {
	entries, routed := Entries(svc, port, rt, mode)
	if !routed {
		return nil, false
	}
	out := make([]*routev3.Route, 0, len(entries))
	for _, e := range entries {
		if e.Route != nil {
			out = append(out, e.Route)
		}
	}
	if len(out) == 0 && mode == model.ListenerProxylessGRPC {
		// Every rule was left out: no request may match, yet gRPC C-core
		// refuses a virtual host without routes.
		out = append(out, noCallTo(clusterName(svc, port, mode)))
	}
	return out, true
}

// NoCallPath is a path no gRPC call has (a call's is
// "/<service>/<method>"): an exact match of it never matches.
const NoCallPath = "/"

// noCallTo is a route entry that no gRPC call matches, naming a cluster.
func noCallTo(cluster string) *routev3.Route {
	return &routev3.Route{
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: NoCallPath}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}},
	}
}

// precedence orders two matches as Gateway API orders route entries: for
// HTTPRoute an exact path first, then a regular expression, then the
// longest prefix; a method before none; more header matches, then more
// query matches. For GRPCRoute the longest service, then the longest
// method, then more header matches. Ties keep their order: the older
// route, then namespace/name, then the rule's and the match's position.
func precedence(a, b model.RouteMatch) int {
	if a.GRPC || b.GRPC {
		return cmp.Or(
			-cmp.Compare(len(a.GRPCService), len(b.GRPCService)),
			-cmp.Compare(len(a.GRPCMethod), len(b.GRPCMethod)),
			-cmp.Compare(len(a.Headers), len(b.Headers)),
		)
	}
	rank := func(m model.RouteMatch) int {
		switch m.PathType {
		case model.PathExact:
			return 0
		case model.PathRegex:
			return 1
		}
		return 2
	}
	prefixLen := func(m model.RouteMatch) int {
		if m.PathType != model.PathPrefix {
			return 0
		}
		return len(prefixPath(m.Path))
	}
	return cmp.Or(
		cmp.Compare(rank(a), rank(b)),
		-cmp.Compare(prefixLen(a), prefixLen(b)),
		-cmp.Compare(boolInt(a.Method != ""), boolInt(b.Method != "")),
		-cmp.Compare(len(a.Headers), len(b.Headers)),
		-cmp.Compare(len(a.Query), len(b.Query)),
	)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// prefixPath is a PathPrefix without its trailing slash, which Gateway API
// ignores ("/a/" matches what "/a" matches); "/" stays.
func prefixPath(p string) string {
	if len(p) > 1 {
		return strings.TrimRight(p, "/")
	}
	return p
}

// routeEntry translates one entry, or returns nil when the scope's clients
// cannot be sent it: a proxyless gRPC client cannot match query parameters
// nor an HTTP method other than POST, and is sent no rule without a backend
// to go to (Envoy answers such requests 500, as Gateway API asks); and no
// client is sent an entry Envoy's validation rejects (validEntry).
func routeEntry(m *model.RouteMatch, rule *model.RouteRule, backends map[model.Key]*model.Service, mode model.ListenerMode) *routev3.Route {
	if r := buildEntry(m, rule, backends, mode); r != nil {
		return validEntry(r)
	}
	return nil
}

// buildEntry is routeEntry before validation.
func buildEntry(m *model.RouteMatch, rule *model.RouteRule, backends map[model.Key]*model.Service, mode model.ListenerMode) *routev3.Route {
	proxyless := mode == model.ListenerProxylessGRPC
	if proxyless && (len(m.Query) > 0 || (m.Method != "" && m.Method != "POST") || rule.Redirect != nil) {
		return nil
	}
	out := &routev3.Route{Match: routeMatch(m, proxyless)}
	if rule.Redirect != nil {
		out.Action = &routev3.Route_Redirect{Redirect: redirectAction(rule.Redirect, m)}
		headerModifiers(out, rule)
		return out
	}
	clusters := ruleClusters(rule, backends, mode)
	if len(clusters) == 0 {
		if proxyless {
			return nil
		}
		out.Action = &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 500}}
		return out
	}
	action := &routev3.RouteAction{}
	if len(clusters) == 1 {
		// One backend is a plain cluster; its backendRef's header
		// modifiers apply to the route's every request.
		c := clusters[0]
		action.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: c.GetName()}
		out.RequestHeadersToAdd, out.RequestHeadersToRemove = c.GetRequestHeadersToAdd(), c.GetRequestHeadersToRemove()
		out.ResponseHeadersToAdd, out.ResponseHeadersToRemove = c.GetResponseHeadersToAdd(), c.GetResponseHeadersToRemove()
	} else {
		wc := &routev3.WeightedCluster{Clusters: clusters}
		if proxyless {
			// gRPC C-core 1.51 refuses weights that do not add up to
			// total_weight (100 when unset); Envoy deprecates the field.
			var sum uint32
			for _, c := range clusters {
				sum += c.GetWeight().GetValue()
			}
			wc.TotalWeight = wrapperspb.UInt32(sum) //nolint:staticcheck // deprecated in Envoy, yet the only form gRPC C-core 1.51 reads
		}
		action.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: wc}
	}
	timeouts(action, rule, proxyless)
	action.RetryPolicy = retryPolicy(rule, proxyless)
	out.Action = &routev3.Route_Route{Route: action}
	if !proxyless {
		rewriteAction(action, rule.Rewrite, m)
		headerModifiers(out, rule)
		action.RequestMirrorPolicies = mirrorPolicies(rule, backends)
		if s := rule.Session; s != nil {
			out.TypedPerFilterConfig = map[string]*anypb.Any{StatefulSessionFilter: mustAny(sessionPerRoute(s, m))}
		}
	}
	return out
}

// mirrorPolicies translates a rule's RequestMirror filters for Envoy: each
// backend that can be served gets its share of copies, by
// runtime_fraction's default value (no runtime key is consulted).
func mirrorPolicies(rule *model.RouteRule, backends map[model.Key]*model.Service) []*routev3.RouteAction_RequestMirrorPolicy {
	var out []*routev3.RouteAction_RequestMirrorPolicy
	for i := range rule.Mirrors {
		mr := &rule.Mirrors[i]
		b := &mr.Backend
		svc := backends[b.Service]
		if b.Invalid != "" || svc == nil || !hasTCPPort(svc, b.Port) || mr.Numerator <= 0 {
			continue
		}
		p := &routev3.RouteAction_RequestMirrorPolicy{Cluster: clusterName(svc, b.Port, model.ListenerEnvoy)}
		if mr.Numerator < mr.Denominator {
			p.RuntimeFraction = &corev3.RuntimeFractionalPercent{DefaultValue: fractionalPercent(mr.Numerator, mr.Denominator)}
		}
		out = append(out, p)
	}
	return out
}

// fractionalPercent is n/d in the coarsest of Envoy's denominators that
// holds it exactly, or in millionths, rounded, when none does.
func fractionalPercent(n, d int32) *typev3.FractionalPercent {
	for _, den := range []struct {
		v int64
		d typev3.FractionalPercent_DenominatorType
	}{{100, typev3.FractionalPercent_HUNDRED}, {10_000, typev3.FractionalPercent_TEN_THOUSAND}} {
		if den.v%int64(d) == 0 {
			return &typev3.FractionalPercent{Numerator: uint32(int64(n) * (den.v / int64(d))), Denominator: den.d}
		}
	}
	return &typev3.FractionalPercent{Numerator: uint32((int64(n)*1_000_000 + int64(d)/2) / int64(d)), Denominator: typev3.FractionalPercent_MILLION}
}

// StatefulSessionFilter is Envoy's stateful session filter. Every
// Envoy-mode listener carries it unconfigured, which does nothing; a route
// entry of a rule with sessionPersistence configures it for its requests.
// So a route never changes a listener, which would drain its connections.
const StatefulSessionFilter = "envoy.filters.http.stateful_session"

// sessionPerRoute is an entry's stateful session: a cookie whose path is
// what the entry's match covers (Gateway API asks the cookie to be scoped
// to the route's path), or a header. A path with a ";", which Gateway API's
// path pattern allows and a cookie's Path attribute cannot hold (it would
// end the attribute and begin another, a Domain for one), scopes the
// cookie to "/" instead.
func sessionPerRoute(s *model.SessionPersistence, m *model.RouteMatch) *statefulsessionv3.StatefulSessionPerRoute {
	var state *corev3.TypedExtensionConfig
	if s.Header {
		state = &corev3.TypedExtensionConfig{Name: "envoy.http.stateful_session.header", TypedConfig: mustAny(&headersessionv3.HeaderBasedSessionState{Name: s.Name})}
	} else {
		path := "/"
		if !m.GRPC && m.PathType != model.PathRegex && !strings.Contains(m.Path, ";") {
			path = prefixPath(m.Path)
		}
		cookie := &httpv3.Cookie{Name: s.Name, Path: path}
		if s.TTL > 0 {
			cookie.Ttl = durationpb.New(s.TTL)
		}
		state = &corev3.TypedExtensionConfig{Name: "envoy.http.stateful_session.cookie", TypedConfig: mustAny(&cookiesessionv3.CookieBasedSessionState{Cookie: cookie})}
	}
	return &statefulsessionv3.StatefulSessionPerRoute{Override: &statefulsessionv3.StatefulSessionPerRoute_StatefulSession{
		StatefulSession: &statefulsessionv3.StatefulSession{SessionState: state},
	}}
}

// headerModifiers adds a rule's header modifiers to an Envoy route entry,
// before those a single backend's own filters put there.
func headerModifiers(out *routev3.Route, rule *model.RouteRule) {
	if h := rule.RequestHeaders; h != nil {
		out.RequestHeadersToAdd = append(headerOptions(h), out.RequestHeadersToAdd...)
		out.RequestHeadersToRemove = append(slices.Clone(h.Remove), out.RequestHeadersToRemove...)
	}
	if h := rule.ResponseHeaders; h != nil {
		out.ResponseHeadersToAdd = append(headerOptions(h), out.ResponseHeadersToAdd...)
		out.ResponseHeadersToRemove = append(slices.Clone(h.Remove), out.ResponseHeadersToRemove...)
	}
}

// redirectCodes are the redirect statuses Gateway API allows and Envoy's
// names for them; 302 is the default.
var redirectCodes = map[int32]routev3.RedirectAction_RedirectResponseCode{
	301: routev3.RedirectAction_MOVED_PERMANENTLY,
	302: routev3.RedirectAction_FOUND,
	303: routev3.RedirectAction_SEE_OTHER,
	307: routev3.RedirectAction_TEMPORARY_REDIRECT,
	308: routev3.RedirectAction_PERMANENT_REDIRECT,
}

// redirectAction translates a RequestRedirect filter for the entry of
// match m. Envoy drops a well-known port (80 for http, 443 for https) from
// the Location when the scheme changes and no port is given, which is
// Gateway API's rule too.
func redirectAction(r *model.Redirect, m *model.RouteMatch) *routev3.RedirectAction {
	out := &routev3.RedirectAction{ResponseCode: routev3.RedirectAction_FOUND, HostRedirect: r.Hostname, PortRedirect: uint32(max(r.Port, 0))}
	if code, ok := redirectCodes[r.StatusCode]; ok {
		out.ResponseCode = code
	}
	if r.Scheme != "" {
		out.SchemeRewriteSpecifier = &routev3.RedirectAction_SchemeRedirect{SchemeRedirect: r.Scheme}
	}
	switch p := r.Path; {
	case p == nil:
	case p.Full:
		out.PathRewriteSpecifier = &routev3.RedirectAction_PathRedirect{PathRedirect: p.Value}
	default:
		if re := prefixReplacement(m, p.Value); re != nil {
			out.PathRewriteSpecifier = &routev3.RedirectAction_RegexRewrite{RegexRewrite: re}
		}
	}
	return out
}

// rewriteAction sets a URLRewrite filter's host and path rewrite on an
// Envoy route action.
func rewriteAction(a *routev3.RouteAction, r *model.Rewrite, m *model.RouteMatch) {
	if r == nil {
		return
	}
	if r.Hostname != "" {
		a.HostRewriteSpecifier = &routev3.RouteAction_HostRewriteLiteral{HostRewriteLiteral: r.Hostname}
	}
	switch p := r.Path; {
	case p == nil:
	case p.Full:
		a.RegexRewrite = &matcherv3.RegexMatchAndSubstitute{Pattern: regex("^/.*$"), Substitution: p.Value}
	default:
		a.RegexRewrite = prefixReplacement(m, p.Value)
	}
}

// prefixReplacement replaces the prefix a PathPrefix match matched with
// value, as Gateway API's ReplacePrefixMatch does, segment by segment:
// with /foo matched, /xyz makes /foo/bar /xyz/bar and / makes it /bar,
// never a double slash, and "" as "/". It is nil for any other match, which Gateway API's
// schema does not let a ReplacePrefixMatch have.
func prefixReplacement(m *model.RouteMatch, value string) *matcherv3.RegexMatchAndSubstitute {
	if m.GRPC || m.PathType != model.PathPrefix {
		return nil
	}
	prefix, value := prefixPath(m.Path), prefixPath(value)
	if prefix == "/" {
		prefix = ""
	}
	if value == "/" || value == "" {
		return &matcherv3.RegexMatchAndSubstitute{Pattern: regex("^" + regexp.QuoteMeta(prefix) + "/?(.*)$"), Substitution: `/\1`}
	}
	return &matcherv3.RegexMatchAndSubstitute{Pattern: regex("^" + regexp.QuoteMeta(prefix) + "(/.*)?$"), Substitution: value + `\1`}
}

// validEntry returns r, or nil when Envoy's validation rejects it (a
// header value with a line break, which Gateway API's schema lets through):
// every client rejects a whole route configuration for one bad entry, and
// an Envoy scope's configuration holds every Service's virtual hosts, so
// one route must not hold back the others. InvalidEntries reports it.
func validEntry(r *routev3.Route) *routev3.Route {
	if r.ValidateAll() != nil {
		return nil
	}
	return r
}

// routeMatch translates a match. Proxyless gRPC clients get the encodings
// all three of grpc-go, grpc-js-xds and gRPC C-core accept (see
// docs/proposals/mesh-routes-clients.md): a segment-aware prefix as a
// regular expression, since they refuse path_separated_prefix, and header
// matches in the deprecated exact_match and safe_regex_match, since C-core
// 1.51 refuses string_match.
func routeMatch(m *model.RouteMatch, proxyless bool) *routev3.RouteMatch {
	out := &routev3.RouteMatch{}
	switch {
	case m.GRPC:
		grpcPath(out, m)
	case m.PathType == model.PathExact:
		out.PathSpecifier = &routev3.RouteMatch_Path{Path: m.Path}
	case m.PathType == model.PathRegex:
		out.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: regex(m.Path)}
	case prefixPath(m.Path) == "/":
		out.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: "/"}
	case proxyless:
		out.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: regex(regexp.QuoteMeta(prefixPath(m.Path)) + "(/.*)?")}
	default:
		out.PathSpecifier = &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: prefixPath(m.Path)}
	}
	if m.Method != "" && !proxyless { // every gRPC call is a POST
		out.Headers = append(out.Headers, &routev3.HeaderMatcher{Name: ":method", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
			StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: m.Method}},
		}})
	}
	for _, h := range m.Headers {
		hm := &routev3.HeaderMatcher{Name: h.Name}
		switch {
		case proxyless && h.Regex:
			hm.HeaderMatchSpecifier = &routev3.HeaderMatcher_SafeRegexMatch{SafeRegexMatch: regex(h.Value)} //nolint:staticcheck // deprecated in Envoy, yet the only form gRPC C-core 1.51 reads
		case proxyless:
			hm.HeaderMatchSpecifier = &routev3.HeaderMatcher_ExactMatch{ExactMatch: h.Value} //nolint:staticcheck // deprecated in Envoy, yet the only form gRPC C-core 1.51 reads
		default:
			hm.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: stringMatch(h)}
		}
		out.Headers = append(out.Headers, hm)
	}
	for _, q := range m.Query {
		out.QueryParameters = append(out.QueryParameters, &routev3.QueryParameterMatcher{
			Name:                         q.Name,
			QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_StringMatch{StringMatch: stringMatch(q)},
		})
	}
	return out
}

// grpcPath matches a GRPCRoute method match on the request path,
// "/<service>/<method>": exactly when both are given, by the service's
// prefix when only it is, by a regular expression otherwise.
func grpcPath(out *routev3.RouteMatch, m *model.RouteMatch) {
	svc, method := m.GRPCService, m.GRPCMethod
	switch {
	case m.GRPCRegex:
		out.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: regex("/(" + cmp.Or(svc, "[^/]+") + ")/(" + cmp.Or(method, "[^/]+") + ")")}
	case svc != "" && method != "":
		out.PathSpecifier = &routev3.RouteMatch_Path{Path: "/" + svc + "/" + method}
	case svc != "":
		out.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: "/" + svc + "/"}
	case method != "":
		out.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: regex("/[^/]+/" + regexp.QuoteMeta(method))}
	default:
		out.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: "/"}
	}
}

func regex(re string) *matcherv3.RegexMatcher { return &matcherv3.RegexMatcher{Regex: re} }

func stringMatch(v model.ValueMatch) *matcherv3.StringMatcher {
	if v.Regex {
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: regex(v.Value)}}
	}
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: v.Value}}
}

// ruleClusters returns the weighted clusters of a rule's backends that can
// be served: a Service the routes may reach, a port it has, a weight above
// zero (gRPC clients refuse a weight-0 entry or, grpc-js-xds, still watch
// its cluster).
func ruleClusters(rule *model.RouteRule, backends map[model.Key]*model.Service, mode model.ListenerMode) []*routev3.WeightedCluster_ClusterWeight {
	var out []*routev3.WeightedCluster_ClusterWeight
	for _, b := range rule.Backends {
		svc := backends[b.Service]
		if b.Invalid != "" || b.Weight <= 0 || svc == nil || !hasTCPPort(svc, b.Port) {
			continue
		}
		name := clusterName(svc, b.Port, mode)
		if i := slices.IndexFunc(out, func(c *routev3.WeightedCluster_ClusterWeight) bool { return c.GetName() == name }); i >= 0 {
			// Two references to one Service port are one cluster of their
			// weights' sum: Envoy refuses a cluster named twice.
			out[i].Weight = wrapperspb.UInt32(out[i].GetWeight().GetValue() + uint32(b.Weight))
			continue
		}
		cw := &routev3.WeightedCluster_ClusterWeight{Name: name, Weight: wrapperspb.UInt32(uint32(b.Weight))}
		if mode == model.ListenerEnvoy {
			if h := b.RequestHeaders; h != nil {
				cw.RequestHeadersToAdd, cw.RequestHeadersToRemove = headerOptions(h), slices.Clone(h.Remove)
			}
			if h := b.ResponseHeaders; h != nil {
				cw.ResponseHeadersToAdd, cw.ResponseHeadersToRemove = headerOptions(h), slices.Clone(h.Remove)
			}
		}
		out = append(out, cw)
	}
	return out
}

// hasTCPPort reports whether the Service has a translated port numbered port.
func hasTCPPort(svc *model.Service, port int32) bool {
	for _, p := range svc.Ports {
		if p.Port == port && isTCP(p.Protocol) {
			return true
		}
	}
	return false
}

// timeouts sets a rule's timeout: Envoy's route timeout, or for gRPC
// clients, which ignore it, max_stream_duration (gRFC A31). Without a
// request timeout, a backend request timeout bounds the request; with
// retries it bounds each try, which only Envoy can do (per_try_timeout).
func timeouts(a *routev3.RouteAction, rule *model.RouteRule, proxyless bool) {
	d := rule.Timeout
	if d == nil {
		d = rule.BackendTimeout
	}
	if d == nil {
		return
	}
	if proxyless {
		a.MaxStreamDuration = &routev3.RouteAction_MaxStreamDuration{MaxStreamDuration: durationpb.New(*d)}
		return
	}
	a.Timeout = durationpb.New(*d)
}

// grpcRetriable maps the HTTP status codes a retry policy names to the gRPC
// status a gRPC client sees for them (gRPC's own HTTP to gRPC status
// mapping): 429, 502, 503 and 504 all become UNAVAILABLE.
func grpcRetriable(code int32) bool {
	switch code {
	case 429, 502, 503, 504:
		return true
	}
	return false
}

// defaultBackoff is the base interval between tries when a retry policy
// names none: gRPC's own default (gRFC A44), which proxyless clients need
// spelled out (retry_back_off without base_interval is refused).
const defaultBackoff = 25 * time.Millisecond

// retryPolicy translates a rule's retry policy, or returns nil when it has
// none or, for gRPC clients, none of its codes maps to a gRPC status a
// client retries.
func retryPolicy(rule *model.RouteRule, proxyless bool) *routev3.RetryPolicy {
	r := rule.Retry
	if r == nil || (r.Attempts != nil && *r.Attempts <= 0) {
		return nil
	}
	out := &routev3.RetryPolicy{NumRetries: wrapperspb.UInt32(1)}
	if r.Attempts != nil {
		out.NumRetries = wrapperspb.UInt32(uint32(*r.Attempts))
	}
	base := defaultBackoff
	if r.Backoff != nil && *r.Backoff > 0 {
		base = *r.Backoff
	}
	out.RetryBackOff = &routev3.RetryPolicy_RetryBackOff{BaseInterval: durationpb.New(base)}
	if proxyless {
		if !slices.ContainsFunc(r.Codes, grpcRetriable) {
			return nil
		}
		// No spaces: grpc-js-xds and C-core do not trim the list.
		out.RetryOn = "unavailable"
		return out
	}
	if len(r.Codes) == 0 {
		out.RetryOn = "5xx"
	} else {
		out.RetryOn = "retriable-status-codes"
		for _, c := range r.Codes {
			out.RetriableStatusCodes = append(out.RetriableStatusCodes, uint32(c))
		}
	}
	if rule.Timeout != nil && rule.BackendTimeout != nil {
		out.PerTryTimeout = durationpb.New(*rule.BackendTimeout)
	}
	return out
}

// headerOptions translates the set and add of a header modifier: set
// overwrites, add appends.
func headerOptions(h *model.HeaderModifier) []*corev3.HeaderValueOption {
	out := make([]*corev3.HeaderValueOption, 0, len(h.Set)+len(h.Add))
	for _, s := range h.Set {
		out = append(out, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: s.Name, Value: s.Value}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	}
	for _, a := range h.Add {
		out = append(out, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: a.Name, Value: a.Value}, AppendAction: corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD})
	}
	return out
}

// ProxylessOmissions says what of a route proxyless gRPC clients are not
// sent, one sentence per rule that loses something, for the route's status:
// query parameter matches and HTTP methods other than POST (the matches are
// left out), header modifiers, request mirrors and session persistence (no
// gRPC client here applies them), a per-try timeout, and retry codes that
// map to no gRPC status.
func ProxylessOmissions(r *model.Route) []string {
	var out []string
	for i := range r.Rules {
		rule := &r.Rules[i]
		var lost []string
		for _, m := range rule.Matches {
			if len(m.Query) > 0 {
				lost = append(lost, "query parameter matches")
				break
			}
		}
		for _, m := range rule.Matches {
			if m.Method != "" && m.Method != "POST" {
				lost = append(lost, "matches on method "+m.Method)
				break
			}
		}
		if rule.RequestHeaders != nil || rule.ResponseHeaders != nil || slices.ContainsFunc(rule.Backends, func(b model.RouteBackend) bool {
			return b.RequestHeaders != nil || b.ResponseHeaders != nil
		}) {
			lost = append(lost, "header modifiers")
		}
		if rule.Redirect != nil {
			lost = append(lost, "the redirect (the rule is left out)")
		}
		if rule.Rewrite != nil {
			lost = append(lost, "the URL rewrite")
		}
		if rule.Timeout != nil && rule.BackendTimeout != nil && rule.Retry != nil {
			lost = append(lost, "the per-try timeout")
		}
		if rule.Retry != nil && !slices.ContainsFunc(rule.Retry.Codes, grpcRetriable) {
			lost = append(lost, "the retry policy (no code maps to UNAVAILABLE)")
		}
		if len(rule.Mirrors) > 0 {
			lost = append(lost, "request mirrors")
		}
		if rule.Session != nil {
			lost = append(lost, "session persistence")
		}
		if len(lost) > 0 {
			name := fmt.Sprintf("rule %d", i)
			if rule.Name != "" {
				name += fmt.Sprintf(" (%s)", rule.Name)
			}
			out = append(out, name+": "+strings.Join(lost, ", "))
		}
	}
	return out
}

// BackendPart is the part of a Service's fragment that a scope serves when
// the Service is only a mesh route's backend there, not selected: its
// clusters and assignments, which the route sends requests to, and no
// listener, route configuration or virtual host, since the scope's proxies
// cannot address the Service by name. The messages are shared.
func (f *Fragment) BackendPart() Fragment {
	out := Fragment{Service: f.Service}
	out.Clusters, out.Endpoints, out.Places = f.Clusters, f.Endpoints, f.Places
	backend := map[*model.Origin]*model.Origin{}
	for _, t := range []xdstype.Type{xdstype.Cluster, xdstype.Endpoint} {
		out.from[t] = make([]*model.Origin, len(f.from[t]))
		for i, o := range f.from[t] {
			if o == nil {
				continue
			}
			if backend[o] == nil {
				b := *o
				b.Backend = true
				backend[o] = &b
			}
			out.from[t][i] = backend[o]
		}
	}
	return out
}

// InvalidEntries says which of a route's entries Envoy's validation
// rejects in either listener mode, one sentence each, for the route's
// status: they are left out of every configuration (see validEntry). Each
// entry is built as if every backend existed, so that only the route's own
// values are judged.
func InvalidEntries(r *model.Route) []string {
	var out []string
	for i := range r.Rules {
		rule := &r.Rules[i]
		backends := map[model.Key]*model.Service{}
		for _, b := range rule.Refs() {
			svc := backends[b.Service]
			if svc == nil {
				svc = &model.Service{Key: b.Service}
				backends[b.Service] = svc
			}
			svc.Ports = append(svc.Ports, model.ServicePort{Port: b.Port, Protocol: model.ProtocolTCP})
		}
		matches := rule.Matches
		if len(matches) == 0 {
			matches = []model.RouteMatch{{PathType: model.PathPrefix, Path: "/", GRPC: r.Kind == model.GRPCRoute}}
		}
		for j := range matches {
			for _, mode := range []model.ListenerMode{model.ListenerEnvoy, model.ListenerProxylessGRPC} {
				e := buildEntry(&matches[j], rule, backends, mode)
				if e == nil {
					continue
				}
				if err := e.ValidateAll(); err != nil {
					out = append(out, fmt.Sprintf("rule %d match %d: %v", i, j, err))
					break
				}
			}
		}
	}
	return out
}
