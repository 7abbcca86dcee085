package plugin

import (
	"context"
	"fmt"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/xds/csds"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/translate"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// explain says why a proxy holds or lacks a Service's resources: whether
// its scope selects the Service (and if not, which selection rejects it and
// why, by the same rule the control plane applies), which resources the
// Service becomes in the scope's listener mode, whether the scope serves
// them, whether the proxy asked for them (a by-name client such as gRPC's
// asks only for what it uses) and whether it holds what is served.
func (o *options) explain(ctx context.Context, args []string) error {
	if len(args) != 2 {
		return usageError("explain takes <proxy node id> <namespace>/<service>")
	}
	nodeID, svcArg := args[0], args[1]
	svcNS, svcName, ok := strings.Cut(svcArg, "/")
	if !ok || svcNS == "" || svcName == "" {
		return usageError(fmt.Sprintf("%q is not <namespace>/<service>", svcArg))
	}
	// With contents, a proxy's entry lists what it subscribes to.
	replicas, err := o.query(ctx, &statusv3.ClientStatusRequest{
		NodeMatchers: []*matcherv3.NodeMatcher{{NodeId: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: nodeID}}}},
	})
	if err != nil {
		return err
	}
	var proxy *statusv3.ClientConfig
	var at string
	streams := 0
	for _, r := range replicas {
		for _, cc := range r.resp.GetConfig() {
			if cc.GetNode() != nil {
				if proxy == nil {
					proxy, at = cc, r.name
				}
				streams++
			}
		}
	}
	if proxy == nil {
		return fmt.Errorf("no proxy with node id %q is connected to any of the %d replica(s) that answered: kubectl scopeplane proxy-status lists those that are", nodeID, len(replicas))
	}
	scopeKey := proxy.GetClientScope()
	o.printf("Proxy %q speaks %s to replica %s and joins ProxyScope %s.\n", nodeID,
		proxy.GetNode().GetMetadata().GetFields()[csds.ProtocolKey].GetStringValue(), at, scopeKey)
	if streams > 1 {
		o.printf("(%d streams carry this node id; this explains the first.)\n", streams)
	}

	cl, err := o.client()
	if err != nil {
		return err
	}
	scopeNS, scopeName, _ := strings.Cut(scopeKey, "/")
	var ps xdsv1alpha1.ProxyScope
	if err := cl.Get(ctx, types.NamespacedName{Namespace: scopeNS, Name: scopeName}, &ps); err != nil {
		return fmt.Errorf("ProxyScope %s: %w", scopeKey, err)
	}
	var svc corev1.Service
	if err := cl.Get(ctx, types.NamespacedName{Namespace: svcNS, Name: svcName}, &svc); apierrors.IsNotFound(err) {
		o.printf("Service %s does not exist, so no scope serves it.\n", svcArg)
		return nil
	} else if err != nil {
		return fmt.Errorf("reading Service %s: %w", svcArg, err)
	}
	var slices discoveryv1.EndpointSliceList
	if err := cl.List(ctx, &slices, client.InNamespace(svcNS), client.MatchingLabels{discoveryv1.LabelServiceName: svcName}); err != nil {
		return fmt.Errorf("EndpointSlices of %s: %w", svcArg, err)
	}
	var ns corev1.Namespace
	nsErr := cl.Get(ctx, types.NamespacedName{Name: svcNS}, &ns)
	if nsErr != nil && !apierrors.IsNotFound(nsErr) {
		return fmt.Errorf("namespace %s: %w", svcNS, nsErr)
	}

	scope, err := convert.Scope(&ps)
	if err != nil {
		o.printf("The ProxyScope is not accepted: %v.\n", err)
		return nil
	}
	ptrs := make([]*discoveryv1.EndpointSlice, len(slices.Items))
	for i := range slices.Items {
		ptrs[i] = &slices.Items[i]
	}
	msvc := convert.Service(&svc, ptrs)
	if !o.explainSelection(scope, msvc, ns.Labels, nsErr == nil) {
		return nil
	}
	if c := meta.FindStatusCondition(ps.Status.Conditions, xdsv1alpha1.ConditionAccepted); c != nil && c.Status != "True" {
		o.printf("The ProxyScope is not Accepted (%s): %s\n", c.Reason, c.Message)
	}

	served, err := o.served(ctx, at, scopeKey)
	if err != nil {
		return err
	}
	rt, err := o.routing(ctx, cl, msvc, scope.Key.Namespace)
	if err != nil {
		return err
	}
	frag := translate.RoutedService(msvc, translate.ProfileOf(scope), rt)
	px := proxyStateOf(proxy)
	n, asked := 0, 0
	frag.Each(func(t xdstype.Type, m proto.Message) {
		name := t.Info().NameOf(m)
		if o.explainResource(t, name, served[t][name], px) {
			asked++
		}
		n++
	})
	for _, vh := range frag.Hosts {
		// Envoy mode: the Service's virtual hosts are the scope's, named
		// after the route configuration of the listener port (see
		// translate.Profile). A delta proxy fetches them by VHDS; a SotW
		// proxy finds them inline.
		route, name := translate.HTTPListenerName(scope.Listener.Port), vh.GetName()
		if px.asked(xdstype.VirtualHost, name) {
			if o.explainResource(xdstype.VirtualHost, name, served[xdstype.VirtualHost][name], px) {
				asked++
			}
		} else if o.explainVirtualHost(name, route, served[xdstype.Route][route], px) {
			asked++
		}
		n++
	}
	if rt != nil {
		o.explainRoutes(msvc, rt, scope.Listener.Mode)
	}
	switch {
	case n == 0:
		o.printf("Service %s has no TCP port scopeplane translates, so it becomes no resource.\n", svcArg)
	case asked == 0:
		o.printf("Proxy %q asked for none of these resources, so it is sent none of them: a by-name client (such as gRPC's) asks only for the targets it uses.\n", nodeID)
	}
	return nil
}

// proxyState is what a proxy's CSDS entry says: per type, its state and
// what it subscribes to.
type proxyState struct {
	types    map[string]*statusv3.ClientConfig_GenericXdsConfig
	wildcard map[string]bool
	names    map[string]map[string]bool
}

func proxyStateOf(cc *statusv3.ClientConfig) proxyState {
	px := proxyState{types: map[string]*statusv3.ClientConfig_GenericXdsConfig{}, wildcard: map[string]bool{}, names: map[string]map[string]bool{}}
	for _, g := range cc.GetGenericXdsConfigs() {
		u := g.GetTypeUrl()
		switch g.GetName() {
		case "":
			px.types[u] = g
		case csds.Wildcard:
			px.wildcard[u] = true
		default:
			if px.names[u] == nil {
				px.names[u] = map[string]bool{}
			}
			px.names[u][g.GetName()] = true
		}
	}
	return px
}

// asked reports whether the proxy subscribes to a resource: by name, or
// with a wildcard of its type.
func (px proxyState) asked(t xdstype.Type, name string) bool {
	return px.wildcard[t.URL()] || px.names[t.URL()][name]
}

// notAsked is what explain says of a resource the proxy did not subscribe to.
const notAsked = "not sent to this proxy, which did not ask for it"

// explainSelection prints whether the scope selects the Service, and if
// not, why each selection does not.
func (o *options) explainSelection(scope *model.Scope, svc *model.Service, nsLabels map[string]string, nsKnown bool) bool {
	var why []string
	for i := range scope.Selections {
		reason := scope.Selections[i].Mismatch(svc, nsLabels, nsKnown)
		if reason == "" {
			o.printf("Service %s is selected by spec.services[%d].\n", svc.Key, i)
			return true
		}
		why = append(why, fmt.Sprintf("  spec.services[%d]: %s", i, reason))
	}
	o.printf("Service %s is not selected by ProxyScope %s, so no proxy of the scope receives it:\n%s\n",
		svc.Key, scope.Key, strings.Join(why, "\n"))
	return false
}

// servedResource is one resource the scope serves.
type servedResource struct {
	version string
	body    *statusv3.ClientConfig_GenericXdsConfig
}

// served returns what the scope serves on the proxy's replica, by type and name.
func (o *options) served(ctx context.Context, replicaName, scopeKey string) ([xdstype.Count]map[string]*servedResource, error) {
	var out [xdstype.Count]map[string]*servedResource
	for t := range out {
		out[t] = map[string]*servedResource{}
	}
	replicas, err := o.query(ctx, &statusv3.ClientStatusRequest{NodeMatchers: scopeMatcher(scopeKey)})
	if err != nil {
		return out, err
	}
	for _, r := range replicas {
		if r.name != replicaName {
			continue
		}
		for _, cc := range r.resp.GetConfig() {
			if cc.GetNode() != nil {
				continue
			}
			for _, g := range cc.GetGenericXdsConfigs() {
				if t, ok := xdstype.ByURL(g.GetTypeUrl()); ok && g.GetName() != "" {
					out[t][g.GetName()] = &servedResource{version: g.GetVersionInfo(), body: g}
				}
			}
		}
	}
	return out, nil
}

// explainResource prints what the proxy has of one resource, and reports
// whether the proxy asked for it.
func (o *options) explainResource(t xdstype.Type, name string, s *servedResource, px proxyState) bool {
	asked := px.asked(t, name)
	switch {
	case s == nil && !asked:
		o.printf("  %s %s: not served by the scope yet (its snapshot has not caught up with the Service), and %s\n", t, name, notAsked)
	case s == nil:
		o.printf("  %s %s: not served by the scope yet (its snapshot has not caught up with the Service)\n", t, name)
	case !asked:
		o.printf("  %s %s: served at version %s; %s\n", t, name, s.version, notAsked)
	default:
		o.printf("  %s %s: served at version %s; %s\n", t, name, s.version, proxyHolds(px.types[t.URL()]))
	}
	return asked
}

func (o *options) explainVirtualHost(vhost, route string, s *servedResource, px proxyState) bool {
	asked := px.asked(xdstype.Route, route)
	if s == nil {
		o.printf("  RDS %s (virtual host %s): the scope serves no route configuration %s\n", route, vhost, route)
		return asked
	}
	holds := notAsked
	if asked {
		holds = proxyHolds(px.types[xdstype.Route.URL()])
	}
	var rc routev3.RouteConfiguration
	if err := s.body.GetXdsConfig().UnmarshalTo(&rc); err == nil {
		for _, vh := range rc.GetVirtualHosts() {
			if vh.GetName() == vhost {
				o.printf("  RDS %s, virtual host %s: served at version %s; %s\n", route, vhost, s.version, holds)
				return asked
			}
		}
	}
	o.printf("  RDS %s: served at version %s without virtual host %s (its snapshot has not caught up with the Service)\n", route, s.version, vhost)
	return asked
}

// proxyHolds says whether a proxy that asked for a resource holds its
// served version. The control plane tracks ACKs per type and version, not
// per resource: a proxy in sync on a type was sent, and accepted, every
// resource of the type it asks for.
func proxyHolds(g *statusv3.ClientConfig_GenericXdsConfig) string {
	if g == nil {
		return "the proxy asked for it but reports nothing for this type"
	}
	switch g.GetConfigStatus() {
	case statusv3.ConfigStatus_SYNCED:
		return "the proxy asked for it and is in sync on this type, so it holds this version (ACKs are tracked per type and version, not per resource)"
	case statusv3.ConfigStatus_STALE:
		return fmt.Sprintf("the proxy has not ACKed the type's current version yet (it ACKed %s)", g.GetVersionInfo())
	case statusv3.ConfigStatus_ERROR:
		return fmt.Sprintf("the proxy rejects the type: %s", g.GetErrorState().GetDetails())
	default:
		return "the proxy has not answered a response of this type yet"
	}
}

func (o *options) client() (client.Client, error) {
	cfg, err := o.restConfig()
	if err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme.Scheme})
}
