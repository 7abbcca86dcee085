package translate

import (
	"slices"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/model"
)

// warmUpName names a warm-up entry, which tells it from the route entries
// a warm-up keeps.
const warmUpName = "scopeplane.dev/warm-up"

// WarmUp returns what to serve of a ProxylessGRPC Service's translation
// before final, when final's route configurations name clusters that
// served's (what the scope's clients were last sent) do not route to:
// final with served's route entries, after which one entry per such
// cluster is appended that no call matches (NoCallPath). It reports
// whether it is needed (any such cluster; if none, final can be served at
// once) and whether any such cluster is added, one that served does not
// name even in a warm-up entry.
//
// A gRPC client builds a child balancer for every cluster its route
// configuration names, matched or not, once it has the cluster's CDS and
// EDS. grpc-go 1.85 installs a new route configuration's routes before it
// builds the children of the clusters they add (clientconn applies the
// config selector, then updates the balancer), and fails a call routed to
// such a cluster in between ("unknown cluster selected for RPC"). Served
// first, the warm-up has the client fetch and build the new clusters while
// every call still goes where it went; final, served after it, only moves
// calls to clusters the client has built.
//
// served may be a warm-up itself: its warm-up entries are replaced, not
// added to, so a warm-up names at most final's clusters. A route
// configuration final has and served has not (a new port) is final's: no
// call was routed by it before. The result routes to the Services of both
// (RoutesTo). served and final are not modified; the result shares what it
// does not change with them.
func WarmUp(served, final *Fragment) (warm Fragment, needed, added bool) {
	warm = *final
	warm.Routes = slices.Clone(final.Routes)
	warm.RoutesTo = mergeKeys(served.RoutesTo, final.RoutesTo)
	for i, rc := range final.Routes {
		j, found := slices.BinarySearchFunc(served.Routes, rc.GetName(), func(r *routev3.RouteConfiguration, name string) int {
			return strings.Compare(r.GetName(), name)
		})
		if !found {
			continue
		}
		was := served.Routes[j]
		routed, warming := routeClusters(was)
		var fresh []string
		wants, _ := routeClusters(rc)
		for name := range wants {
			if _, ok := routed[name]; !ok {
				fresh = append(fresh, name)
				needed = true
				if _, ok := warming[name]; !ok {
					added = true
				}
			}
		}
		if len(fresh) == 0 && len(warming) == 0 {
			warm.Routes[i] = was
			continue
		}
		slices.Sort(fresh)
		kept := proto.Clone(was).(*routev3.RouteConfiguration)
		for _, vh := range kept.GetVirtualHosts() {
			vh.Routes = slices.DeleteFunc(vh.Routes, isWarmUp)
			for _, name := range fresh {
				vh.Routes = append(vh.Routes, warmUpEntry(name))
			}
		}
		warm.Routes[i] = kept
	}
	return warm, needed, added
}

// routeClusters returns the clusters a route configuration's entries send
// calls to, and apart those only its warm-up entries name.
func routeClusters(rc *routev3.RouteConfiguration) (routed, warming map[string]struct{}) {
	routed, warming = map[string]struct{}{}, map[string]struct{}{}
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			into := routed
			if isWarmUp(r) {
				into = warming
			}
			a := r.GetRoute()
			if name := a.GetCluster(); name != "" {
				into[name] = struct{}{}
			}
			for _, w := range a.GetWeightedClusters().GetClusters() {
				into[w.GetName()] = struct{}{}
			}
		}
	}
	for name := range routed {
		delete(warming, name)
	}
	return routed, warming
}

func isWarmUp(r *routev3.Route) bool {
	return r.GetName() == warmUpName && r.GetMatch().GetPath() == NoCallPath
}

// warmUpEntry is a warm-up's entry naming a cluster, which no call matches.
func warmUpEntry(cluster string) *routev3.Route {
	r := noCallTo(cluster)
	r.Name = warmUpName
	return r
}

// mergeKeys returns the sorted union of two sorted lists.
func mergeKeys(a, b []model.Key) []model.Key {
	if len(a) == 0 {
		return b
	}
	out := slices.Concat(a, b)
	slices.SortFunc(out, model.Key.Compare)
	return slices.Compact(out)
}
