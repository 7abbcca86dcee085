package gamma_test

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
)

// request is an HTTP request as a route configuration sees it: the
// authority, the :path with its query string, the method, and the other
// headers by lower-case name.
type request struct {
	host, path, method string
	headers            map[string][]string
}

// outcome is what a route configuration does with a request: the status
// of a direct or redirect response, or the clusters it goes to with their
// weights, and the request headers the backend sees and the response
// headers the client sees. route says which entry decided, for messages.
type outcome struct {
	status          int
	clusters        map[string]uint32
	backendHeaders  map[string][]string
	responseHeaders map[string][]string
	route           string
}

// evaluate routes a request through a route configuration as Envoy does
// (and, for the encodings they accept, gRPC clients): the virtual host
// whose domain is the Host, exactly or else "*"; its first route whose
// match holds; that route's action and header mutations. No virtual host
// or route is a 404. Whatever it cannot evaluate faithfully (a wildcard
// domain, a match or action field it does not know, header mutations at
// another level than the route's) is an error, never ignored: the test
// must not pass a route configuration it did not read.
func evaluate(rc *routev3.RouteConfiguration, req request) (outcome, error) {
	out := outcome{status: 404, backendHeaders: map[string][]string{}, responseHeaders: map[string][]string{}}
	for k, v := range req.headers {
		out.backendHeaders[k] = slices.Clone(v)
	}
	out.backendHeaders["host"] = []string{req.host}
	if len(rc.GetRequestHeadersToAdd())+len(rc.GetRequestHeadersToRemove())+len(rc.GetResponseHeadersToAdd())+len(rc.GetResponseHeadersToRemove()) > 0 {
		return out, fmt.Errorf("route configuration %s: header mutations at its level are not evaluated", rc.GetName())
	}
	vh, err := virtualHost(rc, req.host)
	if err != nil || vh == nil {
		out.route = "no virtual host for " + req.host
		return out, err
	}
	if len(vh.GetRequestHeadersToAdd())+len(vh.GetRequestHeadersToRemove())+len(vh.GetResponseHeadersToAdd())+len(vh.GetResponseHeadersToRemove()) > 0 {
		return out, fmt.Errorf("virtual host %s: header mutations at its level are not evaluated", vh.GetName())
	}
	for i, rt := range vh.GetRoutes() {
		ok, err := matches(rt.GetMatch(), req)
		if err != nil {
			return out, fmt.Errorf("virtual host %s, route %d: %w", vh.GetName(), i, err)
		}
		if !ok {
			continue
		}
		out.route = fmt.Sprintf("virtual host %s, route %d", vh.GetName(), i)
		if err := act(rt, &out); err != nil {
			return out, fmt.Errorf("%s: %w", out.route, err)
		}
		return out, nil
	}
	out.route = fmt.Sprintf("no route of virtual host %s matches", vh.GetName())
	return out, nil
}

// virtualHost picks the virtual host with the Host among its domains,
// compared case-insensitively, else the one with the domain "*".
func virtualHost(rc *routev3.RouteConfiguration, host string) (*routev3.VirtualHost, error) {
	var star *routev3.VirtualHost
	for _, vh := range rc.GetVirtualHosts() {
		for _, d := range vh.GetDomains() {
			switch {
			case d == "*":
				star = vh
			case strings.Contains(d, "*"):
				return nil, fmt.Errorf("virtual host %s: the wildcard domain %q is not evaluated", vh.GetName(), d)
			case strings.EqualFold(d, host):
				return vh, nil
			}
		}
	}
	return star, nil
}

// matches evaluates a route's match: its path specifier, then every header
// and query parameter matcher.
func matches(m *routev3.RouteMatch, req request) (bool, error) {
	if m.GetCaseSensitive() != nil && !m.GetCaseSensitive().GetValue() || m.GetRuntimeFraction() != nil ||
		m.GetGrpc() != nil || m.GetTlsContext() != nil || len(m.GetDynamicMetadata()) > 0 || len(m.GetFilterState()) > 0 {
		return false, fmt.Errorf("the match %v has fields that are not evaluated", m)
	}
	path, query, _ := strings.Cut(req.path, "?")
	var ok bool
	switch p := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		ok = strings.HasPrefix(req.path, p.Prefix)
	case *routev3.RouteMatch_Path:
		ok = path == p.Path
	case *routev3.RouteMatch_SafeRegex:
		re, err := fullRegexp(p.SafeRegex)
		if err != nil {
			return false, err
		}
		ok = re.MatchString(path)
	case *routev3.RouteMatch_PathSeparatedPrefix:
		ok = path == p.PathSeparatedPrefix || strings.HasPrefix(path, p.PathSeparatedPrefix+"/")
	default:
		return false, fmt.Errorf("the path specifier %T is not evaluated", p)
	}
	for _, h := range m.GetHeaders() {
		if !ok {
			break
		}
		var err error
		ok, err = headerMatches(h, req)
		if err != nil {
			return false, err
		}
	}
	params, err := url.ParseQuery(query)
	if err != nil {
		return false, fmt.Errorf("the query %q: %w", query, err)
	}
	for _, q := range m.GetQueryParameters() {
		if !ok {
			break
		}
		vs, present := params[q.GetName()]
		switch s := q.GetQueryParameterMatchSpecifier().(type) {
		case *routev3.QueryParameterMatcher_PresentMatch:
			ok = present == s.PresentMatch
		case *routev3.QueryParameterMatcher_StringMatch:
			if !present {
				ok = false
				break
			}
			ok, err = stringMatches(s.StringMatch, vs[0])
			if err != nil {
				return false, err
			}
		default:
			return false, fmt.Errorf("the query parameter matcher %T is not evaluated", s)
		}
	}
	return ok, nil
}

// headerMatches evaluates one header matcher; names are compared
// case-insensitively, and the pseudo-headers :method, :path and :authority
// are the request's.
func headerMatches(h *routev3.HeaderMatcher, req request) (bool, error) {
	if h.GetInvertMatch() || h.GetTreatMissingHeaderAsEmpty() {
		return false, fmt.Errorf("the header matcher %v is not evaluated", h)
	}
	var value string
	present := true
	switch name := strings.ToLower(h.GetName()); name {
	case ":method":
		value = req.method
	case ":path":
		value = req.path
	case ":authority":
		value = req.host
	default:
		var vs []string
		for k, v := range req.headers {
			if strings.EqualFold(k, name) {
				vs = append(vs, v...)
			}
		}
		value, present = strings.Join(vs, ","), len(vs) > 0
	}
	switch s := h.GetHeaderMatchSpecifier().(type) {
	case *routev3.HeaderMatcher_PresentMatch:
		return present == s.PresentMatch, nil
	case *routev3.HeaderMatcher_ExactMatch:
		return present && value == s.ExactMatch, nil //nolint:staticcheck // deprecated, yet what proxyless gRPC clients are sent
	case *routev3.HeaderMatcher_SafeRegexMatch:
		re, err := fullRegexp(s.SafeRegexMatch) //nolint:staticcheck // deprecated, yet what proxyless gRPC clients are sent
		return present && err == nil && re.MatchString(value), err
	case *routev3.HeaderMatcher_StringMatch:
		ok, err := stringMatches(s.StringMatch, value)
		return present && ok, err
	}
	return false, fmt.Errorf("the header matcher %T is not evaluated", h.GetHeaderMatchSpecifier())
}

func stringMatches(m *matcherv3.StringMatcher, v string) (bool, error) {
	if m.GetIgnoreCase() {
		return false, fmt.Errorf("the string matcher %v is not evaluated", m)
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return v == p.Exact, nil
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(v, p.Prefix), nil
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(v, p.Suffix), nil
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(v, p.Contains), nil
	case *matcherv3.StringMatcher_SafeRegex:
		re, err := fullRegexp(p.SafeRegex)
		return err == nil && re.MatchString(v), err
	}
	return false, fmt.Errorf("the string matcher %T is not evaluated", m.GetMatchPattern())
}

// fullRegexp compiles a RE2 matcher that must match the whole value, as
// Envoy's and gRPC's safe_regex do.
func fullRegexp(m *matcherv3.RegexMatcher) (*regexp.Regexp, error) {
	re, err := regexp.Compile(`^(?:` + m.GetRegex() + `)$`)
	if err != nil {
		return nil, fmt.Errorf("the regular expression %q: %w", m.GetRegex(), err)
	}
	return re, nil
}

// redirectCodes are the statuses of RedirectAction's response codes.
var redirectCodes = map[routev3.RedirectAction_RedirectResponseCode]int{
	routev3.RedirectAction_MOVED_PERMANENTLY:  301,
	routev3.RedirectAction_FOUND:              302,
	routev3.RedirectAction_SEE_OTHER:          303,
	routev3.RedirectAction_TEMPORARY_REDIRECT: 307,
	routev3.RedirectAction_PERMANENT_REDIRECT: 308,
}

// act applies a matched route: its action, then its header mutations.
// A forwarded request is answered 200, as the suite's echo backend does;
// the path the backend sees is not computed, since the suite's mesh client
// does not compare it.
func act(rt *routev3.Route, out *outcome) error {
	switch a := rt.GetAction().(type) {
	case *routev3.Route_DirectResponse:
		out.status = int(a.DirectResponse.GetStatus())
	case *routev3.Route_Redirect:
		out.status = redirectCodes[a.Redirect.GetResponseCode()]
	case *routev3.Route_Route:
		ra := a.Route
		out.status, out.clusters = 200, map[string]uint32{}
		switch c := ra.GetClusterSpecifier().(type) {
		case *routev3.RouteAction_Cluster:
			out.clusters[c.Cluster] = 1
		case *routev3.RouteAction_WeightedClusters:
			var sum uint64
			for _, wc := range c.WeightedClusters.GetClusters() {
				probe := proto.Clone(wc).(*routev3.WeightedCluster_ClusterWeight)
				probe.Name, probe.Weight = "", nil
				if !proto.Equal(probe, &routev3.WeightedCluster_ClusterWeight{}) {
					return fmt.Errorf("the weighted cluster %s has fields that are not evaluated", wc.GetName())
				}
				if w := wc.GetWeight().GetValue(); w > 0 {
					out.clusters[wc.GetName()] += w
					sum += uint64(w)
				}
			}
			// Envoy and gRPC refuse a total_weight other than the weights' sum.
			tw := c.WeightedClusters.GetTotalWeight() //nolint:staticcheck // deprecated, yet what proxyless gRPC clients are sent
			if tw != nil && uint64(tw.GetValue()) != sum {
				return fmt.Errorf("the weighted clusters' total_weight %d is not their weights' sum %d", tw.GetValue(), sum)
			}
		default:
			return fmt.Errorf("the cluster specifier %T is not evaluated", c)
		}
		if h := ra.GetHostRewriteLiteral(); h != "" {
			out.backendHeaders["host"] = []string{h}
		} else if ra.GetHostRewriteSpecifier() != nil {
			return fmt.Errorf("the host rewrite %T is not evaluated", ra.GetHostRewriteSpecifier())
		}
	default:
		return fmt.Errorf("the action %T is not evaluated", a)
	}
	if err := mutate(out.backendHeaders, rt.GetRequestHeadersToRemove(), rt.GetRequestHeadersToAdd()); err != nil {
		return err
	}
	return mutate(out.responseHeaders, rt.GetResponseHeadersToRemove(), rt.GetResponseHeadersToAdd())
}

// mutate applies header mutations as Envoy does: the removals first, then
// each addition by its append action.
func mutate(h map[string][]string, remove []string, add []*corev3.HeaderValueOption) error {
	for _, r := range remove {
		delete(h, strings.ToLower(r))
	}
	for _, o := range add {
		if o.GetAppend() != nil { //nolint:staticcheck // deprecated: refused below, never evaluated
			return fmt.Errorf("the header option %v uses the deprecated append, which is not evaluated", o)
		}
		name, value := strings.ToLower(o.GetHeader().GetKey()), o.GetHeader().GetValue()
		_, exists := h[name]
		switch o.GetAppendAction() {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
			h[name] = append(h[name], value)
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if !exists {
				h[name] = []string{value}
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
			h[name] = []string{value}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if exists {
				h[name] = []string{value}
			}
		default:
			return fmt.Errorf("the append action %v is not evaluated", o.GetAppendAction())
		}
	}
	return nil
}
