package translate

import (
	"bytes"
	"cmp"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

var update = flag.Bool("update", false, "rewrite testdata/*.out.yaml from the translator's output and delete .out.yaml files that have no .in.yaml")

// goldenCases returns the golden case names, from testdata/*.in.yaml.
func goldenCases(t *testing.T) []string {
	t.Helper()
	ins, err := filepath.Glob(filepath.Join("testdata", "*.in.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ins) == 0 {
		t.Fatal("no testdata/*.in.yaml")
	}
	cases := make([]string, len(ins))
	for i, in := range ins {
		cases[i] = strings.TrimSuffix(filepath.Base(in), ".in.yaml")
	}
	return cases
}

func loadCase(t *testing.T, name string) (*model.Scope, []*model.Service) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name+".in.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	scope, services, err := parseInput(data)
	if err != nil {
		t.Fatalf("%s.in.yaml: %v", name, err)
	}
	return scope, services
}

// TestGolden translates every testdata/<case>.in.yaml and compares the
// rendered resources with <case>.out.yaml; -update rewrites them.
func TestGolden(t *testing.T) {
	cases := goldenCases(t)
	if *update {
		outs, err := filepath.Glob(filepath.Join("testdata", "*.out.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for _, out := range outs {
			if _, err := os.Stat(strings.TrimSuffix(out, ".out.yaml") + ".in.yaml"); os.IsNotExist(err) {
				t.Logf("removing stale %s", out)
				if err := os.Remove(out); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, name := range cases {
		t.Run(name, func(t *testing.T) {
			scope, services := loadCase(t, name)
			res := Translate(scope, services)
			if err := validateAll(res); err != nil {
				t.Errorf("ValidateAll:\n%v", err)
			}
			if err := checkInvariants(scope, res); err != nil {
				t.Errorf("invariants:\n%v", err)
			}
			for _, svc := range services {
				frag := Service(svc, ProfileOf(scope))
				if got := Endpoints(svc, scope.Listener.Mode); !equalMessages(got, frag.Endpoints) {
					t.Errorf("%v: Endpoints differs from Service(...).Endpoints", svc.Key)
				}
			}
			got, err := render(res)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", name+".out.yaml")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./xds/translate -run TestGolden -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from the translator's output (run with -update if the change is intended):\n%s", path, firstDiff(want, got))
			}
		})
	}
}

// TestDeterministic translates every golden input in many shuffled orders
// and requires byte-equal resources, and an untouched input.
func TestDeterministic(t *testing.T) {
	for _, name := range goldenCases(t) {
		t.Run(name, func(t *testing.T) {
			scope, services := loadCase(t, name)
			before := cloneServices(services)
			want, err := wire(Translate(scope, services))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(before, services) {
				t.Fatal("Translate modified its input")
			}
			r := rand.New(rand.NewPCG(1, uint64(len(name))))
			for i := range 25 {
				got, err := wire(Translate(scope, shuffled(r, services)))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("shuffle %d: output differs from the unshuffled input's", i)
				}
			}
		})
	}
}

// TestAssembleDoesNotModifyFragments checks that resolving a short-name
// conflict copies the virtual host instead of editing a fragment that other
// scopes share.
func TestAssembleDoesNotModifyFragments(t *testing.T) {
	a := &model.Service{Key: model.Key{Namespace: "a", Name: "web"}, Ports: []model.ServicePort{{Name: "http", Port: 80}}}
	b := &model.Service{Key: model.Key{Namespace: "b", Name: "web"}, Ports: []model.ServicePort{{Name: "http", Port: 80}}}
	fa, fb := Service(a, Profile{Mode: model.ListenerEnvoy}), Service(b, Profile{Mode: model.ListenerEnvoy})
	snapshot := []proto.Message{proto.Clone(fa.Hosts[0]), proto.Clone(fb.Hosts[0])}

	res := AssembleScope(&model.Scope{Key: model.Key{Namespace: "a", Name: "s"}, Listener: model.Listener{Mode: model.ListenerEnvoy, Port: 8080}}, []*Fragment{&fa, &fb})

	if !proto.Equal(snapshot[0], fa.Hosts[0]) || !proto.Equal(snapshot[1], fb.Hosts[0]) {
		t.Fatal("AssembleScope modified a fragment")
	}
	domains := map[string][]string{}
	for _, vh := range res.VirtualHosts {
		domains[vh.GetName()] = vh.GetDomains()
	}
	own, other := "http-8080/web.a:80", "http-8080/web.b:80"
	if !slices.Contains(domains[own], "web") || !slices.Contains(domains[own], "web:80") {
		t.Errorf("the scope's own namespace should keep the short name: %v", domains[own])
	}
	if slices.Contains(domains[other], "web") || slices.Contains(domains[other], "web:80") || !slices.Contains(domains[other], "web.b:80") {
		t.Errorf("the other namespace should lose only the short name: %v", domains[other])
	}
}

// TestAssembleServesTheFragmentsVirtualHosts checks that a scope serves
// the virtual hosts of fragments translated for its listener port as they
// are, rather than a copy of each per scope, and names those of fragments
// translated for another port (or none) after its own.
func TestAssembleServesTheFragmentsVirtualHosts(t *testing.T) {
	svc := &model.Service{Key: model.Key{Namespace: "a", Name: "web"}, Ports: []model.ServicePort{{Name: "http", Port: 80}}}
	sc := &model.Scope{Key: model.Key{Namespace: "a", Name: "s"}, Listener: model.Listener{Mode: model.ListenerEnvoy, Port: 8080}}
	for _, p := range []Profile{ProfileOf(sc), {Mode: model.ListenerEnvoy}, {Mode: model.ListenerEnvoy, Port: 9090}} {
		f := Service(svc, p)
		res := AssembleScope(sc, []*Fragment{&f})
		if len(res.VirtualHosts) != 1 || res.VirtualHosts[0].GetName() != "http-8080/web.a:80" {
			t.Fatalf("profile %+v: virtual hosts %v, want one named http-8080/web.a:80", p, res.VirtualHosts)
		}
		if shared := res.VirtualHosts[0] == f.Hosts[0]; shared != (p.Port == 8080) {
			t.Errorf("profile %+v: the scope serves the fragment's own virtual host: %v", p, shared)
		}
	}
}

// TestDottedNames checks the general conflict path: names Kubernetes would
// refuse (with dots) can make longer domains collide, and still no domain
// may appear twice.
func TestDottedNames(t *testing.T) {
	port := []model.ServicePort{{Name: "http", Port: 80}}
	services := []*model.Service{
		{Key: model.Key{Namespace: "c", Name: "a.b"}, Ports: port},
		{Key: model.Key{Namespace: "b.c", Name: "a"}, Ports: port},
	}
	scope := &model.Scope{Key: model.Key{Namespace: "x", Name: "s"}, Listener: model.Listener{Mode: model.ListenerEnvoy, Port: 80}}
	res := Translate(scope, services)
	if err := checkInvariants(scope, res); err != nil {
		t.Fatal(err)
	}
	for _, vh := range res.VirtualHosts {
		if slices.Contains(vh.GetDomains(), "a.b.c") || slices.Contains(vh.GetDomains(), "a.b.c:80") {
			t.Errorf("%s keeps the ambiguous domain a.b.c: %v", vh.GetName(), vh.GetDomains())
		}
	}
}

// TestRules pins the translation rules directly, independent of the
// golden files, so a wrongly regenerated golden cannot hide a broken rule.
func TestRules(t *testing.T) {
	ep := func(addr string, ready, serving bool, zone string, port int32) model.Endpoint {
		return model.Endpoint{Address: addr, Ready: ready, Serving: serving, Terminating: !ready, Zone: zone,
			Ports: []model.EndpointPort{{Name: "http", Port: port, Protocol: model.ProtocolTCP}}}
	}
	svc := &model.Service{
		Key: model.Key{Namespace: "ns", Name: "web"},
		Ports: []model.ServicePort{
			{Name: "http", Port: 80, Protocol: model.ProtocolTCP, TargetPortName: "web"},
			{Name: "dns", Port: 53, Protocol: model.ProtocolUDP},
			{Name: "sctp", Port: 99, Protocol: model.ProtocolSCTP},
		},
		Endpoints: []model.Endpoint{
			ep("10.0.0.2", true, true, "z2", 8080),
			ep("10.0.0.1", false, true, "z1", 8081), // a different slice resolved the named port differently
			ep("fd00::1", false, false, "z1", 8080),
			ep("fd00::2", true, true, "z1", 8080),
		},
	}
	frag := Service(svc, Profile{Mode: model.ListenerEnvoy})
	if len(frag.Clusters) != 1 || frag.Clusters[0].GetName() != "ns/web:80" {
		t.Fatalf("want only the TCP port's cluster ns/web:80, got %v", frag.Clusters)
	}
	cla := frag.Endpoints[0]
	got := map[string]string{}
	for _, loc := range cla.GetEndpoints() {
		for _, lb := range loc.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			got[fmt.Sprintf("%s/%s:%d", loc.GetLocality().GetZone(), sa.GetAddress(), sa.GetPortValue())] = fmt.Sprintf("%s@%d", lb.GetHealthStatus(), loc.GetPriority())
		}
	}
	// Serving-but-terminating endpoints are healthy, at a priority after
	// every ready one: used only when no ready endpoint is left.
	want := map[string]string{"z1/10.0.0.1:8081": "HEALTHY@1", "z1/fd00::2:8080": "HEALTHY@0", "z2/10.0.0.2:8080": "HEALTHY@0"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("endpoints = %v, want %v", got, want)
	}
	// With no ready endpoint left, the terminating ones are the first
	// priority, so they get the traffic, as kube-proxy routes it.
	draining := &model.Service{Key: svc.Key, Ports: svc.Ports[:1], Endpoints: []model.Endpoint{
		ep("10.0.0.1", false, true, "z1", 8081), ep("fd00::1", false, false, "z1", 8080), ep("10.0.0.3", false, true, "z2", 8081),
	}}
	locs := Service(draining, Profile{Mode: model.ListenerEnvoy}).Endpoints[0].GetEndpoints()
	if len(locs) != 2 || locs[0].GetPriority() != 0 || locs[1].GetPriority() != 0 {
		t.Errorf("only terminating endpoints: want two zones at priority 0, got %v", locs)
	}

	for _, ap := range []string{"grpc", "h2c", "http2", "kubernetes.io/h2c", "http", ""} {
		s := &model.Service{Key: model.Key{Namespace: "ns", Name: "g"}, Ports: []model.ServicePort{{Name: "p", Port: 9000, AppProtocol: ap}}}
		c := Service(s, Profile{Mode: model.ListenerProxylessGRPC}).Clusters[0]
		opts := &upstreamhttpv3.HttpProtocolOptions{}
		a := c.GetTypedExtensionProtocolOptions()[httpProtocolOptionsKey]
		h2 := a != nil && a.UnmarshalTo(opts) == nil && opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil
		if wantH2 := ap != "http" && ap != ""; h2 != wantH2 {
			t.Errorf("appProtocol %q: HTTP/2 upstream = %v, want %v", ap, h2, wantH2)
		}
	}

	empty := &model.Service{Key: model.Key{Namespace: "ns", Name: "e"}, Ports: []model.ServicePort{{Name: "p", Port: 80}}}
	if e := Endpoints(empty, model.ListenerEnvoy); len(e) != 1 || e[0].GetClusterName() != "ns/e:80" || len(e[0].GetEndpoints()) != 0 {
		t.Errorf("a Service without endpoints wants one empty assignment, got %v", e)
	}

	ext := &model.Service{Key: model.Key{Namespace: "ns", Name: "x"}, ExternalName: "api.example.com", Ports: []model.ServicePort{{Name: "https", Port: 443}}}
	for mode, typ := range map[model.ListenerMode]clusterv3.Cluster_DiscoveryType{
		model.ListenerEnvoy:         clusterv3.Cluster_STRICT_DNS,
		model.ListenerProxylessGRPC: clusterv3.Cluster_LOGICAL_DNS,
	} {
		f := Service(ext, Profile{Mode: mode})
		c := f.Clusters[0]
		sa := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		if c.GetType() != typ || c.GetDnsLookupFamily() != clusterv3.Cluster_V4_PREFERRED || sa.GetAddress() != "api.example.com" || sa.GetPortValue() != 443 || len(f.Endpoints) != 0 {
			t.Errorf("%s: external name cluster %v", mode, c)
		}
	}

	proxyless := Service(svc, Profile{Mode: model.ListenerProxylessGRPC})
	var names []string
	for _, l := range proxyless.Listeners {
		names = append(names, l.GetName())
	}
	if want := []string{"web.ns.svc.cluster.local:80", "web.ns:80"}; !reflect.DeepEqual(names, want) {
		t.Errorf("API listeners %v, want %v", names, want)
	}
	if len(proxyless.Routes) != 1 || proxyless.Routes[0].GetName() != "web.ns.svc.cluster.local:80" {
		t.Errorf("route configurations %v", proxyless.Routes)
	}
}

// TestBareDomains checks that domains without a port go to port 80, else
// to the lowest port, and never to two virtual hosts.
func TestBareDomains(t *testing.T) {
	for _, tc := range []struct {
		ports []int32
		bare  int32
	}{{[]int32{8080, 80, 443}, 80}, {[]int32{9090, 8080}, 8080}, {[]int32{443}, 443}} {
		svc := &model.Service{Key: model.Key{Namespace: "ns", Name: "web"}}
		for _, p := range tc.ports {
			svc.Ports = append(svc.Ports, model.ServicePort{Name: fmt.Sprint(p), Port: p})
		}
		for _, vh := range Service(svc, Profile{Mode: model.ListenerEnvoy}).Hosts {
			wantBare := vh.GetName() == fmt.Sprint("web.ns:", tc.bare)
			if got := slices.Contains(vh.GetDomains(), "web.ns"); got != wantBare {
				t.Errorf("ports %v: %s has bare domains = %v, want %v (%v)", tc.ports, vh.GetName(), got, wantBare, vh.GetDomains())
			}
			if want := 4 + 4*btoi(wantBare); len(vh.GetDomains()) != want {
				t.Errorf("ports %v: %s has %d domains, want %d", tc.ports, vh.GetName(), len(vh.GetDomains()), want)
			}
		}
	}
}

// TestLocalityWeight checks that a zone's ready endpoints and its
// terminating ones are two localities, at two priorities, each weighing its
// number of endpoints.
func TestLocalityWeight(t *testing.T) {
	svc := &model.Service{Key: model.Key{Namespace: "ns", Name: "web"}, Ports: []model.ServicePort{{Name: "http", Port: 80}}}
	add := func(addr, zone string, ready bool) {
		svc.Endpoints = append(svc.Endpoints, model.Endpoint{Address: addr, Zone: zone, Ready: ready, Serving: true, Terminating: !ready,
			Ports: []model.EndpointPort{{Name: "http", Port: 80, Protocol: model.ProtocolTCP}}})
	}
	add("10.0.0.1", "a", true)
	add("10.0.0.2", "a", false)
	add("10.0.0.3", "a", false)
	add("10.0.0.4", "b", false)
	add("10.0.0.5", "c", true)
	add("10.0.0.6", "c", true)
	got := map[string]uint32{}
	for _, loc := range Endpoints(svc, model.ListenerEnvoy)[0].GetEndpoints() {
		got[fmt.Sprintf("%s@%d", loc.GetLocality().GetZone(), loc.GetPriority())] = loc.GetLoadBalancingWeight().GetValue()
	}
	if want := map[string]uint32{"a@0": 1, "c@0": 2, "a@1": 2, "b@1": 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("locality weights %v, want %v", got, want)
	}
}

func equalMessages[T proto.Message](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// firstDiff shows the first differing lines of two texts, with context.
func firstDiff(want, got []byte) string {
	w, g := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	var b strings.Builder
	from := max(0, i-3)
	fmt.Fprintf(&b, "first difference at line %d:\n", i+1)
	for j := from; j < i+5; j++ {
		if j < len(w) {
			fmt.Fprintf(&b, "- %s\n", w[j])
		}
	}
	for j := from; j < i+5; j++ {
		if j < len(g) {
			fmt.Fprintf(&b, "+ %s\n", g[j])
		}
	}
	return b.String()
}

// TestVHDSScalesWithTheChange checks that in a Delta scope adding a Service
// changes only its own resources, its virtual host among them, and leaves
// the route configuration and every other virtual host byte for byte as
// they were; and that a SotW scope carries the same virtual hosts inline.
func TestVHDSScalesWithTheChange(t *testing.T) {
	services := make([]*model.Service, 0, 101)
	for i := range 101 {
		services = append(services, &model.Service{
			Key:   model.Key{Namespace: fmt.Sprint("ns-", i%7), Name: fmt.Sprint("svc-", i)},
			Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}},
		})
	}
	scope := &model.Scope{Key: model.Key{Namespace: "ns-0", Name: "s"}, Protocol: model.Delta,
		Listener: model.Listener{Mode: model.ListenerEnvoy, Port: 10080, VHDS: true}}
	before, after := Translate(scope, services[:100]), Translate(scope, services)
	changed := changedNames(t, before, after)
	added := services[100].Key
	want := []string{
		"CDS " + model.ClusterName(added, 80),
		"EDS " + model.ClusterName(added, 80),
		"VHDS http-10080/" + added.Name + "." + added.Namespace + ":80",
	}
	if !slices.Equal(changed, want) {
		t.Errorf("adding one Service to a Delta scope changed %v, want %v", changed, want)
	}

	sotw := *scope
	sotw.Protocol = model.SotW
	inline := Translate(&sotw, services)
	if !slices.Equal(changedNames(t, after, inline), []string{"RDS http-10080"}) {
		t.Errorf("the protocols' resources differ in more than the route configuration: %v", changedNames(t, after, inline))
	}
	// A SotW route configuration is its name plus the virtual hosts' bodies,
	// which is what lets a delta stream price it without building it.
	rc, err := proto.MarshalOptions{Deterministic: true}.Marshal(inline.Routes[0])
	if err != nil {
		t.Fatal(err)
	}
	size := protowire.SizeTag(1) + protowire.SizeBytes(len(inline.Routes[0].GetName()))
	for _, vh := range inline.VirtualHosts {
		size += protowire.SizeTag(2) + protowire.SizeBytes(proto.Size(vh))
	}
	if len(rc) != size {
		t.Errorf("the inline route configuration is %d bytes, its name and virtual hosts %d", len(rc), size)
	}
}

// TestVHDSChoice pins when an Envoy-mode scope uses VHDS: Delta scopes that
// ask for it, except while the SotW proxies of a change of protocol are
// still served.
func TestVHDSChoice(t *testing.T) {
	for _, tc := range []struct {
		protocol   model.Protocol
		vhds       bool
		transition *model.Transition
		want       bool
	}{
		{model.SotW, true, nil, false},
		{model.Delta, true, nil, true},
		{model.Delta, false, nil, false},
		{model.Delta, true, &model.Transition{From: model.SotW}, false},
		{model.SotW, true, &model.Transition{From: model.Delta}, false},
	} {
		sc := &model.Scope{Protocol: tc.protocol, Transition: tc.transition, Listener: model.Listener{Mode: model.ListenerEnvoy, Port: 80, VHDS: tc.vhds}}
		if got := VHDS(sc); got != tc.want {
			t.Errorf("VHDS(%s, asked %v, transition %v) = %v, want %v", tc.protocol, tc.vhds, tc.transition, got, tc.want)
		}
		res := Translate(sc, []*model.Service{{Key: model.Key{Namespace: "a", Name: "web"}, Ports: []model.ServicePort{{Port: 80}}}})
		if err := checkInvariants(sc, res); err != nil {
			t.Error(err)
		}
	}
}

// changedNames lists "<type> <name>" of every resource that differs
// between a and b, added or removed included, in type and name order.
func changedNames(t *testing.T, a, b Resources) []string {
	t.Helper()
	byName := func(r Resources) map[string][]byte {
		out := map[string][]byte{}
		r.Each(func(typ xdstype.Type, m proto.Message) {
			body, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			out[fmt.Sprint(typ.Info().Short, " ", typ.Info().NameOf(m))] = body
		})
		return out
	}
	x, y := byName(a), byName(b)
	var out []string
	for k, v := range y {
		if !bytes.Equal(x[k], v) {
			out = append(out, k)
		}
	}
	for k := range x {
		if _, ok := y[k]; !ok {
			out = append(out, k)
		}
	}
	order := map[string]int{}
	for typ := range xdstype.Count {
		order[typ.Info().Short] = int(typ)
	}
	slices.SortFunc(out, func(p, q string) int {
		tp, _, _ := strings.Cut(p, " ")
		tq, _, _ := strings.Cut(q, " ")
		return cmp.Or(cmp.Compare(order[tp], order[tq]), strings.Compare(p, q))
	})
	return out
}
