package server

import (
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

type sotwStream = grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]

// sotwType is a SotW stream's state for one type: the shared subscription
// plus the one response that may be awaiting an answer.
type sotwType struct {
	subscription
	// nonce and version of the last response sent; pending until answered.
	nonce   string
	version string
	pending bool
	// last lists the resources of the last response while it is pending,
	// owed again if it is rejected (by-name types only: a full-state type
	// is resent whole).
	last []*snapshot.Resource
	// before is the full set of a full-state type the proxy held before
	// the last response replaced it, kept until the proxy answers: a
	// rejecting proxy keeps that set, so it becomes held again, and the
	// next response is planned and made-before-broken from it.
	before *holding
	// adopted is set while the proxy holds, by its own claim on this
	// stream's first request of the type, the version ts.version names,
	// without a response having been sent: a later request without a
	// nonce that claims the same version is the same proxy still holding
	// it, not a new one waiting for the full set.
	adopted bool
	// lastNames and lastDigest are the count and digest of the encoded
	// names of the last request that stated the subscription: a request
	// repeating them (every ACK) states the same one.
	lastNames  int
	lastDigest uint64
}

type sotw struct {
	*stream
	grpc  sotwStream
	types [xdstype.Count]*sotwType
}

// StreamAggregatedResources serves one State-of-the-World ADS stream.
func (s *Server) StreamAggregatedResources(g sotwStream) error {
	return serve(s, model.SotW, &sotwReader{sotwStream: g}, func(base *stream) handler[*sotwRequest] {
		return &sotw{stream: base, grpc: g}
	})
}

// sotwReader receives a SotW stream's requests with their names left
// encoded (sotwRequest), which the server's codec decodes; the node of
// requests after the first is not decoded.
type sotwReader struct {
	sotwStream
	started bool
}

func (r *sotwReader) Recv() (*sotwRequest, error) {
	req := &sotwRequest{skipNode: r.started}
	if err := r.RecvMsg(req); err != nil {
		return nil, err
	}
	r.started = true
	return req, nil
}

// handle answers one request: it takes the ACK or NACK it carries, then
// the subscription it states, and responds when the subscription changed or
// the proxy waits for a first response.
func (st *sotw) handle(req *sotwRequest) error {
	defer req.free()
	t, err := st.requestedType(req.GetTypeUrl(), req.names)
	if err != nil {
		return err
	}
	ts := st.types[t]
	if ts == nil {
		ts = &sotwType{subscription: newSubscription(t)}
		st.types[t] = ts
	}
	nonce := req.GetResponseNonce()
	if nonce != "" && nonce != ts.nonce {
		return nil // an answer to a response that was superseded: ignored
	}
	if nonce != "" && ts.pending {
		st.answer(ts, req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
	}
	claimed, clean := req.GetVersionInfo(), req.GetErrorDetail() == nil
	// A first request, or a reconnect: the proxy waits for a response,
	// unless it still holds the version it claimed on this stream.
	stillHolds := ts.adopted && clean && claimed == ts.version
	awaiting := nonce == "" && !stillHolds
	changed, added, err := st.resubscribe(ts, req)
	if err != nil {
		return err
	}
	if !changed && !awaiting {
		st.reportSynced(st.settled)
		return nil
	}
	if awaiting {
		ts.holdNothing() // what the proxy holds is unknown to this stream
	}
	var (
		resp    *response
		adopted bool
	)
	st.read(func(v snapshot.View) {
		served := awaiting && clean && !ts.pending && claimed != "" && claimed == st.version(v, ts)
		if served && (t.FullState() || !st.stream.grpc) {
			resp, adopted = st.adopt(v, ts, claimed), true
		} else if resp = st.respond(v, ts, awaiting); resp != nil {
			// A gRPC client's assignment or route configuration
			// claimed at the served version is sent all the same (see
			// adopt).
			resp.connect, resp.claimed = awaiting, served
			if !ts.names.within(v.Names(t)) {
				for _, name := range added {
					if v.Get(t, name) == nil {
						resp.missing = append(resp.missing, name)
					}
				}
			}
		}
		if resp != nil {
			st.price.planned(v, st.rev, st.subscriptions(), only(resp), false)
		}
	})
	if adopted {
		// Nothing is sent, and nothing costs: the proxy holds the current
		// set.
		st.price.sending(&ts.subscription, resp)
		st.sent(resp, "", 0)
		st.accepted(&ts.subscription, "", claimed)
		st.reportSynced(st.settled)
		return nil
	}
	if resp != nil {
		return sendAll(st.stream, []*response{resp}, st.send, st.settled)
	}
	st.reportSynced(st.settled)
	return nil
}

// adopt takes a proxy's claim, on its first request of a type on this
// stream, to hold the version the stream would send it now, and returns
// the response it stands for, which is not sent. The stream records the
// served set as held and the version as answered, as if it had sent and
// the proxy had ACKed it.
//
// Versions are content hashes over the type (and, by name, over the
// subscribed names), and a proxy names the version of the last response
// it accepted. For a full-state type (Listeners, Clusters) that proves
// what it holds: every response replaces all it holds of the type.
//
// For an assignment or a route configuration it proves so only if the
// proxy drops one of them (with its cluster or listener) never without a
// response of the type that moves its version. changes sends one: the
// push that removes a parent ends with an empty response of the child's
// type, versioned over the names the proxy keeps, before anything could
// bring the parent back (a stream pushes only once its proxy answered
// everything). So a proxy that saw a cluster go and come back, and whose
// stream broke after the cluster returned but before its assignment did,
// names the version of that empty response, not the served one, and is
// sent its assignments. Envoy drops a child only so. A gRPC client drops
// one also when its own channel stops watching it, which no response
// follows: its claims of assignments and route configurations are
// answered with every subscribed resource.
func (st *sotw) adopt(v snapshot.View, ts *sotwType, version string) *response {
	t := ts.t
	ts.holdSet(v.Set(t))
	ts.version, ts.pending, ts.adopted, ts.last, ts.before = version, false, true, nil, nil
	clear(ts.owed)
	return &response{t: t, version: version, typeVersion: v.TypeVersion(t), set: v.Set(t), connect: true, claimed: true}
}

// version is the version_info of a response to ts from v: the type's
// version for a wildcard subscription, which covers every resource of the
// type; for a by-name one, the type's version combined with the
// subscribed names, since a proxy subscribed to other names holds other
// resources at the same type version.
//
// A by-name type's response carries only what the proxy lacks, so its
// version denotes the whole subscription only if the proxy took every
// response before it: one built while an earlier response is unanswered
// is marked (pipelined), since the proxy may reject that one (its answer
// then names a superseded nonce) and still accept this. A proxy naming a
// marked version on a new stream gets the full set again.
func (st *sotw) version(v snapshot.View, ts *sotwType) string {
	version := v.TypeVersion(ts.t)
	if !ts.wildcard {
		version = snapshot.SubsetVersion(version, ts.namesDigest)
	}
	if ts.pending && !ts.t.FullState() {
		version += pipelined
	}
	return version
}

// versionWithout is version for ts's subscription without the names gone:
// a by-name proxy's version once it dropped them with their parents.
func (st *sotw) versionWithout(v snapshot.View, ts *sotwType, gone []string) string {
	if ts.wildcard {
		return st.version(v, ts)
	}
	digest := ts.namesDigest
	for _, name := range gone {
		digest ^= snapshot.NameDigest(name)
	}
	version := snapshot.SubsetVersion(v.TypeVersion(ts.t), digest)
	if ts.pending {
		version += pipelined
	}
	return version
}

// answer takes the proxy's answer to the pending response. On a NACK the
// proxy keeps its last good configuration; the rejected version is not sent
// again, only a newer one will be, with the rejected by-name resources.
func (st *sotw) answer(ts *sotwType, detail string, nack bool) {
	ts.pending = false
	before := ts.before
	ts.before = nil
	if !nack {
		ts.last = nil
		st.accepted(&ts.subscription, ts.nonce, ts.version)
		return
	}
	if before != nil {
		ts.held = *before
	}
	owed := map[string]string{}
	if !ts.t.FullState() {
		for _, r := range ts.last {
			if ts.heldRes(r.Name) == r {
				ts.hold(r.Name, nil)
				owed[r.Name] = r.Version
			}
		}
	}
	st.rejected(&ts.subscription, ts.nonce, ts.version, detail, owed, len(ts.last))
}

// resubscribe makes the subscription what the request's names state and
// reports whether it changed, and the names it added. Most requests are ACKs repeating the
// subscription: that is checked on the encoded names, without decoding
// them, and a list in another order without building anything. A subscription
// beyond what the scope serves (plus the allowed extra) ends the stream.
func (st *sotw) resubscribe(ts *sotwType, req *sotwRequest) (bool, []string, error) {
	if ts.requested && req.names == ts.lastNames && req.digest == ts.lastDigest {
		return false, nil, nil // the list the last request named, byte for byte
	}
	requested, err := req.resourceNames()
	if err != nil {
		st.srv.fb.Refuse(model.Key{}, RefusedMalformed)
		return false, nil, status.Errorf(codes.InvalidArgument, "malformed request: %v", err)
	}
	ts.lastNames, ts.lastDigest = req.names, req.digest
	if ts.requested && sameSubscription(requested, ts) {
		return false, nil, nil
	}
	wildcard, names := false, make(map[string]struct{}, len(requested))
	for _, n := range requested {
		if n == "*" {
			wildcard = true
		} else {
			names[n] = struct{}{}
		}
	}
	if err := st.checkSubscribed(ts.t, len(names)); err != nil {
		return false, nil, err
	}
	if len(names) == 0 && (!ts.requested || ts.wildcard) {
		wildcard = true // legacy wildcard: an empty first request, kept while empty
	}
	if ts.requested && wildcard == ts.wildcard && sameNames(names, &ts.names) {
		return false, nil, nil
	}
	var added, removed []string
	for n := range names {
		if !ts.names.has(n) {
			added = append(added, n)
		}
	}
	ts.names.all(func(n string) {
		if _, ok := names[n]; !ok {
			removed = append(removed, n)
		}
	})
	ts.subscribing(added, wildcard)
	if ts.before != nil {
		// What the base of before implies changes with the names too.
		b := holding{diff: ts.listed(*ts.before)}
		ts.before = &b
	}
	ts.namesDigest = 0
	for n := range names {
		ts.namesDigest ^= snapshot.NameDigest(n)
	}
	wasWildcard := ts.wildcard
	ts.requested, ts.wildcard, ts.names = true, wildcard, ownNames(names)
	st.read(func(v snapshot.View) { ts.names.share(v.Names(ts.t)) })
	st.asked(&ts.subscription, added, removed, wasWildcard)
	ts.forgetUnsubscribed()
	if ts.before != nil {
		for name := range ts.before.diff {
			if !ts.subscribed(name) {
				delete(ts.before.diff, name)
			}
		}
	}
	return true, added, nil
}

// sameNames reports whether names are the set's.
func sameNames(names map[string]struct{}, set *nameSet) bool {
	if len(names) != set.len() {
		return false
	}
	for n := range names {
		if !set.has(n) {
			return false
		}
	}
	return true
}

// respond returns what a changed subscription (or a proxy awaiting its
// first response, force) must receive: the full set of a full-state type,
// the subscribed resources the proxy lacks of a by-name type (none, when
// only the version moved).
func (st *sotw) respond(v snapshot.View, ts *sotwType, force bool) *response {
	t := ts.t
	if t.FullState() {
		return st.fullResponse(v, ts, true)
	}
	var res []*snapshot.Resource
	add := func(name string) {
		if r := v.Get(t, name); r != nil && !ts.holds(r) {
			res = append(res, r)
		}
	}
	if ts.wildcard {
		v.All(t, func(r *snapshot.Resource) { add(r.Name) })
	} else {
		ts.names.all(add)
	}
	// A subscription change that leaves the proxy lacking nothing still
	// moves the version its names are served at (it covers the names):
	// an empty response tells the proxy, so that it names the served
	// version when it reconnects, and is sent nothing again.
	version := st.version(v, ts)
	if len(res) > 0 || force || (!ts.pending && ts.version != version) {
		return &response{t: t, version: version, typeVersion: v.TypeVersion(t), set: v.Set(t), res: res}
	}
	return nil
}

// fullResponse returns the complete set of a Clusters or Listeners
// subscription, or nil when the proxy already holds exactly that (unless force).
func (st *sotw) fullResponse(v snapshot.View, ts *sotwType, force bool) *response {
	t := ts.t
	var res []*snapshot.Resource
	if ts.wildcard {
		res = make([]*snapshot.Resource, 0, v.Len(t))
		v.All(t, func(r *snapshot.Resource) { res = append(res, r) })
	} else {
		ts.names.all(func(name string) {
			if r := v.Get(t, name); r != nil {
				res = append(res, r)
			}
		})
	}
	if !force {
		same := true
		for _, r := range res {
			if !ts.holds(r) {
				same = false
				break
			}
		}
		if same && len(res) == ts.heldCount() {
			return nil
		}
	}
	return &response{t: t, version: st.version(v, ts), typeVersion: v.TypeVersion(t), set: v.Set(t), res: res, full: true}
}

// push sends what changed in the scope since the stream last looked, in ADS
// order, making before breaking: when clusters go away while listeners or
// routes change, the clusters are first sent with the departing ones still
// in, and removed only after the listeners and routes stopped using them.
//
// That is also children first: in SotW only Clusters and Listeners are
// removed, by omission from their full sets; an assignment or route
// configuration is never removed by a message (the proxy drops it with the
// cluster or listener that named it), so no response can remove a child
// after its parent. Listeners and routes are sent before the clusters'
// final set, so nothing still names a cluster when it goes.
func (st *sotw) push() error {
	resps, err := catchUp(st.stream, model.SotW, st.plan)
	if err != nil {
		return err
	}
	return sendAll(st.stream, resps, st.send, st.settled)
}

// plan returns the responses of one push, in the order they are sent.
func (st *sotw) plan(v snapshot.View) []*response {
	var byType [xdstype.Count]*response
	for t, ts := range st.types {
		if ts == nil {
			continue
		}
		if byType[t] = st.changes(v, ts); byType[t] == nil {
			ts.settle(v.Set(ts.t))
		}
	}
	st.price.planned(v, st.rev, st.subscriptions(), byType, true)
	var out, late []*response
	removesLater := false
	for _, r := range byType {
		if r != nil && len(r.res) > 0 && !r.t.Info().RemovedLast {
			removesLater = true
		}
	}
	var moves []*response
	for _, r := range byType {
		if r == nil {
			continue
		}
		if !r.full && len(r.res) == 0 {
			moves = append(moves, r) // only a version move: after the rest
			continue
		}
		if removesLater && r.full && r.t.Info().RemovedLast {
			if early := makeBeforeBreak(r, &st.types[r.t].subscription); early != nil {
				out = append(out, early)
				late = append(late, r)
				continue
			}
		}
		out = append(out, r)
	}
	return append(append(out, late...), moves...)
}

// changes returns the response that brings one type up to date, or nil.
func (st *sotw) changes(v snapshot.View, ts *sotwType) *response {
	t := ts.t
	if t.FullState() {
		touched := false
		if !v.ChangedSince(st.rev, t, func(name string) { touched = touched || ts.subscribed(name) }) {
			touched = true
		}
		if !touched {
			return nil
		}
		r := st.fullResponse(v, ts, false)
		if r != nil && ts.rejecting && !ts.pending && r.version == ts.version {
			return nil // the set the proxy rejected, unchanged: see rejectedAgain
		}
		return r
	}
	var (
		res  []*snapshot.Resource
		gone []string
	)
	once := ts.eachChange(v, st.rev, func(name string) {
		if !ts.subscribed(name) {
			return
		}
		r := v.Get(t, name)
		if r == nil {
			if ts.heldRes(name) != nil {
				ts.hold(name, nil)
				gone = append(gone, name)
			}
		} else if !ts.holds(r) {
			res = append(res, r)
		}
	})
	if len(res) == 0 {
		if len(gone) > 0 {
			// The proxy drops these with their cluster or listener, and
			// is sent an empty response that moves its version (see
			// adopt): a by-name one's over the names it keeps, which it
			// states next, so that unsubscribing is answered by nothing
			// (as with the response below when something else changed).
			return &response{t: t, version: st.versionWithout(v, ts, gone), typeVersion: v.TypeVersion(t), set: v.Set(t), removed: gone}
		}
		return nil
	}
	if len(gone) == 0 && ts.rejectedAgain(res, nil) {
		return nil
	}
	ts.sendOwed(once)
	return &response{t: t, version: st.versionWithout(v, ts, gone), typeVersion: v.TypeVersion(t), set: v.Set(t), res: res, removed: gone}
}

// makeBeforeBreak returns a full-state response that keeps the held
// resources the final one drops, or nil when nothing is dropped or
// dropping them first moves no traffic (movesTraffic).
func makeBeforeBreak(final *response, s *subscription) *response {
	keep := make(map[string]struct{}, len(final.res))
	for _, r := range final.res {
		keep[r.Name] = struct{}{}
	}
	var gone []*snapshot.Resource
	s.eachHeld(func(r *snapshot.Resource) {
		if _, ok := keep[r.Name]; !ok {
			gone = append(gone, r)
		}
	})
	if len(gone) == 0 || !movesTraffic(gone, final.set) {
		return nil
	}
	union := append(append(make([]*snapshot.Resource, 0, len(final.res)+len(gone)), final.res...), gone...)
	return &response{t: final.t, version: final.version + draining, typeVersion: final.typeVersion, set: final.set, res: union, full: true}
}

// subscriptions is every type's subscription, nil where none.
func (st *sotw) subscriptions() (subs [xdstype.Count]*subscription) {
	for t, ts := range st.types {
		if ts != nil {
			subs[t] = &ts.subscription
		}
	}
	return subs
}

func (st *sotw) send(r *response) error {
	ts := st.types[r.t]
	st.price.sending(&ts.subscription, r)
	nonce := st.nextNonce()
	resp := sotwResponse(r.version, r.t.URL(), nonce, r.res)
	if r.connect {
		// Other types may have counted the stream in sync already.
		st.srv.fb.Behind(st.key, st.id)
	}
	if err := st.sendWithin(st.grpc, resp); err != nil {
		return err
	}
	ts.nonce, ts.version, ts.pending, ts.last, ts.adopted = nonce, r.version, true, r.res, false
	if r.full {
		before := ts.held
		ts.before = &before
		ts.holdSet(r.set)
	}
	ts.sentAll(r.res, r.set)
	ts.settle(r.set)
	st.sent(r, nonce, resp.size)
	return nil
}

// settled reports whether every response was answered and none rejected.
func (st *sotw) settled() bool {
	for _, ts := range st.types {
		if ts != nil && (ts.pending || ts.rejecting) {
			return false
		}
	}
	return true
}

// busy reports whether a response is unanswered: one superseded by a
// later response of its type is answered with that one.
func (st *sotw) busy() bool {
	for _, ts := range st.types {
		if ts != nil && ts.pending {
			return true
		}
	}
	return false
}

// sameSubscription reports whether a request's resource names are the
// subscription the stream already has, without allocating.
func sameSubscription(names []string, ts *sotwType) bool {
	if len(names) == 0 {
		return ts.wildcard && ts.names.len() == 0
	}
	star, n := false, 0
	for _, name := range names {
		if name == "*" {
			star = true
			continue
		}
		if !ts.names.has(name) {
			return false
		}
		n++
	}
	// Duplicates in the request would make n overcount; a mismatch is only
	// a slower path, never a wrong answer.
	return n == ts.names.len() && star == ts.wildcard
}
