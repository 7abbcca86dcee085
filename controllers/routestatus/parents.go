// Package routestatus writes the status of Gateway API mesh routes
// (HTTPRoutes and GRPCRoutes whose parents are Services): a
// status.parents entry per Service parentRef, under this control plane's
// controller name, with the conditions Accepted and ResolvedRefs. The
// entries are a pure function of the route and of what the informer cache
// holds (Parents); the leader writes them (Reconciler), leaving other
// controllers' entries as they are.
package routestatus

import (
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/xds/clip"
	"github.com/scopeplane/scopeplane/xds/model"
)

// DefaultControllerName is the controller name of the entries scopeplane
// writes, unless --route-controller-name says otherwise.
const DefaultControllerName = "scopeplane.dev/mesh"

// ReasonConflicted is Accepted=False's reason for an HTTPRoute on a
// Service port a GRPCRoute of the same namespace also attaches to: the two
// kinds do not merge, and the GRPCRoute wins (GEP-1294). Gateway API
// names it for other objects; the route API leaves it to implementations.
const ReasonConflicted gatewayv1.RouteConditionReason = "Conflicted"

// maxParents is the most entries status.parents holds (the CRD's maxItems).
const maxParents = 32

// maxMessage is the longest condition message the API server accepts.
const maxMessage = 32768

// controllerNamePattern is Gateway API's GatewayController format: a
// domain-prefixed path.
var controllerNamePattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/[A-Za-z0-9\/\-._~%!$&'()*+,;=:]+$`)

// CheckControllerName refuses a controller name Gateway API's schema would
// refuse in status.parents[].controllerName, so that a bad flag fails the
// start rather than every status write.
func CheckControllerName(name string) error {
	if len(name) > 253 || !controllerNamePattern.MatchString(name) {
		return fmt.Errorf("route controller name %q: it must be a domain-prefixed path of at most 253 characters, as example.com/mesh", name)
	}
	return nil
}

// Consent is what lets a route name a backend in another namespace.
type Consent struct {
	// Allow says cross-namespace references need no consent
	// (--cross-namespace=allow).
	Allow bool
	// Unavailable says consent is asked for but the cluster serves no
	// ReferenceGrants, so no namespace can give it.
	Unavailable bool
	// Grants are, per backend namespace, the grants its ReferenceGrants
	// give to routes of the route's kind (convert.RouteGrants).
	Grants map[string]model.Grants
}

// Inputs is what a route's parent entries are computed from.
type Inputs struct {
	ControllerName gatewayv1.GatewayController
	// Route is the route converted; ParentRefs its parentRefs as written,
	// which its entries are keyed by.
	Route      *model.Route
	ParentRefs []gatewayv1.ParentReference
	// Services holds the Services the route names that exist.
	Services map[model.Key]*corev1.Service
	Consent  Consent
	// GRPCRoutes, for an HTTPRoute, are the GRPCRoutes of its namespace
	// that attach to its parent Services: each wins the ports it holds.
	GRPCRoutes []*model.Route
	// ProxylessOmissions say, one sentence per rule, what proxyless gRPC
	// clients are not sent of the route; an accepted entry's message
	// names them, so that the difference between client kinds is seen.
	ProxylessOmissions []string
	// Invalid say, one sentence per entry, which of the route's entries
	// fail Envoy's validation and are sent to no client.
	Invalid []string
	Now     metav1.Time
}

// Parents returns status.parents: old's entries of other controllers as
// they are, then an entry of this controller per Service parentRef, in the
// order of the spec. A condition that keeps its status keeps its
// lastTransitionTime.
func Parents(old []gatewayv1.RouteParentStatus, in *Inputs) []gatewayv1.RouteParentStatus {
	out := make([]gatewayv1.RouteParentStatus, 0, len(old)+len(in.ParentRefs))
	var ours []gatewayv1.RouteParentStatus
	for _, e := range old {
		if e.ControllerName == in.ControllerName {
			ours = append(ours, e)
		} else {
			out = append(out, e)
		}
	}
	resolved := resolvedRefs(in)
	for i := range in.ParentRefs {
		p := in.ParentRefs[i]
		if !convert.ServiceParent(&p) || len(out) == maxParents || written(out, in.ControllerName, &p) {
			continue
		}
		var prev []metav1.Condition
		for _, e := range ours {
			if equality.Semantic.DeepEqual(e.ParentRef, p) {
				prev = e.Conditions
			}
		}
		conds := []metav1.Condition{
			condition(prev, accepted(in, &p), in),
			condition(prev, resolved, in),
		}
		if len(in.Invalid) > 0 && conds[0].Status == metav1.ConditionTrue {
			// Gateway API's PartiallyInvalid: the rest of the route is served.
			conds = append(conds, condition(prev, cond(gatewayv1.RouteConditionPartiallyInvalid, true, gatewayv1.RouteReasonUnsupportedValue,
				"not sent to any client, as Envoy's validation rejects them: %s", strings.Join(in.Invalid, "; ")), in))
		}
		out = append(out, gatewayv1.RouteParentStatus{ParentRef: p, ControllerName: in.ControllerName, Conditions: conds})
	}
	return out
}

// parentsEqual reports whether two status.parents lists are the same (nil and
// empty alike).
func parentsEqual(a, b []gatewayv1.RouteParentStatus) bool {
	return len(a) == 0 && len(b) == 0 || equality.Semantic.DeepEqual(a, b)
}

func written(out []gatewayv1.RouteParentStatus, name gatewayv1.GatewayController, p *gatewayv1.ParentReference) bool {
	for _, e := range out {
		if e.ControllerName == name && equality.Semantic.DeepEqual(e.ParentRef, *p) {
			return true
		}
	}
	return false
}

// condition completes c with the generation and the time of its last
// transition: the previous one's when its status is the same.
func condition(prev []metav1.Condition, c metav1.Condition, in *Inputs) metav1.Condition {
	c.ObservedGeneration = in.Route.Generation
	c.Message = clip.String(c.Message, maxMessage)
	c.LastTransitionTime = in.Now
	for _, p := range prev {
		if p.Type == c.Type && p.Status == c.Status {
			c.LastTransitionTime = p.LastTransitionTime
		}
	}
	return c
}

func cond(t gatewayv1.RouteConditionType, ok bool, reason gatewayv1.RouteConditionReason, format string, args ...any) metav1.Condition {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	return metav1.Condition{Type: string(t), Status: s, Reason: string(reason), Message: fmt.Sprintf(format, args...)}
}

// accepted is the Accepted condition of the route's entry for parentRef p.
func accepted(in *Inputs, p *gatewayv1.ParentReference) metav1.Condition {
	key := convert.ParentService(p, in.Route.Key.Namespace)
	svc := in.Services[key]
	var port int32
	if p.Port != nil {
		port = *p.Port
	}
	switch {
	case in.Route.Refused != "":
		return cond(gatewayv1.RouteConditionAccepted, false, gatewayv1.RouteReasonUnsupportedValue, "%s", in.Route.Refused)
	case svc == nil:
		return cond(gatewayv1.RouteConditionAccepted, false, gatewayv1.RouteReasonNoMatchingParent, "Service %s does not exist", key)
	case port != 0 && !hasPort(svc, port):
		return cond(gatewayv1.RouteConditionAccepted, false, gatewayv1.RouteReasonNoMatchingParent, "Service %s has no port %d", key, port)
	}
	if in.Route.Kind == model.HTTPRoute {
		for _, g := range in.GRPCRoutes {
			if g.Refused != "" || g.Key.Namespace != in.Route.Key.Namespace {
				continue
			}
			for _, q := range g.Parents {
				if q.Service == key && (q.Port == 0 && port == 0 || port != 0 && (q.Port == 0 || q.Port == port)) {
					return cond(gatewayv1.RouteConditionAccepted, false, ReasonConflicted,
						"GRPCRoute %s also attaches to %s: an HTTPRoute and a GRPCRoute do not merge on one Service port, and the GRPCRoute wins; attach this route to another port, or move its rules into the GRPCRoute",
						g.Key, portOf(key, port))
				}
			}
		}
	}
	c := cond(gatewayv1.RouteConditionAccepted, true, gatewayv1.RouteReasonAccepted, "attached to %s", portOf(key, port))
	if len(in.ProxylessOmissions) > 0 {
		c.Message += "; proxyless gRPC clients are not sent " + strings.Join(in.ProxylessOmissions, "; ")
	}
	return c
}

func portOf(svc model.Key, port int32) string {
	if port == 0 {
		return "every port of Service " + svc.String()
	}
	return fmt.Sprintf("port %d of Service %s", port, svc)
}

func hasPort(svc *corev1.Service, port int32) bool {
	for _, p := range svc.Spec.Ports {
		if p.Port == port {
			return true
		}
	}
	return false
}

// resolvedRefs is the ResolvedRefs condition of every entry of the route:
// False when a backendRef is not a Service (InvalidKind), names another
// namespace without its consent (RefNotPermitted; whether such a Service
// exists is not told), or names a Service or port that does not exist
// (BackendNotFound), in that order of reasons; the message lists every
// backendRef that cannot be resolved.
func resolvedRefs(in *Inputs) metav1.Condition {
	var invalid, refused, missing []string
	r := in.Route
	for i, rule := range r.Rules {
		for field, b := range rule.Refs() {
			at := fmt.Sprintf("%s: %s", convert.RuleAt(i, rule.Name), field)
			switch {
			case b.Invalid != "":
				invalid = append(invalid, b.Invalid)
			case b.Service.Namespace != r.Key.Namespace && !in.Consent.permits(r, b.Service):
				refused = append(refused, fmt.Sprintf("%s: Service %s is in another namespace, and %s", at, b.Service, in.Consent.why(r, b.Service)))
			case in.Services[b.Service] == nil:
				missing = append(missing, fmt.Sprintf("%s: Service %s does not exist", at, b.Service))
			case !hasPort(in.Services[b.Service], b.Port):
				missing = append(missing, fmt.Sprintf("%s: Service %s has no port %d", at, b.Service, b.Port))
			}
		}
	}
	all := strings.Join(append(append(invalid, refused...), missing...), "; ")
	switch {
	case len(invalid) > 0:
		return cond(gatewayv1.RouteConditionResolvedRefs, false, gatewayv1.RouteReasonInvalidKind, "%s", all)
	case len(refused) > 0:
		return cond(gatewayv1.RouteConditionResolvedRefs, false, gatewayv1.RouteReasonRefNotPermitted, "%s", all)
	case len(missing) > 0:
		return cond(gatewayv1.RouteConditionResolvedRefs, false, gatewayv1.RouteReasonBackendNotFound, "%s", all)
	}
	return cond(gatewayv1.RouteConditionResolvedRefs, true, gatewayv1.RouteReasonResolvedRefs, "every backendRef resolves")
}

func (c *Consent) permits(r *model.Route, backend model.Key) bool {
	return c.Allow || !c.Unavailable && c.Grants[backend.Namespace].Permits(r.Key.Namespace, backend.Name)
}

func (c *Consent) why(r *model.Route, backend model.Key) string {
	if c.Unavailable {
		return "the cluster does not serve ReferenceGrants (gateway.networking.k8s.io/v1beta1) through which it could consent; install the CRD and restart the control plane, or run it with --cross-namespace=allow"
	}
	return fmt.Sprintf("no ReferenceGrant of namespace %s lets %ss of namespace %s name it; create one there (from group gateway.networking.k8s.io, kind %s, namespace %s; to kind Service)",
		backend.Namespace, r.Kind, r.Key.Namespace, r.Kind, r.Key.Namespace)
}
