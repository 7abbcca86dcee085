package main

import (
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/translate"
)

// The world of the world-scale cells (bench-world) is made of Kubernetes
// objects in a real API server, so that what is measured includes the
// informer caches, the reconcilers and the status writes. Service i lives in
// namespace ns-(i mod 100) and carries the labels of a realistic
// deployment (app, tier, version) and two that the layouts select:
// team=team-(i mod 100), the namespace's team, and tenant=tenant-(i mod
// 10,000), which is always in the team's namespace. The Services have one to
// three ports (60% one, 30% two, 10% three) and two to four ready endpoints
// over three zones, as the EndpointSlice controller writes them; each was
// created with a kubectl last-applied annotation and has the managed fields
// the API server records.
//
// The Services are headless: the API server under test allocates cluster
// IPs from a small range, and no scopeplane resource depends on the
// cluster IP (the object is the same size).
const (
	worldNamespaces = 100
	worldTeams      = worldNamespaces
	worldTenants    = 10000
	// worldShape names the objects' shape in the cache of built worlds:
	// change it whenever worldService changes, so that no stale world is
	// reused.
	worldShape = 1
)

// The world-scale layouts.
const (
	// Teams is one scope per namespace selecting its team's Services:
	// 100 scopes of S/100 Services, ten proxies each.
	Teams Layout = "teams"
	// Tenants is 10,000 scopes of S/10,000 Services each (tenant=...),
	// one proxy each.
	Tenants Layout = "tenants"
)

func worldNamespace(i int) string { return fmt.Sprint("ns-", i%worldNamespaces) }

// worldService is Service i and its EndpointSlice, as they are created.
func worldService(i int) (*corev1.Service, *discoveryv1.EndpointSlice) {
	name := fmt.Sprint("svc-", i)
	ns := worldNamespace(i)
	svc := &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			"app":                          name,
			"app.kubernetes.io/part-of":    fmt.Sprint("team-", i%worldTeams),
			"tier":                         []string{"frontend", "backend", "data"}[i%3],
			"version":                      fmt.Sprint("v", i%4+1),
			"team":                         fmt.Sprint("team-", i%worldTeams),
			"tenant":                       fmt.Sprint("tenant-", i%worldTenants),
			"app.kubernetes.io/managed-by": "kubectl",
		}},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  map[string]string{"app": name},
		},
	}
	ports := []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}
	if i%10 >= 6 {
		ports = append(ports, corev1.ServicePort{Name: "grpc", Port: 9090, TargetPort: intstr.FromInt32(9090), Protocol: corev1.ProtocolTCP, AppProtocol: ptr.To("kubernetes.io/h2c")})
	}
	if i%10 == 9 {
		ports = append(ports, corev1.ServicePort{Name: "metrics", Port: 9100, TargetPort: intstr.FromString("metrics"), Protocol: corev1.ProtocolTCP})
	}
	svc.Spec.Ports = ports
	applied, _ := json.Marshal(svc)
	svc.Annotations = map[string]string{corev1.LastAppliedConfigAnnotation: string(applied) + "\n"}

	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-x7k2p", Labels: map[string]string{
			discoveryv1.LabelServiceName: name,
			discoveryv1.LabelManagedBy:   "endpointslice-controller.k8s.io",
			"app":                        name,
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range ports {
		target := p.TargetPort.IntVal
		if p.TargetPort.Type == intstr.String {
			target = 9100
		}
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Port: ptr.To(target), Protocol: ptr.To(corev1.ProtocolTCP), AppProtocol: p.AppProtocol})
	}
	for e := range 2 + i%3 {
		slice.Endpoints = append(slice.Endpoints, worldEndpoint(i, e, 0))
	}
	return svc, slice
}

// worldEndpoint is endpoint e of Service i after moves of its address.
func worldEndpoint(i, e, moves int) discoveryv1.Endpoint {
	n := i*4 + e + 1
	return discoveryv1.Endpoint{
		Addresses:  []string{endpointAddress(n + moves*(1<<21))},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		NodeName:   ptr.To(fmt.Sprint("node-", n%500)),
		Zone:       ptr.To(zoneName(e % numZones)),
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: worldNamespace(i), Name: fmt.Sprintf("svc-%d-%d", i, e)},
	}
}

// worldScope is scope k of a layout: team k, or tenant k, in its
// namespace, selecting its Services by label.
func worldScope(l Layout, k int, p model.Protocol) *xdsv1alpha1.ProxyScope {
	key, value := "team", fmt.Sprint("team-", k)
	if l == Tenants {
		key, value = "tenant", fmt.Sprint("tenant-", k)
	}
	return &xdsv1alpha1.ProxyScope{
		ObjectMeta: metav1.ObjectMeta{Namespace: worldNamespace(k), Name: value},
		Spec: xdsv1alpha1.ProxyScopeSpec{
			Protocol: xdsv1alpha1.Protocol(p),
			Services: []xdsv1alpha1.ServiceSelection{{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{key: value}}}},
			Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](listenerPort), VirtualHosts: xdsv1alpha1.VirtualHostsVHDS},
		},
	}
}

// worldScopes is how many scopes a layout has.
func worldScopes(l Layout) int {
	if l == Tenants {
		return worldTenants
	}
	return worldTeams
}

// apiWorld is the model of what the API server holds, built with the
// converters the reconcilers use, and the World the proxies are checked
// against.
type apiWorld struct {
	*World
	// byNS indexes the Services by namespace, which is where every scope
	// of a world cell selects: at 10,000 scopes over 100,000 Services,
	// World.Selected's scan of every Service for every scope would take the
	// driver minutes per event.
	byNS     map[string]map[model.Key]struct{}
	services map[model.Key]*corev1.Service
	slices   map[model.Key]*discoveryv1.EndpointSlice
	scopes   map[model.Key]*xdsv1alpha1.ProxyScope
}

func newAPIWorld(p WorldParams) *apiWorld {
	return &apiWorld{
		World:    &World{P: p, Services: map[model.Key]*model.Service{}},
		byNS:     map[string]map[model.Key]struct{}{},
		services: map[model.Key]*corev1.Service{}, slices: map[model.Key]*discoveryv1.EndpointSlice{},
		scopes: map[model.Key]*xdsv1alpha1.ProxyScope{},
	}
}

// setService records a Service and its slice as the API server holds them.
func (a *apiWorld) setService(svc *corev1.Service, slice *discoveryv1.EndpointSlice) {
	k := model.Key{Namespace: svc.Namespace, Name: svc.Name}
	a.services[k], a.slices[k] = svc, slice
	a.Services[k] = convert.Service(svc, []*discoveryv1.EndpointSlice{slice})
	if a.byNS[k.Namespace] == nil {
		a.byNS[k.Namespace] = map[model.Key]struct{}{}
	}
	a.byNS[k.Namespace][k] = struct{}{}
}

// selected is World.Selected through the namespace index.
func (a *apiWorld) selected(sc *model.Scope) []*model.Service {
	var out []*model.Service
	seen := map[string]bool{}
	for _, sel := range sc.Selections {
		if sel.NamespaceSelector != nil {
			return a.Selected(sc) // no world cell selects so
		}
		if seen[sel.Namespace] {
			continue
		}
		seen[sel.Namespace] = true
		for k := range a.byNS[sel.Namespace] {
			if svc := a.Services[k]; sc.Selects(svc, nil, false) {
				out = append(out, svc)
			}
		}
	}
	slices.SortFunc(out, func(x, y *model.Service) int { return x.Key.Compare(y.Key) })
	return out
}

// truths is truthsOf for a world cell: the truth of each of the views n
// proxies hold, translating again, from prev, only the views of the scopes
// redo names (all of them when prev is nil).
func (a *apiWorld) truths(n int, prev map[int]*Truth, redo func(*model.Scope) bool) (map[int]*Truth, error) {
	out := map[int]*Truth{}
	for i, v := range a.Views() {
		if i >= n {
			break
		}
		sc := a.Scopes[v.Scope]
		if prev != nil && !redo(sc) {
			out[i] = prev[i]
			continue
		}
		tr, err := truthOf(translate.Translate(sc, a.selected(sc)), sc, v.Loc)
		if err != nil {
			return nil, err
		}
		out[i] = tr
	}
	return out, nil
}

// setScope records a scope as the API server holds it; the World's scopes
// stay in the order of their index (the views', so the proxies').
func (a *apiWorld) setScope(ps *xdsv1alpha1.ProxyScope) error {
	sc, err := convert.Scope(ps)
	if err != nil {
		return err
	}
	a.scopes[sc.Key] = ps
	i := slices.IndexFunc(a.Scopes, func(s *model.Scope) bool { return s.Key == sc.Key })
	if i < 0 {
		a.Scopes = append(a.Scopes, sc)
	} else {
		a.Scopes[i] = sc
	}
	return nil
}
