package server

import (
	"cmp"
	"slices"
	"strconv"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"

	"github.com/scopeplane/scopeplane/xds/cost"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

type deltaStream = grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]

// deltaType is a delta stream's state for one type: the shared
// subscription plus the responses awaiting an answer.
type deltaType struct {
	subscription
	// inflight holds, per unanswered nonce, what its response changed, to
	// undo it on a NACK; undoing counts the names they hold.
	inflight map[string]inflight
	undoing  int
	// otherLast is the nonce of the last response that SotW would have
	// answered with a response of the type too: while it is unanswered, a
	// SotW stream would have its response unanswered (see sotw.version).
	otherLast string
}

// otherPending reports whether the SotW stream the delta one is priced as
// would have a response of the type unanswered.
func (ts *deltaType) otherPending() bool {
	_, ok := ts.inflight[ts.otherLast]
	return ok
}

// inflight is one unanswered delta response: its system_version_info and,
// per name it carried, what the proxy held before (nil for nothing).
type inflight struct {
	version string
	undo    map[string]*snapshot.Resource
	// other is how many resources the SotW response would have carried:
	// what a rejection holds back there.
	other int
}

// maxInflight bounds the unanswered responses remembered per type. The
// names they remember are bounded too: twice what the scope serves of the
// type plus Options.ExtraNamesPerType (what a stream may subscribe to), room
// for a response sent before the proxy answered the one before it.
const maxInflight = 128

type delta struct {
	*stream
	grpc  deltaStream
	types [xdstype.Count]*deltaType
}

// DeltaAggregatedResources serves one delta (incremental) ADS stream.
func (s *Server) DeltaAggregatedResources(g deltaStream) error {
	return serve(s, model.Delta, g, func(base *stream) handler[*discoveryv3.DeltaDiscoveryRequest] {
		return &delta{stream: base, grpc: g}
	})
}

// handle answers one request: it takes the ACK or NACK it carries, then
// the subscription changes (and, on a stream's first request, what the
// proxy already holds), and sends what those changes make the proxy lack.
func (st *delta) handle(req *discoveryv3.DeltaDiscoveryRequest) error {
	t, err := st.requestedType(req.GetTypeUrl(),
		len(req.GetResourceNamesSubscribe())+len(req.GetResourceNamesUnsubscribe())+len(req.GetInitialResourceVersions()))
	if err != nil {
		return err
	}
	ts := st.types[t]
	if ts == nil {
		ts = &deltaType{subscription: newSubscription(t), inflight: map[string]inflight{}}
		st.types[t] = ts
	}
	if nonce := req.GetResponseNonce(); nonce != "" {
		st.answer(ts, nonce, req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
	}
	first := !ts.requested
	candidates, newlyWildcard, err := st.resubscribe(ts, req, first)
	if err != nil {
		return err
	}
	if len(candidates) == 0 && !newlyWildcard && !first {
		st.reportSynced(st.settled)
		return nil
	}
	var resp *response
	st.read(func(v snapshot.View) {
		resp = &response{t: t, version: v.TypeVersion(t), set: v.Set(t)}
		if newlyWildcard {
			// Every served name, once each: a candidate it serves is
			// among them, so only the others are left to consider.
			if len(req.GetInitialResourceVersions()) == 0 {
				resp.res = make([]*snapshot.Resource, 0, v.Len(t)) // it all goes
			}
			v.All(t, func(r *snapshot.Resource) { st.diff(v, ts, r.Name, resp, false) })
		}
		seen := make(map[string]struct{}, len(candidates))
		for _, name := range candidates {
			if _, dup := seen[name]; dup || (newlyWildcard && v.Get(t, name) != nil) {
				continue
			}
			seen[name] = struct{}{}
			// A name subscribed explicitly that does not exist is announced
			// as removed, so the proxy does not wait for it.
			st.diff(v, ts, name, resp, ts.names.has(name))
		}
		resp.connect = first
		resp.other, resp.priced = priceSotW(v, ts, resp, first, ts.otherPending()), true
	})
	if len(resp.res) > 0 || len(resp.removed) > 0 || first {
		return sendAll(st.stream, []*response{resp}, st.send, st.settled)
	}
	st.reportSynced(st.settled)
	return nil
}

// answer takes the proxy's answer to the response of nonce. On a NACK the
// proxy keeps what it had: what the response changed is rolled back, and
// nothing is sent again until a newer version exists.
func (st *delta) answer(ts *deltaType, nonce, detail string, nack bool) {
	in, ok := ts.inflight[nonce]
	if !ok {
		return
	}
	delete(ts.inflight, nonce)
	ts.undoing -= len(in.undo)
	if !nack {
		st.accepted(&ts.subscription, in.version)
		return
	}
	owed := make(map[string]string, len(in.undo))
	for name, prev := range in.undo {
		owed[name] = ""
		if r := ts.heldRes(name); r != nil {
			owed[name] = r.Version
		}
		ts.hold(name, prev)
	}
	st.rejected(&ts.subscription, in.version, detail, owed, feedback.HeldBack{Resources: len(in.undo), OtherResources: in.other})
}

// resubscribe applies a request's subscription changes and, on the first
// request of the type, the versions the proxy declares it holds. It returns
// the names to compare with the scope, and whether the type just became a
// wildcard subscription (every resource is then a candidate). Subscribing
// to more than the scope serves plus the allowed extra ends the stream; the
// versions a reconnecting proxy claims do not count, so a proxy whose scope
// shrank while it was away is sent the removals instead of being refused.
func (st *delta) resubscribe(ts *deltaType, req *discoveryv3.DeltaDiscoveryRequest, first bool) (candidates []string, newlyWildcard bool, err error) {
	ts.requested = true
	if first {
		candidates = st.claims(ts, req)
		if len(req.GetResourceNamesSubscribe()) == 0 {
			ts.wildcard = true // legacy wildcard: an empty first subscription
		}
	}
	wasWildcard := ts.wildcard
	ts.subscribing(req.GetResourceNamesSubscribe(), wildcardAfter(ts.wildcard, req))
	var added, removed []string
	for _, n := range req.GetResourceNamesSubscribe() {
		if n == "*" {
			ts.wildcard = true
			continue
		}
		if ts.names.add(n) {
			ts.namesDigest ^= snapshot.NameDigest(n)
			candidates = append(candidates, n)
			added = append(added, n)
		}
	}
	for _, n := range req.GetResourceNamesUnsubscribe() {
		if n == "*" {
			ts.wildcard = false
			continue
		}
		if ts.names.remove(n) {
			ts.namesDigest ^= snapshot.NameDigest(n)
			removed = append(removed, n)
		}
	}
	if len(added) > 0 {
		if err := st.checkSubscribed(ts.t, ts.names.len()); err != nil {
			return nil, false, err
		}
	}
	// A first request's legacy wildcard counts as a wildcard from nothing.
	if len(added) > 0 || len(removed) > 0 {
		st.read(func(v snapshot.View) { ts.names.share(v.Names(ts.t)) })
	}
	st.asked(&ts.subscription, added, removed, wasWildcard && !first)
	if len(req.GetResourceNamesUnsubscribe()) > 0 || (first && !ts.wildcard) {
		// Only a request that narrows the subscription can drop anything;
		// an ACK must not cost a pass over everything the proxy holds.
		ts.forgetUnsubscribed()
	}
	return candidates, ts.wildcard && (first || !wasWildcard), nil
}

// claims records what a proxy declares it holds on a stream's first request
// of a type (initial_resource_versions) and returns the names to compare with
// the scope. Claims cost what the scope serves, not what the client names: a
// claim of a served name is kept (sharing the served resource where the
// version matches), bounded by the scope; a claim of a name the scope does
// not serve matters only to a wildcard subscription, which is sent its
// removal (an explicitly subscribed name that is missing is announced
// anyway), and only Options.ExtraNamesPerType of those are kept and
// announced per stream and type. The others are forgotten: the stream
// holds nothing of them, so no announcement of tens of thousands of
// made-up names waits in the stream's transport or in its bookkeeping; a
// proxy that really held more is told of the rest on its next reconnect.
func (st *delta) claims(ts *deltaType, req *discoveryv3.DeltaDiscoveryRequest) (candidates []string) {
	claimed := req.GetInitialResourceVersions()
	if len(claimed) == 0 {
		return nil
	}
	wildcard := wildcardAfter(len(req.GetResourceNamesSubscribe()) == 0, req)
	unserved := 0
	st.read(func(v snapshot.View) {
		for name, version := range claimed {
			r := v.Get(ts.t, name)
			switch {
			case r != nil && r.Version == version:
				ts.hold(name, r) // share the served resource
			case r != nil:
				ts.hold(name, &snapshot.Resource{Name: name, Version: version})
			case !wildcard || unserved >= st.srv.opts.ExtraNamesPerType:
				continue
			default:
				unserved++
				ts.hold(name, &snapshot.Resource{Name: name, Version: version})
			}
			candidates = append(candidates, name)
		}
	})
	return candidates
}

// wildcardAfter is whether a subscription that is a wildcard or not
// (before) is one after the request: a request subscribes, then unsubscribes.
func wildcardAfter(before bool, req *discoveryv3.DeltaDiscoveryRequest) bool {
	return (before || slices.Contains(req.GetResourceNamesSubscribe(), "*")) &&
		!slices.Contains(req.GetResourceNamesUnsubscribe(), "*")
}

// diff adds to resp what the proxy needs for one name: the resource when it
// holds another version (or none), or a removal when it holds one that is gone.
func (st *delta) diff(v snapshot.View, ts *deltaType, name string, resp *response, announceMissing bool) {
	if !ts.subscribed(name) {
		return
	}
	r := v.Get(ts.t, name)
	has := ts.heldRes(name) != nil
	switch {
	case r != nil && !ts.holds(r):
		resp.res = append(resp.res, r)
	case r == nil && (has || announceMissing):
		resp.removed = append(resp.removed, name)
	}
}

// push sends what changed in the scope since the stream last looked:
// upserts in ADS order, then removals children first (see plan).
func (st *delta) push() error {
	resps, err := catchUp(st.stream, model.Delta, st.plan)
	if err != nil {
		return err
	}
	return sendAll(st.stream, resps, st.send, st.settled)
}

// plan returns the responses of one push, in the order they are sent.
func (st *delta) plan(v snapshot.View) []*response {
	var byType [xdstype.Count]*response
	for t, ts := range st.types {
		if ts == nil {
			continue
		}
		resp := &response{t: ts.t, version: v.TypeVersion(ts.t), set: v.Set(ts.t)}
		once := ts.eachChange(v, st.rev, func(name string) { st.diff(v, ts, name, resp, false) })
		if (len(resp.res) > 0 || len(resp.removed) > 0) && !ts.rejectedAgain(resp.res, resp.removed) {
			ts.sendOwed(once)
			resp.other, resp.priced = priceSotW(v, ts, resp, false, ts.otherPending()), true
			byType[t] = resp
		} else {
			ts.settle(resp.set)
		}
	}
	if rc, vh := byType[xdstype.Route], byType[xdstype.VirtualHost]; rc != nil && vh != nil && rc.other.responses > 0 {
		if _, vhds := envoyMode(v); vhds {
			// The route configuration SotW would send carries the virtual
			// hosts: priced once, there.
			vh.other = otherResponse{}
		}
	}
	removesLater := false
	for _, r := range byType {
		if r != nil && !r.t.Info().RemovedLast {
			removesLater = true
		}
	}
	// Each type's change is split into its upserts and its removals, each
	// priced as the SotW responses that would have carried it.
	var adds, rms [xdstype.Count]*response
	for _, r := range byType {
		if r == nil {
			continue
		}
		addOther, rmOther := r.other, otherResponse{}
		if removesLater && r.t.Info().RemovedLast && len(r.removed) > 0 && r.t.FullState() {
			// Make before break: SotW first sends the full set with the
			// departing resources still in, and drops them only in a
			// second, final set after the listeners and routes.
			rmOther = r.other
			addOther.entries += departing(st.types[r.t], r.removed)
			addOther.drains = 1
		}
		if len(r.res) > 0 {
			adds[r.t] = &response{t: r.t, version: r.version, set: r.set, res: r.res, other: addOther, priced: true}
		} else {
			rmOther = sumOther(rmOther, addOther)
		}
		if len(r.removed) > 0 {
			rms[r.t] = &response{t: r.t, version: r.version, set: r.set, removed: r.removed, other: rmOther, priced: true}
		} else if adds[r.t] != nil {
			adds[r.t].other = sumOther(addOther, rmOther)
		}
	}
	// Upserts go in ADS order, a cluster before its endpoints and both
	// before the listeners and routes that use them (make before break);
	// removals go after them, children first: routes before their
	// listener, assignments before their cluster, so no client is left
	// holding a resource whose parent it already dropped (Istio's delta
	// client fails on that). A type's upserts and removals go in one
	// response where nothing has to go between them.
	var seq []*response
	for t := range xdstype.Count {
		if adds[t] != nil {
			seq = append(seq, adds[t])
		}
	}
	for t := xdstype.Count; t > 0; t-- {
		r := rms[t-1]
		if r == nil {
			continue
		}
		if n := len(seq); n > 0 && seq[n-1].t == r.t {
			seq[n-1].removed = r.removed
			seq[n-1].other = sumOther(seq[n-1].other, r.other)
			continue
		}
		seq = append(seq, r)
	}
	return seq
}

// sumOther is the SotW responses that carry both parts a and b of one
// type's change. Both count the resources of the same final set, so the
// proxy would hold those once, not twice.
func sumOther(a, b otherResponse) otherResponse {
	o := otherResponse{
		entries: a.entries + b.entries, resources: max(a.resources, b.resources),
		responses: a.responses + b.responses, drains: a.drains + b.drains,
		pipelined: a.pipelined || (a.responses == 0 && b.pipelined),
		typeURL:   cmp.Or(a.typeURL, b.typeURL), version: cmp.Or(a.version, b.version),
		vhds: a.vhds + b.vhds, vhdsVersion: cmp.Or(a.vhdsVersion, b.vhdsVersion),
	}
	return o
}

func (st *delta) send(r *response) error {
	ts := st.types[r.t]
	st.nonce++
	nonce := strconv.FormatUint(st.nonce, 10)
	slices.Sort(r.removed)
	resp := deltaResponse(r.version, r.t.URL(), nonce, r.res, r.removed)
	if err := st.sendWithin(st.grpc, resp); err != nil {
		return err
	}
	undo := make(map[string]*snapshot.Resource, len(r.res)+len(r.removed))
	for _, res := range r.res {
		undo[res.Name] = ts.heldRes(res.Name)
	}
	ts.sentAll(r.res, r.set)
	for _, name := range r.removed {
		undo[name] = ts.heldRes(name)
		ts.hold(name, nil)
		delete(ts.owed, name)
	}
	ts.settle(r.set)
	if len(ts.inflight) >= maxInflight || ts.undoing+len(undo) > 2*(r.set.Len()+st.srv.opts.ExtraNamesPerType) {
		// A proxy that does not answer: forget the older bookkeeping rather
		// than grow without bound (the send timeout ends the stream).
		clear(ts.inflight)
		ts.undoing = 0
	}
	ts.inflight[nonce] = inflight{version: r.version, undo: undo, other: r.other.resources}
	ts.undoing += len(undo)
	if r.other.responses > 0 && r.other.typeURL == "" {
		ts.otherLast = nonce
	}
	st.srv.fb.Sent(st.key, model.Delta, r.t.URL(), feedback.Push{
		Resources: len(r.res), Bytes: resp.size, Connect: r.connect,
		OtherBytes: r.other.price(r.version, r.t.URL(), &st.otherNonce),
	})
	return nil
}

// priceSotW is the SotW response that would have carried the same change
// to the proxy: the whole subscribed set of a full-state type whenever it
// changed, the changed resources of a by-name type (for a removal only the
// empty response that follows the unsubscription: SotW drops those with
// their parent), and every subscribed resource when
// the stream connects (all), unless the proxy declared exactly what is
// served of a full-state type: SotW resends the world to a proxy whose
// version_info is not the served one, and the assignments and route
// configurations whatever it names (see sotw.adopt). The responses carry
// the version SotW gives them: for a by-name subscription the digest of
// the type's version and the names (also when the type is empty, whose
// version is "0"), marked as pipelined for a by-name type while SotW would
// have a response of it unanswered (pending; see sotw.version).
func priceSotW(v snapshot.View, ts *deltaType, r *response, all, pending bool) otherResponse {
	o := sotwChange(v, ts, r, all)
	if o.responses == 0 || o.typeURL != "" {
		return o
	}
	if !ts.wildcard {
		o.version = snapshot.SubsetVersion(v.TypeVersion(ts.t), ts.namesDigest)
	}
	// A by-name proxy's empty response after a removal answers its
	// unsubscription, sent once it took the responses before.
	o.pipelined = pending && !ts.t.FullState() && (o.resources > 0 || ts.wildcard)
	return o
}

// sotwChange is the SotW responses of priceSotW, headed by delta's type
// and version.
func sotwChange(v snapshot.View, ts *deltaType, r *response, all bool) otherResponse {
	if all && ts.t.FullState() && len(r.res) == 0 && len(r.removed) == 0 && ts.heldCount() > 0 {
		// A reconnect declaring exactly what is served: a SotW proxy
		// holding the same names the served version and is sent nothing.
		return otherResponse{}
	}
	if _, vhds := envoyMode(v); vhds {
		switch ts.t {
		case xdstype.VirtualHost:
			// SotW carries the virtual hosts inline, so any change of them
			// resends the whole route configuration, and a stream's first
			// route configuration already held them all.
			if all || (len(r.res) == 0 && len(r.removed) == 0) {
				return otherResponse{}
			}
			name := ""
			if len(r.res) > 0 {
				name = routeOf(r.res[0].Name)
			} else {
				name = routeOf(r.removed[0])
			}
			return otherResponse{entries: cost.SotWEntry(v.InlineRouteSize(name)), resources: 1, responses: 1,
				typeURL: xdstype.Route.URL(), version: v.TypeVersion(xdstype.Route)}
		case xdstype.Route:
			// SotW's route configuration carries the virtual hosts.
			o := otherResponse{responses: 1}
			price := func(name string) {
				o.entries += cost.SotWEntry(v.InlineRouteSize(name))
				o.resources++
			}
			switch {
			case !all:
				for _, res := range r.res {
					price(res.Name)
				}
				if o.resources == 0 {
					o.responses = 0
				}
			case ts.wildcard:
				v.All(ts.t, func(res *snapshot.Resource) { price(res.Name) })
			default:
				ts.names.all(func(name string) {
					if v.Get(ts.t, name) != nil {
						price(name)
					}
				})
			}
			return o
		}
	}
	if ts.t.FullState() || all {
		o := otherResponse{responses: 1}
		if ts.wildcard {
			o.entries, o.resources = v.SotWBytes(ts.t), v.Len(ts.t)
			return o
		}
		ts.names.all(func(name string) {
			if res := v.Get(ts.t, name); res != nil {
				o.entries += cost.SotWEntry(res.Size)
				o.resources++
			}
		})
		return o
	}
	var o otherResponse
	for _, res := range r.res {
		o.entries += cost.SotWEntry(res.Size)
		o.resources++
	}
	if o.resources > 0 {
		o.responses = 1
	}
	if len(r.removed) > 0 {
		// SotW sends no removal, but a by-name proxy (as Envoy subscribes
		// to assignments and routes) unsubscribes from what its clusters
		// or listeners stopped naming, and is then sent an empty response
		// that moves its version to the new names. (A wildcard SotW proxy
		// gets that empty response only when nothing else changed.)
		o.responses++
	}
	return o
}

// departing is what the resources a removal takes away, as the proxy holds
// them, add to a SotW response.
func departing(ts *deltaType, removed []string) int {
	n := 0
	for _, name := range removed {
		if h := ts.heldRes(name); h != nil {
			n += cost.SotWEntry(h.Size)
		}
	}
	return n
}

// busy reports whether a response is unanswered.
func (st *delta) busy() bool {
	for _, ts := range st.types {
		if ts != nil && len(ts.inflight) > 0 {
			return true
		}
	}
	return false
}

// settled reports whether every response was answered and none rejected.
func (st *delta) settled() bool {
	for _, ts := range st.types {
		if ts != nil && (len(ts.inflight) > 0 || ts.rejecting) {
			return false
		}
	}
	return true
}
