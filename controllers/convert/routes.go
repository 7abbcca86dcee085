package convert

import (
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/scopeplane/scopeplane/xds/clip"
	"github.com/scopeplane/scopeplane/xds/model"
)

// HTTPRoute converts an HTTPRoute into a model.Route. Only its parentRefs
// to core Services (group "" and kind Service, which a mesh route must
// spell out, since a parentRef's group defaults to Gateway API's) become
// Parents: a route with none is not a mesh route, and the caller treats it
// as absent. What the API server's schema cannot check and no client can
// serve (a regular expression RE2 rejects, a filter not supported yet, a
// weight sum past 2^32−1) makes the route Refused, with every reason.
func HTTPRoute(hr *gatewayv1.HTTPRoute) *model.Route {
	out, refusals := routeHead(&hr.ObjectMeta, model.HTTPRoute, hr.Spec.ParentRefs)
	for i := range hr.Spec.Rules {
		rule := &hr.Spec.Rules[i]
		c := &ruleConverter{ns: hr.Namespace, refusals: refusals, at: ruleAt(i, rule.Name)}
		out.Rules = append(out.Rules, c.httpRule(rule))
		refusals = c.refusals
	}
	out.Refused = strings.Join(refusals, "; ")
	return out
}

// GRPCRoute converts a GRPCRoute into a model.Route, as HTTPRoute does.
func GRPCRoute(gr *gatewayv1.GRPCRoute) *model.Route {
	out, refusals := routeHead(&gr.ObjectMeta, model.GRPCRoute, gr.Spec.ParentRefs)
	for i := range gr.Spec.Rules {
		rule := &gr.Spec.Rules[i]
		c := &ruleConverter{ns: gr.Namespace, refusals: refusals, at: ruleAt(i, rule.Name)}
		out.Rules = append(out.Rules, c.grpcRule(rule))
		refusals = c.refusals
	}
	out.Refused = strings.Join(refusals, "; ")
	return out
}

// Route converts a route of either kind; ok is false for any other object.
func Route(obj client.Object) (r *model.Route, ok bool) {
	switch o := obj.(type) {
	case *gatewayv1.HTTPRoute:
		return HTTPRoute(o), true
	case *gatewayv1.GRPCRoute:
		return GRPCRoute(o), true
	}
	return nil, false
}

// RouteObject returns an empty object and an empty list of the kind's
// Gateway API type, for reading routes of that kind.
func RouteObject(k model.RouteKind) (client.Object, client.ObjectList) {
	if k == model.GRPCRoute {
		return &gatewayv1.GRPCRoute{}, &gatewayv1.GRPCRouteList{}
	}
	return &gatewayv1.HTTPRoute{}, &gatewayv1.HTTPRouteList{}
}

// RouteStatus returns the parentRefs and the status of a route of either
// kind (nil for any other object): what a status writer reads and writes.
func RouteStatus(obj client.Object) ([]gatewayv1.ParentReference, *gatewayv1.RouteStatus) {
	switch o := obj.(type) {
	case *gatewayv1.HTTPRoute:
		return o.Spec.ParentRefs, &o.Status.RouteStatus
	case *gatewayv1.GRPCRoute:
		return o.Spec.ParentRefs, &o.Status.RouteStatus
	}
	return nil, nil
}

// ServiceParent reports whether a parentRef names a core Service (GAMMA):
// group "" and kind Service, both explicit, since a parentRef defaults to
// a Gateway.
func ServiceParent(p *gatewayv1.ParentReference) bool {
	return p.Group != nil && *p.Group == "" && p.Kind != nil && *p.Kind == "Service"
}

// ParentService is the Service a Service parentRef of a route in namespace
// ns names: its namespace defaults to the route's.
func ParentService(p *gatewayv1.ParentReference, ns string) model.Key {
	if p.Namespace != nil && *p.Namespace != "" {
		ns = string(*p.Namespace)
	}
	return model.Key{Namespace: text(ns), Name: text(string(p.Name))}
}

// routeHead converts what both kinds share: identity and parents.
func routeHead(m *metav1.ObjectMeta, kind model.RouteKind, refs []gatewayv1.ParentReference) (*model.Route, []string) {
	out := &model.Route{Key: model.Key{Namespace: m.Namespace, Name: m.Name}, Kind: kind, Generation: m.Generation, Created: m.CreationTimestamp.Time}
	for i := range refs {
		p := &refs[i]
		if !ServiceParent(p) {
			continue
		}
		rp := model.RouteParent{Service: ParentService(p, out.Key.Namespace)}
		if p.Port != nil {
			rp.Port = *p.Port
		}
		dup := false
		for _, q := range out.Parents {
			dup = dup || q == rp
		}
		if !dup {
			out.Parents = append(out.Parents, rp)
		}
	}
	return out, nil
}

// ruleAt names a rule in a refusal (RuleAt).
func ruleAt(i int, name *gatewayv1.SectionName) string {
	if name == nil {
		return RuleAt(i, "")
	}
	return RuleAt(i, string(*name))
}

// RuleAt names a route's rule i in a message: its index, and its name when
// it has one.
func RuleAt(i int, name string) string {
	if name != "" {
		return fmt.Sprintf("rule %d (%s)", i, clip.Quote(name))
	}
	return fmt.Sprintf("rule %d", i)
}

// ruleConverter converts one rule, collecting the reasons it cannot be served.
type ruleConverter struct {
	ns       string
	at       string
	refusals []string
}

func (c *ruleConverter) refuse(field, format string, args ...any) {
	c.refusals = append(c.refusals, text(c.at+": "+field+": "+fmt.Sprintf(format, args...)))
}

// regex checks a regular expression against RE2, which every client uses.
func (c *ruleConverter) regex(field, re string) {
	if _, err := regexp.Compile(re); err != nil {
		c.refuse(field, "the regular expression %s does not compile in RE2 syntax (%v); write it in RE2 syntax", clip.Quote(re), err)
	}
}

func (c *ruleConverter) httpRule(rule *gatewayv1.HTTPRouteRule) model.RouteRule {
	out := model.RouteRule{}
	if rule.Name != nil {
		out.Name = text(string(*rule.Name))
	}
	for j := range rule.Matches {
		out.Matches = append(out.Matches, c.httpMatch(fmt.Sprintf("matches[%d]", j), &rule.Matches[j]))
	}
	for j := range rule.Filters {
		f := &rule.Filters[j]
		switch f.Type {
		case gatewayv1.HTTPRouteFilterRequestRedirect:
			out.Redirect = redirect(f.RequestRedirect)
		case gatewayv1.HTTPRouteFilterURLRewrite:
			out.Rewrite = rewrite(f.URLRewrite)
		case gatewayv1.HTTPRouteFilterRequestMirror:
			out.Mirrors = append(out.Mirrors, c.mirror(j, f.RequestMirror))
		default:
			c.filter(&out.RequestHeaders, &out.ResponseHeaders, fmt.Sprintf("filters[%d]", j), string(f.Type), f.RequestHeaderModifier, f.ResponseHeaderModifier)
		}
	}
	for j := range rule.BackendRefs {
		b := &rule.BackendRefs[j]
		out.Backends = append(out.Backends, c.backendRef(j, &b.BackendRef, len(b.Filters), func(k int) (string, *gatewayv1.HTTPHeaderFilter, *gatewayv1.HTTPHeaderFilter) {
			f := &b.Filters[k]
			return string(f.Type), f.RequestHeaderModifier, f.ResponseHeaderModifier
		}))
	}
	if t := rule.Timeouts; t != nil {
		out.Timeout = c.duration("timeouts.request", t.Request)
		out.BackendTimeout = c.duration("timeouts.backendRequest", t.BackendRequest)
	}
	if r := rule.Retry; r != nil {
		retry := &model.RouteRetry{Backoff: c.duration("retry.backoff", r.Backoff)}
		for _, code := range r.Codes {
			retry.Codes = append(retry.Codes, int32(code))
		}
		if a := r.Attempts; a != nil {
			if *a < 0 || *a > math.MaxInt32 {
				c.refuse("retry.attempts", "%d is out of range; give a number from 0 to %d", *a, math.MaxInt32)
			} else {
				retry.Attempts = ptr.To(int32(*a))
			}
		}
		out.Retry = retry
	}
	out.Session = c.session(rule.SessionPersistence)
	c.weights(out.Backends)
	return out
}

func (c *ruleConverter) grpcRule(rule *gatewayv1.GRPCRouteRule) model.RouteRule {
	out := model.RouteRule{}
	if rule.Name != nil {
		out.Name = text(string(*rule.Name))
	}
	for j := range rule.Matches {
		out.Matches = append(out.Matches, c.grpcMatch(fmt.Sprintf("matches[%d]", j), &rule.Matches[j]))
	}
	for j := range rule.Filters {
		f := &rule.Filters[j]
		if f.Type == gatewayv1.GRPCRouteFilterRequestMirror {
			out.Mirrors = append(out.Mirrors, c.mirror(j, f.RequestMirror))
			continue
		}
		c.filter(&out.RequestHeaders, &out.ResponseHeaders, fmt.Sprintf("filters[%d]", j), string(f.Type), f.RequestHeaderModifier, f.ResponseHeaderModifier)
	}
	for j := range rule.BackendRefs {
		b := &rule.BackendRefs[j]
		out.Backends = append(out.Backends, c.backendRef(j, &b.BackendRef, len(b.Filters), func(k int) (string, *gatewayv1.HTTPHeaderFilter, *gatewayv1.HTTPHeaderFilter) {
			f := &b.Filters[k]
			return string(f.Type), f.RequestHeaderModifier, f.ResponseHeaderModifier
		}))
	}
	out.Session = c.session(rule.SessionPersistence)
	c.weights(out.Backends)
	return out
}

func (c *ruleConverter) httpMatch(field string, m *gatewayv1.HTTPRouteMatch) model.RouteMatch {
	out := model.RouteMatch{PathType: model.PathPrefix, Path: "/"}
	if p := m.Path; p != nil {
		if p.Value != nil {
			out.Path = text(*p.Value)
		}
		if p.Type != nil {
			switch *p.Type {
			case gatewayv1.PathMatchExact:
				out.PathType = model.PathExact
			case gatewayv1.PathMatchRegularExpression:
				out.PathType = model.PathRegex
				c.regex(field+".path.value", out.Path)
			case gatewayv1.PathMatchPathPrefix:
			default:
				c.refuse(field+".path.type", "%s is not a path match type; use Exact, PathPrefix or RegularExpression", clip.Quote(string(*p.Type)))
			}
		}
	}
	if m.Method != nil {
		out.Method = text(string(*m.Method))
	}
	for k := range m.Headers {
		h := &m.Headers[k]
		out.Headers = append(out.Headers, c.valueMatch(fmt.Sprintf("%s.headers[%d]", field, k), strings.ToLower(string(h.Name)), h.Value, (*string)(h.Type)))
	}
	for k := range m.QueryParams {
		q := &m.QueryParams[k]
		out.Query = append(out.Query, c.valueMatch(fmt.Sprintf("%s.queryParams[%d]", field, k), string(q.Name), q.Value, (*string)(q.Type)))
	}
	return out
}

func (c *ruleConverter) grpcMatch(field string, m *gatewayv1.GRPCRouteMatch) model.RouteMatch {
	out := model.RouteMatch{GRPC: true}
	if mm := m.Method; mm != nil {
		if mm.Service != nil {
			out.GRPCService = text(*mm.Service)
		}
		if mm.Method != nil {
			out.GRPCMethod = text(*mm.Method)
		}
		if mm.Type != nil {
			switch *mm.Type {
			case gatewayv1.GRPCMethodMatchRegularExpression:
				out.GRPCRegex = true
				c.regex(field+".method.service", out.GRPCService)
				c.regex(field+".method.method", out.GRPCMethod)
			case gatewayv1.GRPCMethodMatchExact:
			default:
				c.refuse(field+".method.type", "%s is not a method match type; use Exact or RegularExpression", clip.Quote(string(*mm.Type)))
			}
		}
	}
	for k := range m.Headers {
		h := &m.Headers[k]
		out.Headers = append(out.Headers, c.valueMatch(fmt.Sprintf("%s.headers[%d]", field, k), strings.ToLower(string(h.Name)), h.Value, (*string)(h.Type)))
	}
	return out
}

// valueMatch converts a header or query-parameter match; every kind's
// match types are spelled Exact and RegularExpression, Exact by default.
func (c *ruleConverter) valueMatch(field, name, value string, typ *string) model.ValueMatch {
	out := model.ValueMatch{Name: text(name), Value: text(value)}
	if typ != nil {
		switch *typ {
		case "RegularExpression":
			out.Regex = true
			c.regex(field+".value", out.Value)
		case "Exact":
		default:
			c.refuse(field+".type", "%s is not a match type; use Exact or RegularExpression", clip.Quote(*typ))
		}
	}
	return out
}

// filter converts a header-modifier filter of a rule or of a backendRef
// into its request or response modifier; any other type (the rule's
// redirect, rewrite and mirrors are converted before) refuses the route.
func (c *ruleConverter) filter(reqMod, respMod **model.HeaderModifier, field, typ string, req, resp *gatewayv1.HTTPHeaderFilter) {
	switch typ {
	case string(gatewayv1.HTTPRouteFilterRequestHeaderModifier):
		*reqMod = headerModifier(req)
	case string(gatewayv1.HTTPRouteFilterResponseHeaderModifier):
		*respMod = headerModifier(resp)
	default:
		c.refuse(field, "the filter type %s is not supported here; remove the filter (RequestHeaderModifier and ResponseHeaderModifier are, and on a rule also RequestRedirect, URLRewrite and RequestMirror)", clip.Quote(typ))
	}
}

// redirect converts a RequestRedirect filter (nil: an empty one, which
// Gateway API's schema does not let through).
func redirect(f *gatewayv1.HTTPRequestRedirectFilter) *model.Redirect {
	out := &model.Redirect{}
	if f == nil {
		return out
	}
	if f.Scheme != nil {
		out.Scheme = text(*f.Scheme)
	}
	if f.Hostname != nil {
		out.Hostname = text(string(*f.Hostname))
	}
	if f.Port != nil {
		out.Port = *f.Port
	}
	if f.StatusCode != nil {
		out.StatusCode = int32(*f.StatusCode)
	}
	out.Path = pathModifier(f.Path)
	return out
}

// rewrite converts a URLRewrite filter.
func rewrite(f *gatewayv1.HTTPURLRewriteFilter) *model.Rewrite {
	out := &model.Rewrite{}
	if f == nil {
		return out
	}
	if f.Hostname != nil {
		out.Hostname = text(string(*f.Hostname))
	}
	out.Path = pathModifier(f.Path)
	return out
}

func pathModifier(p *gatewayv1.HTTPPathModifier) *model.PathModifier {
	switch {
	case p == nil:
		return nil
	case p.Type == gatewayv1.FullPathHTTPPathModifier && p.ReplaceFullPath != nil:
		return &model.PathModifier{Full: true, Value: text(*p.ReplaceFullPath)}
	case p.Type == gatewayv1.PrefixMatchHTTPPathModifier && p.ReplacePrefixMatch != nil:
		return &model.PathModifier{Value: text(*p.ReplacePrefixMatch)}
	}
	return nil
}

func headerModifier(f *gatewayv1.HTTPHeaderFilter) *model.HeaderModifier {
	out := &model.HeaderModifier{}
	if f == nil {
		return out
	}
	for _, h := range f.Set {
		out.Set = append(out.Set, model.Header{Name: text(strings.ToLower(string(h.Name))), Value: text(h.Value)})
	}
	for _, h := range f.Add {
		out.Add = append(out.Add, model.Header{Name: text(strings.ToLower(string(h.Name))), Value: text(h.Value)})
	}
	for _, n := range f.Remove {
		out.Remove = append(out.Remove, text(strings.ToLower(n)))
	}
	return out
}

// backendRef converts backendRef j of a rule with its n filters, filter(k)
// giving the k-th's type and header modifiers: HTTPRoute's and GRPCRoute's
// filters are different types with these same fields.
func (c *ruleConverter) backendRef(j int, b *gatewayv1.BackendRef, n int, filter func(k int) (typ string, req, resp *gatewayv1.HTTPHeaderFilter)) model.RouteBackend {
	field := fmt.Sprintf("backendRefs[%d]", j)
	out := c.backend(field, b)
	for k := range n {
		typ, req, resp := filter(k)
		c.filter(&out.RequestHeaders, &out.ResponseHeaders, fmt.Sprintf("%s.filters[%d]", field, k), typ, req, resp)
	}
	return out
}

// backend converts a backendRef. A reference to anything but a core
// Service is kept, Invalid with the reason, so that the status can name it.
func (c *ruleConverter) backend(field string, b *gatewayv1.BackendRef) model.RouteBackend {
	out := model.RouteBackend{Service: model.Key{Namespace: text(c.ns), Name: text(string(b.Name))}, Weight: 1}
	if b.Namespace != nil && *b.Namespace != "" {
		out.Service.Namespace = text(string(*b.Namespace))
	}
	if b.Port != nil {
		out.Port = *b.Port
	}
	if b.Weight != nil {
		out.Weight = *b.Weight
	}
	group, kind := "", "Service"
	if b.Group != nil {
		group = string(*b.Group)
	}
	if b.Kind != nil {
		kind = string(*b.Kind)
	}
	if group != "" || kind != "Service" {
		what := clip.Quote(kind)
		if group != "" {
			what += " of group " + clip.Quote(group)
		}
		out.Invalid = text(fmt.Sprintf("%s: %s: a backend must be a core Service, not a %s", c.at, field, what))
	}
	if out.Weight < 0 {
		c.refuse(field+".weight", "%d is negative; give a weight from 0 up", out.Weight)
	}
	return out
}

// weights refuses a rule whose backends' weights sum past 2^32−1, the most
// Envoy's and gRPC's total_weight hold.
func (c *ruleConverter) weights(bs []model.RouteBackend) {
	var sum int64
	for _, b := range bs {
		sum += int64(max(b.Weight, 0))
	}
	if sum > math.MaxUint32 {
		c.refuse("backendRefs", "the weights sum to %d, past %d; scale them down", sum, uint64(math.MaxUint32))
	}
}

// mirror converts the RequestMirror filter k of a rule: its backend, and
// the share of requests it copies (all, unless percent or fraction says).
func (c *ruleConverter) mirror(k int, f *gatewayv1.HTTPRequestMirrorFilter) model.RouteMirror {
	field := fmt.Sprintf("filters[%d].requestMirror", k)
	out := model.RouteMirror{Filter: k, Numerator: 1, Denominator: 1}
	if f == nil {
		c.refuse(field, "the filter has no requestMirror; give its backendRef")
		return out
	}
	out.Backend = c.backend(field+".backendRef", &gatewayv1.BackendRef{BackendObjectReference: f.BackendRef})
	switch {
	case f.Percent != nil && f.Fraction != nil:
		c.refuse(field, "both percent and fraction are given; give one")
	case f.Percent != nil:
		out.Numerator, out.Denominator = *f.Percent, 100
	case f.Fraction != nil:
		out.Numerator, out.Denominator = f.Fraction.Numerator, ptr.Deref(f.Fraction.Denominator, 100)
	}
	if out.Denominator <= 0 || out.Numerator < 0 || out.Numerator > out.Denominator {
		c.refuse(field, "%d/%d is not a share of requests; give a numerator from 0 to a denominator above 0", out.Numerator, out.Denominator)
	}
	return out
}

// Default session names, when sessionPersistence gives none.
const (
	defaultSessionCookie = "scopeplane-session"
	defaultSessionHeader = "x-scopeplane-session"
)

// token is what a cookie or header name may hold (RFC 9110's token).
var token = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

// session converts a rule's sessionPersistence. What Envoy's session
// states cannot keep is refused: a header-based session has no lifetime,
// and a session cookie's absolute timeout would need the cookie to expire
// while it is kept, which only a permanent cookie's Max-Age does.
func (c *ruleConverter) session(sp *gatewayv1.SessionPersistence) *model.SessionPersistence {
	if sp == nil {
		return nil
	}
	const field = "sessionPersistence"
	out := &model.SessionPersistence{Name: defaultSessionCookie}
	switch t := ptr.Deref(sp.Type, gatewayv1.CookieBasedSessionPersistence); t {
	case gatewayv1.HeaderBasedSessionPersistence:
		out.Header, out.Name = true, defaultSessionHeader
	case gatewayv1.CookieBasedSessionPersistence:
	default:
		c.refuse(field+".type", "%s is not a session persistence type; use Cookie or Header", clip.Quote(string(t)))
	}
	if n := sp.SessionName; n != nil {
		if !token.MatchString(*n) {
			c.refuse(field+".sessionName", "%s cannot name a cookie or a header; use letters, digits and !#$%%&'*+-.^_`|~", clip.Quote(*n))
		}
		out.Name = text(*n)
	}
	if out.Header {
		out.Name = strings.ToLower(out.Name)
	}
	permanent := sp.CookieConfig != nil && ptr.Deref(sp.CookieConfig.LifetimeType, gatewayv1.SessionCookieLifetimeType) == gatewayv1.PermanentCookieLifetimeType
	timeout := c.duration(field+".absoluteTimeout", sp.AbsoluteTimeout)
	switch {
	case out.Header && sp.AbsoluteTimeout != nil:
		c.refuse(field+".absoluteTimeout", "a header-based session has no lifetime to bound; remove absoluteTimeout, or use a Permanent cookie")
	case permanent && (timeout == nil || *timeout <= 0):
		c.refuse(field+".absoluteTimeout", "a Permanent cookie needs its lifetime; give an absoluteTimeout above 0")
	case permanent:
		out.TTL = *timeout
	case sp.AbsoluteTimeout != nil:
		c.refuse(field+".absoluteTimeout", "a Session cookie is kept until the client's session ends, which cannot be bounded; remove absoluteTimeout, or set cookieConfig.lifetimeType to Permanent")
	}
	return out
}

// gatewayDuration is Gateway API's duration format (GEP-2257): up to four
// whole numbers of up to five digits, each with a unit h, m, s or ms.
var gatewayDuration = regexp.MustCompile(`^([0-9]{1,5}(h|m|s|ms)){1,4}$`)

// duration converts a Gateway API duration ("0s" is 0: none).
func (c *ruleConverter) duration(field string, d *gatewayv1.Duration) *time.Duration {
	if d == nil {
		return nil
	}
	s := string(*d)
	v, err := time.ParseDuration(s)
	if err != nil || !gatewayDuration.MatchString(s) {
		c.refuse(field, "%s is not a Gateway API duration; write it as in 1h2m3s4ms", clip.Quote(s))
		return nil
	}
	return &v
}
