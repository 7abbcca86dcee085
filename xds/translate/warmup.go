package translate

import (
	"slices"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"
)

// WarmUpPath is the path of a warm-up entry: exact "/", which no gRPC call
// has (a call's path is "/<service>/<method>"), so the entry never matches.
const WarmUpPath = "/"

// WarmUp returns what to serve of a ProxylessGRPC Service's translation
// before final, when final's route configurations name clusters that
// served's (what the scope's clients were last sent) do not: final with
// served's route configurations, to each of which one entry per such
// cluster is appended that no call matches (WarmUpPath). It reports
// whether any was appended; when none was, final can be served at once.
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
// A route configuration final has and served has not (a new port) is
// final's: no call was routed by it before. served and final are not
// modified; the result shares what it does not change with them.
func WarmUp(served, final *Fragment) (Fragment, bool) {
	out := *final
	out.Routes = slices.Clone(final.Routes)
	added := false
	for i, rc := range final.Routes {
		j, found := slices.BinarySearchFunc(served.Routes, rc.GetName(), func(r *routev3.RouteConfiguration, name string) int {
			switch {
			case r.GetName() < name:
				return -1
			case r.GetName() > name:
				return 1
			}
			return 0
		})
		if !found {
			continue
		}
		was := served.Routes[j]
		had := routeClusters(was)
		var fresh []string
		for name := range routeClusters(rc) {
			if _, ok := had[name]; !ok {
				fresh = append(fresh, name)
			}
		}
		if len(fresh) == 0 {
			out.Routes[i] = was
			continue
		}
		added = true
		slices.Sort(fresh)
		warm := proto.Clone(was).(*routev3.RouteConfiguration)
		for _, vh := range warm.GetVirtualHosts() {
			for _, name := range fresh {
				vh.Routes = append(vh.Routes, warmUpEntry(name))
			}
		}
		out.Routes[i] = warm
	}
	return out, added
}

// routeClusters is the set of clusters a route configuration's entries
// send calls to.
func routeClusters(rc *routev3.RouteConfiguration) map[string]struct{} {
	out := map[string]struct{}{}
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			a := r.GetRoute()
			if name := a.GetCluster(); name != "" {
				out[name] = struct{}{}
			}
			for _, w := range a.GetWeightedClusters().GetClusters() {
				out[w.GetName()] = struct{}{}
			}
		}
	}
	return out
}

// warmUpEntry is an entry that no call matches, naming a cluster.
func warmUpEntry(cluster string) *routev3.Route {
	return &routev3.Route{
		Name:  "warm-up",
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: WarmUpPath}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
		}},
	}
}
