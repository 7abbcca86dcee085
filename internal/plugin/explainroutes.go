package plugin

import (
	"context"
	"fmt"
	"slices"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/translate"
)

// routing reads the mesh routes of the Service that apply to scopes of
// namespace scopeNS, as the control plane picks them (docs/routes.md): the
// consumer routes of scopeNS when it has any, else the producer routes of
// the Service's namespace; and the backends they may reach. It prints what
// it leaves out and why. It returns nil when no route applies, or the
// cluster serves neither route kind.
func (o *options) routing(ctx context.Context, cl client.Client, svc *model.Service, scopeNS string) (*translate.Routing, error) {
	var attached []*model.Route
	for _, kind := range []model.RouteKind{model.HTTPRoute, model.GRPCRoute} {
		for _, ns := range slices.Compact([]string{svc.Key.Namespace, scopeNS}) {
			_, list := convert.RouteObject(kind)
			if err := cl.List(ctx, list, client.InNamespace(ns)); meta.IsNoMatchError(err) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("listing %ss of namespace %s: %w", kind, ns, err)
			}
			if err := meta.EachListItem(list, func(obj runtime.Object) error {
				r, ok := convert.Route(obj.(client.Object))
				if ok && slices.ContainsFunc(r.Parents, func(p model.RouteParent) bool { return p.Service == svc.Key }) {
					attached = append(attached, r)
				}
				return nil
			}); err != nil {
				return nil, err
			}
		}
	}
	pick := func(ns string) []*model.Route {
		var out []*model.Route
		for _, r := range attached {
			if r.Key.Namespace == ns {
				out = append(out, r)
			}
		}
		return out
	}
	served := func(rs []*model.Route) bool {
		return slices.ContainsFunc(rs, func(r *model.Route) bool { return r.Refused == "" })
	}
	applies, which := pick(svc.Key.Namespace), "producer routes, of the Service's namespace"
	if consumer := pick(scopeNS); scopeNS != svc.Key.Namespace && served(consumer) {
		applies, which = consumer, "consumer routes of namespace "+scopeNS+", in place of the producer's"
	}
	if len(applies) == 0 {
		return nil, nil
	}
	slices.SortFunc(applies, (*model.Route).Compare)
	o.printf("Mesh routes of Service %s for this scope (%s):\n", svc.Key, which)
	rt := &translate.Routing{Backends: map[model.Key]*model.Service{}}
	grants := map[string]map[model.RouteKind]model.Grants{}
	for _, r := range applies {
		if r.Refused != "" {
			o.printf("  %s: not accepted, so not served: %s\n", model.RouteRef{Kind: r.Kind, Key: r.Key}, r.Refused)
			continue
		}
		o.printf("  %s\n", model.RouteRef{Kind: r.Kind, Key: r.Key})
		rt.Routes = append(rt.Routes, r)
		for i := range r.Rules {
			for _, b := range r.Rules[i].Refs() {
				if _, done := rt.Backends[b.Service]; done || b.Invalid != "" {
					continue
				}
				var bs corev1.Service
				if err := cl.Get(ctx, types.NamespacedName{Namespace: b.Service.Namespace, Name: b.Service.Name}, &bs); apierrors.IsNotFound(err) {
					o.printf("    its backend %s does not exist: its share of requests is not served\n", b.Service)
					continue
				} else if err != nil {
					return nil, fmt.Errorf("reading backend %s: %w", b.Service, err)
				}
				if b.Service.Namespace != r.Key.Namespace {
					g, ok := grants[b.Service.Namespace]
					if !ok {
						var list gatewayv1beta1.ReferenceGrantList
						if err := cl.List(ctx, &list, client.InNamespace(b.Service.Namespace)); err != nil && !meta.IsNoMatchError(err) {
							return nil, fmt.Errorf("ReferenceGrants of %s: %w", b.Service.Namespace, err)
						}
						g = convert.RouteGrants(list.Items)
						grants[b.Service.Namespace] = g
					}
					if !g[r.Kind].Permits(r.Key.Namespace, b.Service.Name) {
						o.printf("    its backend %s is not granted to %ss of namespace %s by a ReferenceGrant: not served (unless the control plane runs with --cross-namespace=allow)\n", b.Service, r.Kind, r.Key.Namespace)
						continue
					}
				}
				rt.Backends[b.Service] = convert.Service(&bs, nil)
			}
		}
	}
	if len(rt.Routes) == 0 {
		return nil, nil
	}
	return rt, nil
}

// explainRoutes prints, for each port of the Service that routes apply to,
// its route entries in the order a request tries them: which route, rule
// and match each comes from and where it sends requests, or why this
// scope's clients are not sent it.
func (o *options) explainRoutes(svc *model.Service, rt *translate.Routing, mode model.ListenerMode) {
	for _, p := range svc.Ports {
		entries, routed := translate.Entries(svc, p.Port, rt, mode)
		if !routed {
			continue
		}
		o.printf("Port %d: a request takes the first of these that matches; one no entry matches fails (Envoy answers 404):\n", p.Port)
		for i, e := range entries {
			where := fmt.Sprintf("%s rule %d", model.RouteRef{Kind: e.Source.Kind, Key: e.Source.Key}, e.Rule)
			match := "every request"
			if e.Match >= 0 {
				where += fmt.Sprintf(" match %d", e.Match)
				match = describeMatch(&e.Source.Rules[e.Rule].Matches[e.Match])
			}
			if e.Route == nil {
				o.printf("  -. %s (%s): not sent to proxyless gRPC clients (a query or method match gRPC cannot make, or no backend it can reach)\n", where, match)
				continue
			}
			o.printf("  %d. %s (%s) → %s\n", i+1, where, match, describeAction(e.Route))
		}
	}
}

// describeMatch says what a match requires of a request.
func describeMatch(m *model.RouteMatch) string {
	var parts []string
	switch {
	case m.GRPC && m.GRPCService+m.GRPCMethod == "":
		parts = append(parts, "any method")
	case m.GRPC:
		parts = append(parts, fmt.Sprintf("method %s/%s", orAny(m.GRPCService), orAny(m.GRPCMethod)))
	case m.PathType == model.PathExact:
		parts = append(parts, "path "+m.Path)
	case m.PathType == model.PathRegex:
		parts = append(parts, "path ~ "+m.Path)
	default:
		parts = append(parts, "path prefix "+m.Path)
	}
	if m.Method != "" {
		parts = append(parts, "HTTP method "+m.Method)
	}
	for _, h := range m.Headers {
		parts = append(parts, describeValue("header", h))
	}
	for _, q := range m.Query {
		parts = append(parts, describeValue("query", q))
	}
	return strings.Join(parts, ", ")
}

func orAny(s string) string {
	if s == "" {
		return "*"
	}
	return s
}

func describeValue(what string, v model.ValueMatch) string {
	op := "="
	if v.Regex {
		op = "~"
	}
	return what + " " + v.Name + op + v.Value
}

// describeAction says where an entry sends requests.
func describeAction(r *routev3.Route) string {
	if d := r.GetDirectResponse(); d != nil {
		return fmt.Sprintf("answered %d: no backend of the rule can be served", d.GetStatus())
	}
	if d := r.GetRedirect(); d != nil {
		return "redirected (" + strings.ToLower(strings.ReplaceAll(d.GetResponseCode().String(), "_", " ")) + ")"
	}
	a := r.GetRoute()
	var out string
	if c := a.GetCluster(); c != "" {
		out = "cluster " + c
	} else {
		var parts []string
		for _, c := range a.GetWeightedClusters().GetClusters() {
			parts = append(parts, fmt.Sprintf("%s weight %d", c.GetName(), c.GetWeight().GetValue()))
		}
		out = strings.Join(parts, ", ")
	}
	if t := a.GetTimeout(); t != nil {
		out += ", timeout " + t.AsDuration().String()
	}
	if t := a.GetMaxStreamDuration().GetMaxStreamDuration(); t != nil {
		out += ", timeout " + t.AsDuration().String()
	}
	if p := a.GetRetryPolicy(); p != nil {
		out += fmt.Sprintf(", retried on %s up to %d times", p.GetRetryOn(), p.GetNumRetries().GetValue())
	}
	for _, m := range a.GetRequestMirrorPolicies() {
		out += ", copied to " + m.GetCluster()
		if f := m.GetRuntimeFraction().GetDefaultValue(); f != nil {
			out += fmt.Sprintf(" (%d per %s)", f.GetNumerator(), strings.ToLower(strings.ReplaceAll(f.GetDenominator().String(), "_", " ")))
		}
	}
	if _, ok := r.GetTypedPerFilterConfig()[translate.StatefulSessionFilter]; ok {
		out += ", a client kept on its endpoint (session persistence)"
	}
	return out
}
