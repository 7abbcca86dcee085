package model

import (
	"cmp"
	"fmt"
	"iter"
	"strings"
	"time"
)

// RouteKind is the Gateway API kind a Route was converted from.
type RouteKind string

// The route kinds scopeplane reads (gateway.networking.k8s.io/v1).
const (
	HTTPRoute RouteKind = "HTTPRoute"
	GRPCRoute RouteKind = "GRPCRoute"
)

// Route is an HTTPRoute or a GRPCRoute whose parents are Services (Gateway
// API's mesh routes, GAMMA): how requests for those Services flow. A route
// in its parent's namespace is a producer route and applies to every scope
// that serves the Service; a route in another namespace is a consumer route
// and applies only to the scopes of its own namespace (see Applies).
type Route struct {
	Key        Key
	Kind       RouteKind
	Generation int64
	// Created is the route's creationTimestamp, the first tie-breaker of
	// Gateway API's precedence between rules of different routes.
	Created time.Time
	// Parents are the Services (and ports) the route attaches to; parentRefs
	// of any other kind are not the mesh's and are left out by the converter.
	Parents []RouteParent
	Rules   []RouteRule
	// Refused says why the route cannot be served (a value no client can
	// honour); a refused route attaches to nothing, and its status says so.
	Refused string
}

// RouteParent is a Service a route attaches to: to its port Port, or to
// every port when Port is 0.
type RouteParent struct {
	Service Key
	Port    int32
}

// RouteRule is one rule of a route: the requests it matches and where they go.
type RouteRule struct {
	// Name is the rule's optional name (Gateway API's sectionName).
	Name string
	// Matches are alternatives; an empty list matches every request.
	Matches  []RouteMatch
	Backends []RouteBackend
	// Timeout is the request timeout (timeouts.request), BackendTimeout
	// the timeout of each try (timeouts.backendRequest); nil when unset, 0
	// for none.
	Timeout, BackendTimeout *time.Duration
	Retry                   *RouteRetry
	// RequestHeaders and ResponseHeaders are the header modifiers of the
	// rule's filters; proxyless gRPC clients cannot apply them.
	RequestHeaders, ResponseHeaders *HeaderModifier
	// Redirect, when set, answers the rule's requests with a redirect
	// instead of routing them (a RequestRedirect filter).
	Redirect *Redirect
	// Rewrite, when set, rewrites the host and path of the rule's requests
	// on their way to the backends (a URLRewrite filter).
	Rewrite *Rewrite
	// Mirrors are the rule's RequestMirror filters: each sends a copy of a
	// share of the rule's requests to its backend, whose answers are
	// dropped.
	Mirrors []RouteMirror
	// Session, when set, keeps a client's requests on the endpoint its
	// first one reached (sessionPersistence).
	Session *SessionPersistence
}

// RouteMirror is a RequestMirror filter: Numerator out of Denominator of
// the rule's requests are copied to Backend (whose Weight means nothing).
type RouteMirror struct {
	Backend                RouteBackend
	Numerator, Denominator int32
	// Filter is the filter's index in the rule, to name it in a status.
	Filter int
}

// SessionPersistence keeps a client on one endpoint, by a cookie Envoy
// sets on the first answer or a header the client sends back.
type SessionPersistence struct {
	// Header says the session travels in a header named Name; otherwise in
	// a cookie named Name.
	Header bool
	Name   string
	// TTL is a permanent cookie's lifetime (0: a session cookie, which ends
	// with the client's session).
	TTL time.Duration
}

// Refs yields every reference to a Service that the rule's requests may
// reach, with the field that makes it: its backendRefs, then its mirrors'
// backends. Everything that must serve, index or check a rule's backends
// reads them here, so that a mirror's is never forgotten.
func (r *RouteRule) Refs() iter.Seq2[RefField, *RouteBackend] {
	return func(yield func(RefField, *RouteBackend) bool) {
		for i := range r.Backends {
			if !yield(RefField{Index: i}, &r.Backends[i]) {
				return
			}
		}
		for i := range r.Mirrors {
			if !yield(RefField{Mirror: true, Index: r.Mirrors[i].Filter}, &r.Mirrors[i].Backend) {
				return
			}
		}
	}
}

// RefField is where in a rule a reference to a Service is: backendRef
// Index, or the backendRef of the RequestMirror filter Index.
type RefField struct {
	Mirror bool
	Index  int
}

// String is the field's path in the rule, for a status.
func (f RefField) String() string {
	if f.Mirror {
		return fmt.Sprintf("filters[%d].requestMirror.backendRef", f.Index)
	}
	return fmt.Sprintf("backendRefs[%d]", f.Index)
}

// Redirect is a RequestRedirect filter: the fields set replace the
// request's in the Location of the answer.
type Redirect struct {
	Scheme, Hostname string
	Path             *PathModifier
	// Port is the Location's port (0: the scheme's own, or the request's).
	Port int32
	// StatusCode is the answer's status (0: 302).
	StatusCode int32
}

// Rewrite is a URLRewrite filter.
type Rewrite struct {
	Hostname string
	Path     *PathModifier
}

// PathModifier replaces a request's whole path with Value (Full), or the
// prefix the rule's PathPrefix match matched.
type PathModifier struct {
	Full  bool
	Value string
}

// PathMatchType is how a request path is matched.
type PathMatchType uint8

// Path match types, as in Gateway API; PathPrefix is segment-aware (the
// prefix /a matches /a and /a/b, never /ab).
const (
	PathPrefix PathMatchType = iota
	PathExact
	PathRegex
)

// RouteMatch is one alternative of a rule. An HTTPRoute match sets Path
// (PathPrefix "/" when the route does not say), Method, Headers and Query; a
// GRPCRoute match sets GRPCService and GRPCMethod (either may be empty,
// meaning any) and Headers.
type RouteMatch struct {
	PathType PathMatchType
	Path     string
	// Method is an HTTP method ("" for any).
	Method  string
	Headers []ValueMatch
	Query   []ValueMatch
	// GRPC says the match is a GRPCRoute's: GRPCService and GRPCMethod
	// instead of a path; GRPCRegex says they are regular expressions.
	GRPC                    bool
	GRPCService, GRPCMethod string
	GRPCRegex               bool
}

// ValueMatch matches a header or query parameter by name: its value equal
// to Value, or matching Value as a regular expression (RE2) when Regex.
// Header names are lower case.
type ValueMatch struct {
	Name  string
	Value string
	Regex bool
}

// RouteBackend is a backendRef: a port of a Service, with the weight of its
// share of the rule's requests.
type RouteBackend struct {
	Service Key
	Port    int32
	Weight  int32
	// Invalid says why the reference cannot be served whatever the cluster
	// holds (a kind other than Service); it is then left out.
	Invalid string
	// RequestHeaders and ResponseHeaders are the header modifiers of the
	// backendRef's own filters: applied to the requests sent to this
	// backend only.
	RequestHeaders, ResponseHeaders *HeaderModifier
}

// RouteRetry is a rule's retry policy (Gateway API's experimental retry).
type RouteRetry struct {
	// Codes are the HTTP status codes retried.
	Codes []int32
	// Attempts is how many times a request is retried (nil: the default, 1).
	Attempts *int32
	// Backoff is the base interval between tries (nil: the client's default).
	Backoff *time.Duration
}

// HeaderModifier sets, adds and removes headers.
type HeaderModifier struct {
	Set, Add []Header
	Remove   []string
}

// Header is a header's name and value.
type Header struct {
	Name, Value string
}

// Consumer reports whether the route is a consumer route of the Service:
// it lives in another namespace than the Service.
func (r *Route) Consumer(svc Key) bool { return r.Key.Namespace != svc.Namespace }

// Attaches reports whether the route attaches to port of the Service.
func (r *Route) Attaches(svc Key, port int32) bool {
	for _, p := range r.Parents {
		if p.Service == svc && (p.Port == 0 || p.Port == port) {
			return true
		}
	}
	return false
}

// Compare orders routes by Gateway API's tie-breakers: the older first,
// then by namespace and name, then (an HTTPRoute and a GRPCRoute of one
// name) by kind.
func (r *Route) Compare(o *Route) int {
	switch {
	case r.Created.Before(o.Created):
		return -1
	case o.Created.Before(r.Created):
		return 1
	}
	return cmp.Or(r.Key.Compare(o.Key), strings.Compare(string(r.Kind), string(o.Kind)))
}

// RouteRef names a route of a kind: what a provenance or a status names.
type RouteRef struct {
	Kind RouteKind
	Key  Key
}

// String is "Kind namespace/name".
func (r RouteRef) String() string { return string(r.Kind) + " " + r.Key.String() }
