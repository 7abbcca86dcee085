// Package convert is the one place where Kubernetes objects become the
// scopeplane model: Services with their EndpointSlices, Namespaces,
// ProxyScopes, ReferenceGrants' consent and Gateway API's mesh routes
// (HTTPRoutes and GRPCRoutes). Everything downstream of it (catalog, translator, ADS server)
// reads only model types.
package convert

import (
	"time"

	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/xds/model"
)

// Service converts a Service and the EndpointSlices that belong to it (label
// kubernetes.io/service-name) into one model.Service. Endpoints of all slices
// are merged; each keeps the ports of its own slice, which is how a named
// target port resolves to different numbers in different slices. FQDN slices
// and addresses that do not parse as the slice's family are left out.
//
// Every string that can reach an Envoy resource is made valid UTF-8 (see
// text): the API server does not promise it for all of them (an endpoint's
// zone is free text), and a protobuf string that is not valid UTF-8 cannot
// be marshalled, which would keep the Service's resources from its proxies.
func Service(svc *corev1.Service, endpointSlices []*discoveryv1.EndpointSlice) *model.Service {
	out := &model.Service{
		Key:    model.Key{Namespace: svc.Namespace, Name: svc.Name},
		UID:    text(string(svc.UID)),
		Labels: svc.Labels,
	}
	if td := svc.Spec.TrafficDistribution; td != nil {
		out.TrafficDistribution = text(*td)
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		out.ExternalName = text(svc.Spec.ExternalName)
	}
	for _, p := range svc.Spec.Ports {
		sp := model.ServicePort{
			Name:     text(p.Name),
			Port:     p.Port,
			Protocol: protocol(p.Protocol),
		}
		if p.AppProtocol != nil {
			sp.AppProtocol = text(*p.AppProtocol)
		}
		switch {
		case p.TargetPort.Type == intstr.String:
			sp.TargetPortName = text(p.TargetPort.StrVal)
		case p.TargetPort.IntVal != 0:
			sp.TargetPort = p.TargetPort.IntVal
		default: // an unset targetPort defaults to the port itself
			sp.TargetPort = p.Port
		}
		out.Ports = append(out.Ports, sp)
	}
	if out.ExternalName != "" {
		return out
	}
	for _, slice := range endpointSlices {
		family, ok := addressFamily(slice.AddressType)
		if !ok {
			continue
		}
		ports := make([]model.EndpointPort, 0, len(slice.Ports))
		for _, p := range slice.Ports {
			if p.Port == nil {
				continue // a port with no number serves nothing
			}
			ep := model.EndpointPort{Port: *p.Port, Protocol: model.ProtocolTCP}
			if p.Name != nil {
				ep.Name = text(*p.Name)
			}
			if p.Protocol != nil {
				ep.Protocol = protocol(*p.Protocol)
			}
			ports = append(ports, ep)
		}
		for i := range slice.Endpoints {
			e := &slice.Endpoints[i]
			ready := e.Conditions.Ready == nil || *e.Conditions.Ready
			serving := ready
			if e.Conditions.Serving != nil {
				serving = *e.Conditions.Serving
			}
			terminating := e.Conditions.Terminating != nil && *e.Conditions.Terminating
			for _, addr := range e.Addresses {
				ip, err := netip.ParseAddr(addr)
				if err != nil || (family == model.IPv4) != ip.Is4() {
					continue
				}
				ep := model.Endpoint{
					Address:     ip.String(),
					Family:      family,
					Ports:       ports,
					Ready:       ready,
					Serving:     serving,
					Terminating: terminating,
				}
				if e.Zone != nil {
					ep.Zone = text(*e.Zone)
				}
				if e.NodeName != nil {
					ep.Node = text(*e.NodeName)
				}
				if h := e.Hints; h != nil {
					ep.ForZones = hinted(h.ForZones, func(z discoveryv1.ForZone) string { return z.Name })
					ep.ForNodes = hinted(h.ForNodes, func(n discoveryv1.ForNode) string { return n.Name })
				}
				out.Endpoints = append(out.Endpoints, ep)
			}
		}
	}
	out.Endpoints = dedupe(out.Endpoints)
	return out
}

// hinted returns the names of an endpoint's zone or Node hints, sorted and
// deduplicated (nil for none), so that equal hints compare equal.
func hinted[H any](hs []H, name func(H) string) []string {
	var out []string
	for _, h := range hs {
		out = append(out, text(name(h)))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// text returns s as valid UTF-8: each run of bytes that is not becomes
// U+FFFD (and s itself is returned when it needs no repair).
func text(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// dedupe sorts endpoints by address and merges the copies of one address with
// the same ports. An address can sit in two slices for a moment while the
// EndpointSlice controller rebalances them, and gRPC clients reject an EDS
// response that lists one address twice. The merged copy keeps the most
// usable conditions (ready over serving over neither).
func dedupe(eps []model.Endpoint) []model.Endpoint {
	slices.SortStableFunc(eps, func(a, b model.Endpoint) int {
		return cmp.Compare(a.Address, b.Address)
	})
	out := eps[:0]
	for _, e := range eps {
		if n := len(out); n > 0 && out[n-1].Address == e.Address && slices.Equal(out[n-1].Ports, e.Ports) {
			if rank(e) > rank(out[n-1]) {
				out[n-1] = e
			}
			continue
		}
		out = append(out, e)
	}
	return out
}

func rank(e model.Endpoint) int {
	switch {
	case e.Ready:
		return 2
	case e.Serving:
		return 1
	}
	return 0
}

func protocol(p corev1.Protocol) model.PortProtocol {
	if p == "" {
		return model.ProtocolTCP
	}
	return model.PortProtocol(p)
}

func addressFamily(t discoveryv1.AddressType) (model.AddressFamily, bool) {
	switch t {
	case discoveryv1.AddressTypeIPv4:
		return model.IPv4, true
	case discoveryv1.AddressTypeIPv6:
		return model.IPv6, true
	default:
		return 0, false
	}
}

// Protocol converts spec.protocol; anything but Delta is the default, SotW.
func Protocol(p xdsv1alpha1.Protocol) model.Protocol {
	if p == xdsv1alpha1.ProtocolDelta {
		return model.Delta
	}
	return model.SotW
}

// DefaultTransition is spec.protocolTransitionSeconds' default, for
// objects the API server has not defaulted (tests building them directly).
const DefaultTransition = 600 * time.Second

// Scope converts a ProxyScope into a model.Scope, with the protocol
// transition its status shows in progress. It fails only when a label
// selector cannot be parsed (the CRD schema cannot catch an unknown operator);
// the error names the selection.
func Scope(ps *xdsv1alpha1.ProxyScope) (*model.Scope, error) {
	out := &model.Scope{
		Key:                model.Key{Namespace: ps.Namespace, Name: ps.Name},
		Generation:         ps.Generation,
		Protocol:           Protocol(ps.Spec.Protocol),
		Listener:           model.Listener{Mode: model.ListenerMode(ps.Spec.Listener.Mode), VHDS: ps.Spec.Listener.VirtualHosts == xdsv1alpha1.VirtualHostsVHDS},
		ZonePriority:       ps.Spec.LocalityPriority == xdsv1alpha1.LocalityPrioritySameZone,
		AdmitByPeerAddress: ps.Spec.AdmitByPeerAddress,
	}
	for _, sa := range ps.Spec.Proxies {
		out.Proxies = append(out.Proxies, string(sa))
	}
	if ps.Spec.Listener.Port != nil {
		out.Listener.Port = *ps.Spec.Listener.Port
	}
	out.TransitionWindow = DefaultTransition
	if s := ps.Spec.ProtocolTransitionSeconds; s != nil {
		out.TransitionWindow = time.Duration(*s) * time.Second
	}
	// A transition in progress survives a restart or a change of leader:
	// the catalog takes it from the status for a scope it has not seen
	// (one it knows keeps its own). A transition from the protocol the spec
	// names again is over.
	if tr := ps.Status.ProtocolTransition; tr != nil && Protocol(tr.From) != out.Protocol {
		out.Transition = &model.Transition{From: Protocol(tr.From), Since: tr.Until.Add(-out.TransitionWindow), Until: tr.Until.Time}
	}
	for i, sel := range ps.Spec.Services {
		s := model.Selection{Namespace: string(sel.Namespace)}
		if s.Namespace == "" {
			s.Namespace = ps.Namespace
		}
		if sel.Names != nil {
			s.Names = make(map[string]struct{}, len(sel.Names))
			for _, n := range sel.Names {
				s.Names[string(n)] = struct{}{}
			}
		}
		var err error
		if sel.Selector != nil {
			if s.Selector, err = metav1.LabelSelectorAsSelector(sel.Selector); err != nil {
				return nil, fmt.Errorf("spec.services[%d].selector: %w", i, err)
			}
		}
		if sel.NamespaceSelector != nil {
			s.Namespace = ""
			if s.NamespaceSelector, err = metav1.LabelSelectorAsSelector(sel.NamespaceSelector); err != nil {
				return nil, fmt.Errorf("spec.services[%d].namespaceSelector: %w", i, err)
			}
		}
		out.Selections = append(out.Selections, s)
	}
	return out, nil
}

// Grants converts the ReferenceGrants of one namespace into the consent it
// gives to ProxyScopes of other namespaces: an entry of spec.from counts
// when it names group xds.scopeplane.dev, kind ProxyScope and a namespace,
// and an entry of spec.to when it names the core group and kind Service,
// optionally one Service by name. Each grant pairs all its from entries
// with all its to entries, as Gateway API defines it.
func Grants(grants []gatewayv1beta1.ReferenceGrant) model.Grants {
	return grantsFrom(grants, gatewayv1beta1.Group(xdsv1alpha1.GroupVersion.Group), "ProxyScope")
}

// RouteGrants converts the ReferenceGrants of one namespace into the
// consent it gives to routes of other namespaces to name its Services as
// backends, per route kind: entries of spec.from of group
// gateway.networking.k8s.io and kind HTTPRoute or GRPCRoute, paired with
// spec.to as Grants pairs them. A kind no grant names has no entry.
func RouteGrants(grants []gatewayv1beta1.ReferenceGrant) map[model.RouteKind]model.Grants {
	out := map[model.RouteKind]model.Grants{}
	for _, k := range []model.RouteKind{model.HTTPRoute, model.GRPCRoute} {
		if g := grantsFrom(grants, gatewayv1beta1.GroupName, gatewayv1beta1.Kind(k)); len(g) > 0 {
			out[k] = g
		}
	}
	return out
}

// grantsFrom is the consent the grants give to objects of group and kind
// in other namespaces, to name core Services: per namespace, nil for every
// Service or the set of the Services named.
func grantsFrom(grants []gatewayv1beta1.ReferenceGrant, group gatewayv1beta1.Group, kind gatewayv1beta1.Kind) model.Grants {
	out := model.Grants{}
	for i := range grants {
		spec := &grants[i].Spec
		var all bool
		var named []string
		for _, to := range spec.To {
			if to.Group != "" || to.Kind != "Service" {
				continue
			}
			if to.Name == nil || *to.Name == "" {
				all = true
			} else {
				named = append(named, string(*to.Name))
			}
		}
		if !all && len(named) == 0 {
			continue
		}
		for _, from := range spec.From {
			if from.Group != group || from.Kind != kind || from.Namespace == "" {
				continue
			}
			ns := string(from.Namespace)
			names, seen := out[ns]
			switch {
			case all || (seen && names == nil):
				out[ns] = nil
			default:
				if names == nil {
					names = map[string]struct{}{}
				}
				for _, n := range named {
					names[n] = struct{}{}
				}
				out[ns] = names
			}
		}
	}
	return out
}
