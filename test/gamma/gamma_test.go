// Package gamma_test checks the translation of Gateway API mesh routes
// (GAMMA) against the Gateway API conformance suite's own mesh tests
// (sigs.k8s.io/gateway-api/conformance, tests/mesh): each test's manifests
// are converted and translated as the operator does, and each request the
// test makes is routed through the translated route configuration by a
// small route evaluator, then judged by what the suite's mesh client
// compares. The suite itself needs a sidecar data plane in the client's
// Pod; its manifests and stated expectations are inputs here.
package gamma_test

import (
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"

	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/translate"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// envoyPasses are the mesh tests whose every case passes on Envoy scopes,
// and envoyExceptions the cases of them that do not, with why: a test
// listed here that fails, or one not listed that passes, fails the test,
// so the list (also in docs/routes.md) cannot go stale.
var envoyPasses = []string{
	"MeshBasic",
	"MeshConsumerRoute",
	"MeshFrontend",
	"MeshGRPCRouteWeight",
	"MeshHTTPRoute303Redirect",
	"MeshHTTPRoute307Redirect",
	"MeshHTTPRoute308Redirect",
	"MeshHTTPRouteBackendRequestHeaderModifier",
	"MeshHTTPRouteMatching",
	"MeshHTTPRouteNamedRule",
	"MeshHTTPRouteQueryParamMatching",
	"MeshHTTPRouteRedirectHostAndStatus",
	"MeshHTTPRouteRedirectPath",
	"MeshHTTPRouteRedirectPort",
	"MeshHTTPRouteRequestHeaderModifier",
	"MeshHTTPRouteRewritePath",
	"MeshHTTPRouteSchemeRedirect",
	"MeshHTTPRouteSimpleSameNamespace",
	"MeshHTTPRouteWeight",
	"MeshPorts",
	"MeshTrafficSplit",
}

var envoyExceptions = map[string]map[string]string{
	"MeshFrontend": {
		"Send to pod IP": "a request to a Pod's address bypasses the Service, so no Service's routes apply; " +
			"a scope's Envoy listener has virtual hosts for Service names only and answers it 404",
	},
}

// proxylessTests are the mesh tests a proxyless gRPC client can make (path
// and header matches, weights); each must pass on ProxylessGRPC scopes.
var proxylessTests = []string{
	"MeshGRPCRouteWeight",
	"MeshHTTPRouteMatching",
	"MeshHTTPRouteWeight",
	"MeshTrafficSplit",
}

// envoyListenerPort is the port of the Envoy scopes' HTTP listener.
const envoyListenerPort = 10080

// grpcEchoPath is the method the suite's echo client calls for a grpc://
// request: Istio's EchoTestService.Echo.
const grpcEchoPath = "/proto.EchoTestService/Echo"

// result is how a test's cases fared in one listener mode.
type result struct {
	passed, total int
	failures      map[string]string // case → why
	refused       []string          // routes the converter refused, with the reasons
}

func TestMeshConformance(t *testing.T) {
	dir := conformanceDir(t)
	consts, err := readSuiteConsts(dir)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := readMeshTests(dir, consts)
	if err != nil {
		t.Fatal(err)
	}
	meshNS := consts["suite.MeshNamespace"]
	envoy := map[string]result{}
	proxyless := map[string]result{}
	for _, mt := range tests {
		w := &world{}
		for _, m := range append([]string{"mesh/manifests.yaml"}, mt.Manifests...) {
			if err := w.add(filepath.Join(dir, filepath.FromSlash(m))); err != nil {
				t.Fatalf("%s: %v", mt.ShortName, err)
			}
		}
		envoy[mt.ShortName] = run(w, &mt, meshNS, model.ListenerEnvoy)
		if slices.Contains(proxylessTests, mt.ShortName) {
			proxyless[mt.ShortName] = run(w, &mt, meshNS, model.ListenerProxylessGRPC)
		}
	}
	t.Log(table(tests, envoy, proxyless))

	known := map[string]bool{}
	for _, mt := range tests {
		known[mt.ShortName] = true
		r := envoy[mt.ShortName]
		except := envoyExceptions[mt.ShortName]
		switch claimed := slices.Contains(envoyPasses, mt.ShortName); {
		case claimed:
			for _, c := range sortedCases(r.failures) {
				if _, ok := except[c]; !ok {
					t.Errorf("Envoy: %s, claimed to pass, fails %q: %s", mt.ShortName, c, r.failures[c])
				}
			}
			for _, c := range sortedCases(except) {
				if _, ok := r.failures[c]; !ok {
					t.Errorf("Envoy: %s: the case %q, listed as failing, passes (or no longer exists): remove it from envoyExceptions and docs/routes.md", mt.ShortName, c)
				}
			}
		case r.passed == r.total:
			t.Errorf("Envoy: %s passes all its %d cases: add it to envoyPasses and to docs/routes.md", mt.ShortName, r.total)
		}
	}
	for _, name := range slices.Concat(envoyPasses, proxylessTests) {
		if !known[name] {
			t.Errorf("%s is not a mesh test of %s", name, conformanceModule)
		}
	}
	for _, name := range proxylessTests {
		r := proxyless[name]
		if r.total == 0 {
			t.Errorf("ProxylessGRPC: %s has no case", name)
		}
		for _, c := range sortedCases(r.failures) {
			t.Errorf("ProxylessGRPC: %s fails %q: %s", name, c, r.failures[c])
		}
	}
}

// run converts and translates a test's world for scopes of one listener
// mode, one scope per namespace a client of the test runs in, each
// selecting the mesh namespace's Services, and judges every case.
func run(w *world, mt *meshTest, meshNS string, mode model.ListenerMode) result {
	res := result{failures: map[string]string{}}
	c := catalog.New()
	c.SetCrossNamespace(catalog.CrossNamespaceAllow, false)
	for _, ns := range w.namespaces {
		c.UpsertNamespace(ns.Name, ns.Labels)
	}
	services := map[model.Key]*model.Service{}
	for _, s := range w.services {
		svc := convert.Service(s, nil)
		services[svc.Key] = svc
		c.UpsertService(svc)
	}
	var routes []*model.Route
	for _, hr := range w.httpRoutes {
		routes = append(routes, convert.HTTPRoute(hr))
	}
	for _, gr := range w.grpcRoutes {
		routes = append(routes, convert.GRPCRoute(gr))
	}
	for _, r := range routes {
		switch {
		case len(r.Parents) == 0:
			res.refused = append(res.refused, fmt.Sprintf("%s %s: no Service parent", r.Kind, r.Key))
		case r.Refused != "":
			res.refused = append(res.refused, fmt.Sprintf("%s %s: %s", r.Kind, r.Key, r.Refused))
		}
		c.UpsertRoute(r)
	}
	scopes := map[string]catalog.Set{}
	for _, cs := range mt.Cases {
		if _, ok := scopes[cs.Client]; ok {
			continue
		}
		key := model.Key{Namespace: cs.Client, Name: "mesh"}
		sc := &model.Scope{Key: key, Protocol: model.SotW, Listener: model.Listener{Mode: mode}, Selections: []model.Selection{{Namespace: meshNS}}}
		if mode == model.ListenerEnvoy {
			sc.Listener.Port = envoyListenerPort
		}
		c.UpsertScope(sc)
		c.Take()
		scopes[cs.Client], _ = c.Resources(key)
	}
	for _, cs := range mt.Cases {
		checks := []string{cs.Name}
		if mt.Weights != nil {
			checks = append(checks, "split of "+cs.Name)
		}
		res.total += len(checks)
		out, why := route(scopes[cs.Client], services, cs, mode)
		if why == "" {
			why = judge(w, cs.Want, out)
		}
		if why != "" {
			for _, name := range checks {
				res.failures[name] = why
			}
			continue
		}
		res.passed++
		if mt.Weights == nil {
			continue
		}
		if why := split(w, mt.Weights, out); why != "" {
			res.failures[checks[1]] = why
			continue
		}
		res.passed++
	}
	return res
}

// route sends a case's request through its scope's route configuration:
// an Envoy scope's HTTP listener's, or the one of the Service port a gRPC
// client dials, the Host's. why says what made it impossible, if anything.
func route(set catalog.Set, services map[model.Key]*model.Service, cs meshCase, mode model.ListenerMode) (out outcome, why string) {
	e := cs.Want
	req := request{host: e.Host, path: e.Path, method: e.Method, headers: map[string][]string{}}
	for k, v := range e.Headers {
		if strings.EqualFold(k, "host") {
			req.host = v
			continue
		}
		req.headers[strings.ToLower(k)] = append(req.headers[strings.ToLower(k)], v)
	}
	if e.Protocol == "grpc" {
		req.path, req.method = grpcEchoPath, "POST"
	}
	if req.path == "" {
		req.path = "/"
	}
	name := translate.HTTPListenerName(envoyListenerPort)
	if mode == model.ListenerProxylessGRPC {
		req.method = "POST" // every gRPC call is
		svc, port := dialed(req.host, cs.Client, services)
		if svc == nil {
			return out, fmt.Sprintf("a gRPC client dials %s: no such Service", req.host)
		}
		name = translate.GRPCRouteName(svc, port)
	}
	rc, ok := set[xdstype.Route][name].(*routev3.RouteConfiguration)
	if !ok {
		return out, fmt.Sprintf("the scope has no route configuration %s", name)
	}
	if err := rc.ValidateAll(); err != nil {
		return out, fmt.Sprintf("Envoy refuses the route configuration %s: %v", name, err)
	}
	out, err := evaluate(rc, req)
	if err != nil {
		return out, "cannot evaluate: " + err.Error()
	}
	for _, c := range slices.Sorted(maps.Keys(out.clusters)) {
		cl, ok := set[xdstype.Cluster][c].(*clusterv3.Cluster)
		if !ok {
			out.status = 503 // Envoy's answer for a cluster it does not have
			out.route += " to the unknown cluster " + c
			continue
		}
		if err := cl.ValidateAll(); err != nil {
			return out, fmt.Sprintf("Envoy refuses the cluster %s: %v", c, err)
		}
		if e.Protocol != "grpc" || mode != model.ListenerEnvoy {
			continue
		}
		// A gRPC server speaks HTTP/2 only: Envoy sending it HTTP/1.1
		// fails the call (Envoy answers 503 for the reset). A gRPC client
		// dials its backends in HTTP/2 whatever the cluster says.
		h2, err := upstreamHTTP2(cl)
		if err != nil {
			return out, "cannot evaluate: " + err.Error()
		}
		if !h2 {
			out.status = 503
			out.route += ", whose cluster " + c + " speaks HTTP/1.1 to a gRPC backend"
		}
	}
	return out, ""
}

// upstreamHTTP2 reports whether Envoy speaks HTTP/2 to a cluster's
// endpoints: explicitly, or as the downstream does (a gRPC call is HTTP/2).
func upstreamHTTP2(c *clusterv3.Cluster) (bool, error) {
	anyOpts, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if !ok {
		return false, nil
	}
	opts := &upstreamhttpv3.HttpProtocolOptions{}
	if err := anyOpts.UnmarshalTo(opts); err != nil {
		return false, fmt.Errorf("cluster %s: its HTTP protocol options: %w", c.GetName(), err)
	}
	switch p := opts.GetUpstreamProtocolOptions().(type) {
	case *upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_:
		return p.ExplicitHttpConfig.GetHttp2ProtocolOptions() != nil, nil
	case *upstreamhttpv3.HttpProtocolOptions_UseDownstreamProtocolConfig:
		return p.UseDownstreamProtocolConfig.GetHttp2ProtocolOptions() != nil, nil
	}
	return false, fmt.Errorf("cluster %s: the upstream protocol options %T are not evaluated", c.GetName(), opts.GetUpstreamProtocolOptions())
}

// dialed is the Service port a gRPC client dials for a host "svc[.ns]" and
// an optional port (80 by default), a short name resolving in the client's
// namespace.
func dialed(host, clientNS string, services map[model.Key]*model.Service) (*model.Service, int32) {
	name, portText, found := strings.Cut(host, ":")
	port := 80
	if found {
		p, err := strconv.Atoi(portText)
		if err != nil {
			return nil, 0
		}
		port = p
	}
	svc, ns, _ := strings.Cut(name, ".")
	if ns == "" {
		ns = clientNS
	}
	ns, _, _ = strings.Cut(ns, ".")
	return services[model.Key{Namespace: ns, Name: svc}], int32(port)
}

// clusterService is the Service of a cluster name, "<ns>/<name>:<port>"
// with "@<uid>" after it in ProxylessGRPC mode.
func clusterService(cluster string) (ns, name string) {
	cluster, _, _ = strings.Cut(cluster, "@")
	ns, rest, _ := strings.Cut(cluster, "/")
	name, _, _ = strings.Cut(rest, ":")
	return ns, name
}

// judge compares an outcome with a case's expectation as the suite's mesh
// client does (utils/echo/pod.go, compareRequest): the status among the
// expected ones; each response header's first value and the absent ones;
// the request headers the backend saw (values joined by ",") and the
// absent ones; and that every Pod that may answer has a name that starts
// with Backend (the suite needs several answers in a row to agree).
func judge(w *world, e expectation, out outcome) string {
	if !slices.Contains(e.StatusCodes, out.status) {
		return fmt.Sprintf("status %d, want %v (%s)", out.status, e.StatusCodes, out.route)
	}
	for k, v := range e.ResponseHeaders {
		if got := first(out.responseHeaders[strings.ToLower(k)]); got != v {
			return fmt.Sprintf("response header %s is %q, want %q (%s)", k, got, v, out.route)
		}
	}
	for _, k := range e.ResponseAbsent {
		if got, ok := out.responseHeaders[strings.ToLower(k)]; ok {
			return fmt.Sprintf("response header %s is %q, want none (%s)", k, got, out.route)
		}
	}
	for k, v := range e.BackendHeaders {
		got, ok := out.backendHeaders[strings.ToLower(k)]
		if !ok || strings.Join(got, ",") != v {
			return fmt.Sprintf("the backend sees %s: %q, want %q (%s)", k, got, v, out.route)
		}
	}
	for _, k := range e.BackendAbsent {
		if got, ok := out.backendHeaders[strings.ToLower(k)]; ok {
			return fmt.Sprintf("the backend sees %s: %q, want none (%s)", k, got, out.route)
		}
	}
	if e.Backend == "" {
		return ""
	}
	var pods []string
	for c := range out.clusters {
		pods = append(pods, w.pods(clusterService(c))...)
	}
	sort.Strings(pods)
	if len(pods) == 0 {
		return fmt.Sprintf("no Pod answers, want %s (%s)", e.Backend, out.route)
	}
	for _, p := range pods {
		if !strings.HasPrefix(p, e.Backend) {
			return fmt.Sprintf("answered by Pods of %v, want only %s (%s)", pods, e.Backend, out.route)
		}
	}
	return ""
}

func first(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

// split compares the share of requests each backend gets, the clusters'
// weights over their sum, with a weight test's expected split, by the
// prefix of the answering Pods' names.
func split(w *world, want map[string]float64, out outcome) string {
	var sum float64
	for _, wt := range out.clusters {
		sum += float64(wt)
	}
	got := map[string]float64{}
	for c, wt := range out.clusters {
		pods := w.pods(clusterService(c))
		key := c
		for k := range want {
			if len(pods) > 0 && !slices.ContainsFunc(pods, func(p string) bool { return !strings.HasPrefix(p, k) }) {
				key = k
			}
		}
		got[key] += float64(wt) / sum
	}
	for _, k := range sortedKeys(want, got) {
		if math.Abs(got[k]-want[k]) > 1e-9 {
			return fmt.Sprintf("the split is %v, want %v (%s)", got, want, out.route)
		}
	}
	return ""
}

func sortedKeys(ms ...map[string]float64) []string {
	var out []string
	for _, m := range ms {
		for k := range m {
			if !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}

// table renders the results: each test's passed cases per listener mode,
// whether it is claimed, and why each failing case fails.
func table(tests []meshTest, envoy, proxyless map[string]result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Gateway API %s mesh tests, translated:\n", conformanceModule)
	fmt.Fprintf(&b, "%-44s %-8s %-8s %s\n", "test", "Envoy", "claimed", "ProxylessGRPC")
	for _, mt := range tests {
		r := envoy[mt.ShortName]
		claimed := "no"
		if slices.Contains(envoyPasses, mt.ShortName) {
			claimed = "yes"
		}
		pl := "-"
		if p, ok := proxyless[mt.ShortName]; ok {
			pl = fmt.Sprintf("%d/%d", p.passed, p.total)
		}
		fmt.Fprintf(&b, "%-44s %-8s %-8s %s\n", mt.ShortName, fmt.Sprintf("%d/%d", r.passed, r.total), claimed, pl)
		for _, why := range r.refused {
			fmt.Fprintf(&b, "    refused: %s\n", why)
		}
		for _, c := range sortedCases(r.failures) {
			if why, ok := envoyExceptions[mt.ShortName][c]; ok {
				fmt.Fprintf(&b, "    Envoy %q (known: %s): %s\n", c, why, r.failures[c])
				continue
			}
			fmt.Fprintf(&b, "    Envoy %q: %s\n", c, r.failures[c])
		}
		for _, c := range sortedCases(proxyless[mt.ShortName].failures) {
			fmt.Fprintf(&b, "    ProxylessGRPC %q: %s\n", c, proxyless[mt.ShortName].failures[c])
		}
	}
	return b.String()
}

func sortedCases(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
