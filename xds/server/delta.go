package server

import (
	"slices"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"

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
}

// inflight is one unanswered delta response: its system_version_info, the
// resources and removals it carried (the response's own slices), and, for
// the names among them the proxy held before, what it held. A proxy's
// first responses carry only names it held nothing of: a map over every
// name, most of them to nil, was 142 MB of a start's peak heap at
// S=100,000 with 1,000 delta proxies.
type inflight struct {
	version string
	res     []*snapshot.Resource
	removed []string
	undo    map[string]*snapshot.Resource
}

// names counts the names the response carried.
func (in inflight) names() int { return len(in.res) + len(in.removed) }

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
	return serve(s, model.Delta, &deltaReader{deltaStream: g}, func(base *stream) handler[*deltaRequest] {
		return &delta{stream: base, grpc: g}
	})
}

// deltaReader receives a delta stream's requests with their claims left
// encoded (deltaRequest), which the server's codec decodes.
type deltaReader struct{ deltaStream }

func (r *deltaReader) Recv() (*deltaRequest, error) {
	req := &deltaRequest{}
	if err := r.RecvMsg(req); err != nil {
		return nil, err
	}
	return req, nil
}

// handle answers one request: it takes the ACK or NACK it carries, then
// the subscription changes (and, on a stream's first request, what the
// proxy already holds), and sends what those changes make the proxy lack.
func (st *delta) handle(req *deltaRequest) error {
	defer req.free()
	t, err := st.requestedType(req.GetTypeUrl(),
		len(req.GetResourceNamesSubscribe())+len(req.GetResourceNamesUnsubscribe())+req.claims)
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
	// served is set when the proxy declared exactly what the scope served
	// of the type (claims): it holds that set.
	served := false
	if first {
		var claimed []string
		claimed, served = st.claims(ts, req)
		candidates = append(candidates, claimed...)
	}
	if len(candidates) == 0 && !newlyWildcard && !first {
		st.reportSynced(st.settled)
		return nil
	}
	var resp *response
	st.read(func(v snapshot.View) {
		resp = &response{t: t, version: v.TypeVersion(t), typeVersion: v.TypeVersion(t), set: v.Set(t)}
		if served {
			// The proxy holds the set it declared: only what changed
			// since can differ, whatever it subscribes to.
			snapshot.Changes(ts.held.base, resp.set, func(name string) { candidates = append(candidates, name) })
			newlyWildcard = false
		}
		if newlyWildcard {
			// Every served name, once each: a candidate it serves is
			// among them, so only the others are left to consider.
			if req.claims == 0 {
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
		st.price.planned(v, st.rev, st.subscriptions(), only(resp), false)
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
	ts.undoing -= in.names()
	if !nack {
		st.accepted(&ts.subscription, nonce, in.version)
		return
	}
	owed := make(map[string]string, in.names())
	back := func(name string) {
		owed[name] = ""
		if r := ts.heldRes(name); r != nil {
			owed[name] = r.Version
		}
		ts.hold(name, in.undo[name])
	}
	for _, r := range in.res {
		back(r.Name)
	}
	for _, name := range in.removed {
		back(name)
	}
	st.rejected(&ts.subscription, nonce, in.version, detail, owed, in.names())
}

// resubscribe applies a request's subscription changes (claims then
// records, on the first request of the type, what the proxy holds). It returns
// the names to compare with the scope, and whether the type just became a
// wildcard subscription (every resource is then a candidate). Subscribing
// to more than the scope serves plus the allowed extra ends the stream; the
// versions a reconnecting proxy claims do not count, so a proxy whose scope
// shrank while it was away is sent the removals instead of being refused.
func (st *delta) resubscribe(ts *deltaType, req *deltaRequest, first bool) (candidates []string, newlyWildcard bool, err error) {
	ts.requested = true
	if first && len(req.GetResourceNamesSubscribe()) == 0 {
		ts.wildcard = true // legacy wildcard: an empty first subscription
	}
	wasWildcard := ts.wildcard
	ts.subscribing(req.GetResourceNamesSubscribe(), wildcardAfter(ts.wildcard, req.DeltaDiscoveryRequest))
	var added, removed []string
	for _, n := range req.GetResourceNamesSubscribe() {
		if n == "*" {
			ts.wildcard = true
			continue
		}
		if ts.addName(n) {
			candidates = append(candidates, n)
			added = append(added, n)
		}
	}
	for _, n := range req.GetResourceNamesUnsubscribe() {
		if n == "*" {
			ts.wildcard = false
			continue
		}
		if ts.removeName(n) {
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
// of a type (initial_resource_versions), once the request's subscription is
// applied, and returns the names to compare with the scope. A proxy that
// declares exactly what the scope serves of the type (as many claims as
// resources, whose digest is the type's version: see snapshot.PairDigest)
// holds that set, which is recorded as such (served) with nothing decoded
// or looked up: a reconnect after a stream broke, or after the control plane
// restarted, costs a pass over the request's bytes. Otherwise each claim is
// looked at, and claims cost what the scope serves, not what the client
// names: a claim of a served name is kept (sharing the served resource where
// the version matches), bounded by the scope; a claim of a name the scope
// does not serve matters only to a wildcard subscription, which is sent its
// removal (an explicitly subscribed name that is missing is announced
// anyway), and only Options.ExtraNamesPerType of those are kept and
// announced per stream and type. The others, and claims of names the proxy
// does not subscribe to (which it drops itself), are forgotten: the stream
// holds nothing of them, so no announcement of tens of thousands of made-up
// names waits in the stream's transport or in its bookkeeping; a proxy that
// really held more is told of the rest on its next reconnect.
func (st *delta) claims(ts *deltaType, req *deltaRequest) (candidates []string, served bool) {
	if req.claims == 0 {
		return nil, false
	}
	st.read(func(v snapshot.View) {
		if req.claims == v.Len(ts.t) && snapshot.DigestVersion(req.claimDigest) == v.TypeVersion(ts.t) {
			ts.holdSet(v.Set(ts.t))
			served = true
		}
	})
	if served {
		return nil, true
	}
	claimed := req.claimed()
	unserved := 0
	st.read(func(v snapshot.View) {
		for name, version := range claimed {
			if !ts.subscribed(name) {
				continue
			}
			r := v.Get(ts.t, name)
			switch {
			case r != nil && r.Version == version:
				ts.hold(name, r) // share the served resource
			case r != nil:
				ts.hold(name, &snapshot.Resource{Name: name, Version: version})
			case !ts.wildcard || unserved >= st.srv.opts.ExtraNamesPerType:
				continue
			default:
				unserved++
				ts.hold(name, &snapshot.Resource{Name: name, Version: version})
			}
			candidates = append(candidates, name)
		}
	})
	return candidates, false
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
		resp := &response{t: ts.t, version: v.TypeVersion(ts.t), typeVersion: v.TypeVersion(ts.t), set: v.Set(ts.t)}
		once := ts.eachChange(v, st.rev, func(name string) { st.diff(v, ts, name, resp, false) })
		if (len(resp.res) > 0 || len(resp.removed) > 0) && !ts.rejectedAgain(resp.res, resp.removed) {
			ts.sendOwed(once)
			byType[t] = resp
		} else {
			ts.settle(resp.set)
		}
	}
	st.price.planned(v, st.rev, st.subscriptions(), byType, true)
	// Each type's change is split into its upserts and its removals.
	var adds, rms [xdstype.Count]*response
	for _, r := range byType {
		if r == nil {
			continue
		}
		if len(r.res) > 0 {
			adds[r.t] = &response{t: r.t, version: r.version, typeVersion: r.typeVersion, set: r.set, res: r.res}
		}
		if len(r.removed) > 0 {
			rms[r.t] = &response{t: r.t, version: r.version, typeVersion: r.typeVersion, set: r.set, removed: r.removed}
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
			continue
		}
		seq = append(seq, r)
	}
	return seq
}

// subscriptions is every type's subscription, nil where none.
func (st *delta) subscriptions() (subs [xdstype.Count]*subscription) {
	for t, ts := range st.types {
		if ts != nil {
			subs[t] = &ts.subscription
		}
	}
	return subs
}

func (st *delta) send(r *response) error {
	ts := st.types[r.t]
	st.price.sending(&ts.subscription, r)
	nonce := st.nextNonce()
	slices.Sort(r.removed)
	resp := deltaResponse(r.version, r.t.URL(), nonce, r.res, r.removed)
	if err := st.sendWithin(st.grpc, resp); err != nil {
		return err
	}
	in := inflight{version: r.version, res: r.res, removed: r.removed}
	keep := func(name string) {
		if prev := ts.heldRes(name); prev != nil {
			if in.undo == nil {
				in.undo = map[string]*snapshot.Resource{}
			}
			in.undo[name] = prev
		}
	}
	for _, res := range r.res {
		keep(res.Name)
	}
	ts.sentAll(r.res, r.set)
	for _, name := range r.removed {
		keep(name)
		ts.hold(name, nil)
		delete(ts.owed, name)
	}
	ts.settle(r.set)
	if len(ts.inflight) >= maxInflight || ts.undoing+in.names() > 2*(r.set.Len()+st.srv.opts.ExtraNamesPerType) {
		// A proxy that does not answer: forget the older bookkeeping rather
		// than grow without bound (the send timeout ends the stream).
		clear(ts.inflight)
		ts.undoing = 0
		st.price.forgot(r.t)
	}
	ts.inflight[nonce] = in
	ts.undoing += in.names()
	st.sent(r, nonce, resp.size)
	return nil
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
