package snapshot

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/cost"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// locations are where the test's proxies run: nowhere known, in a zone, on
// a Node (alone and with its zone), in a zone no endpoint is in.
var locations = []model.Location{
	{},
	{Zone: "z0"}, {Zone: "z1"}, {Zone: "z9"},
	{Node: "n0"},
	{Zone: "z0", Node: "n0"}, {Zone: "z1", Node: "n1"}, {Zone: "z0", Node: "n1"},
}

// TestPlaceViewsAreExactUnderRandomChanges drives a real catalog with
// Services whose endpoints move between zones and Nodes, gain and lose
// hints, and scopes that turn zone priorities on and off, and checks after
// every build that each location's view serves exactly what the catalog
// says that location sees (its Node's view, else its zone's, else the
// scope's), that the incrementally kept type versions and SotW bytes of
// every view equal the ones computed from scratch, that the scope's version
// is the same from everywhere and moves when any view does, and that the
// change log names every assignment whose version a location saw move.
func TestPlaceViewsAreExactUnderRandomChanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	cat := catalog.New()
	store := NewStore()
	b := NewBuilder(cat, store, 0)
	sc := &model.Scope{Key: key, Protocol: model.Delta, Listener: model.Listener{Mode: model.ListenerProxylessGRPC},
		Selections: []model.Selection{{Namespace: "shop"}}}
	cat.UpsertScope(sc)
	held := map[model.Location]map[string]string{} // location → name → version seen
	clusters := map[string]string{}                // name → cluster version
	prevRev, prevVersion := uint64(0), ""
	services := map[model.Key]*model.Service{}
	for step := range 400 {
		switch op := rng.IntN(10); {
		case op < 6:
			svc := randomService(rng)
			services[svc.Key] = svc
			cat.UpsertService(svc)
		case op < 8:
			// The same endpoints, another cluster: assignments must follow it.
			for _, old := range services {
				svc := *old
				svc.Ports = []model.ServicePort{old.Ports[0]}
				svc.Ports[0].AppProtocol = map[string]string{"": "grpc", "grpc": ""}[old.Ports[0].AppProtocol]
				services[svc.Key] = &svc
				cat.UpsertService(&svc)
				break
			}
		case op < 9:
			k := model.Key{Namespace: "shop", Name: fmt.Sprint("s", rng.IntN(6))}
			delete(services, k)
			cat.DeleteService(k)
		default:
			next := *sc
			next.ZonePriority = !sc.ZonePriority
			sc = &next
			cat.UpsertScope(sc)
		}
		b.Apply(cat.Take())
		snap := store.Get(key)
		res, _ := cat.Resources(key)
		placed := cat.Places(key)
		var version string
		var rev uint64
		moved := false
		now := map[string]string{}
		snap.Read(func(v View) { v.All(xdstype.Cluster, func(r *Resource) { now[r.Name] = r.Version }) })
		for _, loc := range locations {
			snap.ReadFrom(loc, func(v View) {
				rev = v.Rev()
				if version == "" {
					version = v.Version()
				} else if v.Version() != version {
					t.Fatalf("step %d: the scope's version is %s from %+v, %s from elsewhere", step, v.Version(), loc, version)
				}
				checkView(t, step, loc, v, res, placed)
				changed := map[string]bool{}
				logged := v.ChangedSince(prevRev, xdstype.Endpoint, func(n string) { changed[n] = true })
				seen := map[string]string{}
				v.All(xdstype.Endpoint, func(r *Resource) { seen[r.Name] = r.Version })
				for name, ver := range seen {
					old, ok := held[loc][name]
					moved = moved || old != ver
					if logged && ok && old != ver && !changed[name] {
						t.Fatalf("step %d: %s moved from %s to %s at %+v, and the log does not say so", step, name, old, ver, loc)
					}
					if c, was := clusters[name]; ok && was && c != now[name] && old == ver {
						t.Fatalf("step %d: cluster %s changed and its assignment at %+v kept version %s", step, name, loc, ver)
					}
				}
				moved = moved || len(seen) != len(held[loc])
				held[loc] = seen
			})
		}
		if moved && version == prevVersion {
			t.Fatalf("step %d: assignments moved and the scope's version stayed %s", step, version)
		}
		prevRev, prevVersion, clusters = rev, version, now
	}
}

// randomService is one of six Services with up to four endpoints in zones
// z0, z1 or none, on Nodes n0 to n2, hinted for their zone and Node or not.
func randomService(rng *rand.Rand) *model.Service {
	svc := &model.Service{
		Key:   model.Key{Namespace: "shop", Name: fmt.Sprint("s", rng.IntN(6))},
		Ports: []model.ServicePort{{Name: "grpc", Port: 9000, Protocol: model.ProtocolTCP, TargetPort: 9000}},
	}
	zoneHints, nodeHints := rng.IntN(3) == 0, rng.IntN(4) == 0
	if rng.IntN(4) == 0 {
		svc.TrafficDistribution = "PreferClose"
	}
	for i := range rng.IntN(5) {
		ep := model.Endpoint{
			Address: fmt.Sprintf("10.0.0.%d", i+1), Family: model.IPv4, Ready: rng.IntN(4) > 0, Serving: true,
			Ports: []model.EndpointPort{{Name: "grpc", Port: 9000, Protocol: model.ProtocolTCP}},
			Zone:  []string{"", "z0", "z1"}[rng.IntN(3)],
			Node:  fmt.Sprint("n", rng.IntN(3)),
		}
		if zoneHints && ep.Zone != "" {
			ep.ForZones = []string{ep.Zone}
		}
		if nodeHints {
			ep.ForNodes = []string{ep.Node}
		}
		svc.Endpoints = append(svc.Endpoints, ep)
	}
	return svc
}

// checkView compares a view's assignments with the catalog's, looked up as
// a proxy at loc sees them, and its type version and SotW bytes with the
// ones its resources give.
func checkView(t *testing.T, step int, loc model.Location, v View, res catalog.Set, placed catalog.Placed) {
	t.Helper()
	node, zone := loc.Places()
	var digest uint64
	bytes := 0
	n := 0
	v.All(xdstype.Endpoint, func(r *Resource) {
		n++
		want := res[xdstype.Endpoint][r.Name]
		if m, ok := placed[zone][r.Name]; ok {
			want = m
		}
		if m, ok := placed[node][r.Name]; ok {
			want = m
		}
		value, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Value()) != string(value) {
			t.Fatalf("step %d: %s at %+v is not what the catalog says a proxy there sees", step, r.Name, loc)
		}
		if g := v.Get(xdstype.Endpoint, r.Name); g != r {
			t.Fatalf("step %d: Get and All disagree on %s at %+v", step, r.Name, loc)
		}
		digest ^= nameDigest(r.Name, r.Version)
		bytes += cost.SotWEntry(r.Size)
	})
	if n != len(res[xdstype.Endpoint]) || n != v.Len(xdstype.Endpoint) {
		t.Fatalf("step %d: %d assignments at %+v, the catalog holds %d, Len says %d", step, n, loc, len(res[xdstype.Endpoint]), v.Len(xdstype.Endpoint))
	}
	if got, want := v.TypeVersion(xdstype.Endpoint), DigestVersion(digest); got != want {
		t.Fatalf("step %d: type version %s at %+v, its assignments give %s", step, got, loc, want)
	}
	if got := v.SotWBytes(xdstype.Endpoint); got != bytes {
		t.Fatalf("step %d: SotW bytes %d at %+v, its assignments give %d", step, got, loc, bytes)
	}
}
