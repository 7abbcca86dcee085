package server

import (
	"maps"
	"strconv"
	"strings"

	"github.com/scopeplane/scopeplane/xds/cost"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/translate"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// subscription is what a stream keeps per resource type in either protocol
// (go-control-plane's stream.Subscription is the anchor): what the proxy
// asked for, what the server knows it holds, and what a rejection left
// owed. The protocols differ only in how requests change it and how
// responses are framed; the steps below are shared.
type subscription struct {
	t         xdstype.Type
	requested bool
	wildcard  bool
	names     nameSet
	// held is what the proxy holds from this stream, as far as the server
	// knows: for a SotW full-state type the last full set sent (the set
	// before it again once the proxy rejected it); otherwise
	// every resource sent (in delta seeded from initial_resource_versions
	// and rolled back on a NACK). A claimed version the server does not
	// serve is held as a Resource without a body.
	held holding
	// owed holds the names a rejected response carried, each with the
	// version of what the proxy rejected under it ("" for a removal): they
	// are sent again with the next change of the type, never alone (that
	// would loop on the rejection, go-control-plane #962), and a change
	// that brings back only what was rejected is no change (rejectedAgain).
	owed map[string]string
	// rejecting is set while the proxy's last answer was a NACK, or names
	// it rejected are still owed: the proxy lacks part of the scope.
	rejecting bool
}

func newSubscription(t xdstype.Type) subscription {
	return subscription{t: t, owed: map[string]string{}}
}

// holding is what a proxy holds of one type, kept so that a proxy in step
// with its scope costs its stream a few words whatever the scope's size:
// once the stream brought the proxy to a set of the scope (whole), it keeps
// that immutable set by reference (base) and, apart, only the names where
// the proxy differs from it for the subscription (diff: a resource, or nil
// for none): a rejected change, a response in flight, a name subscribed
// since, a claimed version the scope does not serve. Without a base, diff
// is everything held. The proxy holds base's resource of a subscribed name
// that diff does not list, and nothing else.
type holding struct {
	base  snapshot.TypeSet
	whole bool
	diff  map[string]*snapshot.Resource
}

// heldRes returns what the proxy holds of that name, or nil.
func (s *subscription) heldRes(name string) *snapshot.Resource {
	if r, ok := s.held.diff[name]; ok {
		return r
	}
	return s.implied(name)
}

// implied is what the base says the proxy holds of that name.
func (s *subscription) implied(name string) *snapshot.Resource {
	if !s.held.whole || !s.subscribed(name) {
		return nil
	}
	return s.held.base.Get(name)
}

// hold records that the proxy holds r (nil: nothing) under name.
func (s *subscription) hold(name string, r *snapshot.Resource) {
	if r == s.implied(name) {
		delete(s.held.diff, name)
		return
	}
	if s.held.diff == nil {
		s.held.diff = map[string]*snapshot.Resource{}
	}
	s.held.diff[name] = r
}

// eachHeld calls fn for every resource the proxy holds.
func (s *subscription) eachHeld(fn func(*snapshot.Resource)) { s.eachIn(s.held, fn) }

// eachIn calls fn for every resource of h, as the subscription reads it.
func (s *subscription) eachIn(h holding, fn func(*snapshot.Resource)) {
	for _, r := range h.diff {
		if r != nil {
			fn(r)
		}
	}
	if !h.whole {
		return
	}
	from := func(r *snapshot.Resource) {
		if _, ok := h.diff[r.Name]; !ok {
			fn(r)
		}
	}
	if s.wildcard {
		h.base.All(from)
		return
	}
	s.names.all(func(name string) {
		if r := h.base.Get(name); r != nil {
			from(r)
		}
	})
}

// listed is every resource of h by name, as the subscription reads it.
func (s *subscription) listed(h holding) map[string]*snapshot.Resource {
	all := map[string]*snapshot.Resource{}
	s.eachIn(h, func(r *snapshot.Resource) { all[r.Name] = r })
	return all
}

// heldCount is how many resources the proxy holds.
func (s *subscription) heldCount() int {
	n := 0
	s.eachHeld(func(*snapshot.Resource) { n++ })
	return n
}

// holdNothing forgets what the proxy holds: a new stream knows nothing of it.
func (s *subscription) holdNothing() { s.held = holding{} }

// holdSet records that the proxy holds exactly set's resources for its
// subscription.
func (s *subscription) holdSet(set snapshot.TypeSet) { s.held = holding{base: set, whole: true} }

// subscribing pins what the proxy holds of names about to be subscribed,
// before the subscription changes what the base says of them; a change to
// or from a wildcard, which changes it for every name, drops the base.
func (s *subscription) subscribing(names []string, wildcard bool) {
	if !s.held.whole {
		return
	}
	if wildcard != s.wildcard {
		s.unbase()
		return
	}
	for _, name := range names {
		if _, ok := s.held.diff[name]; !ok && name != "*" && !s.subscribed(name) {
			if s.held.diff == nil {
				s.held.diff = map[string]*snapshot.Resource{}
			}
			s.held.diff[name] = nil // settle drops it if the base agrees
		}
	}
}

// unbase lists everything held in diff and drops the base.
func (s *subscription) unbase() { s.held = holding{diff: s.listed(s.held)} }

// settle keeps the divergence small, without changing what is held, once
// the stream planned or sent from set, the scope's current one: a stream
// with a base moves it to set (pinning first what the proxy holds of the
// names that differ between the two, then dropping what set now implies);
// one without takes set as its base when that leaves less than half the
// divergence. It compares only when the divergence is at least a quarter
// of what it reads (the set, or the names subscribed), so the comparison
// costs no more than what it may save.
func (s *subscription) settle(set snapshot.TypeSet) {
	if s.held.whole {
		snapshot.Changes(s.held.base, set, func(name string) {
			if _, ok := s.held.diff[name]; !ok && s.subscribed(name) {
				if s.held.diff == nil {
					s.held.diff = map[string]*snapshot.Resource{}
				}
				s.held.diff[name] = s.held.base.Get(name)
			}
		})
		s.held.base = set
		for name, r := range s.held.diff {
			if r == s.implied(name) {
				delete(s.held.diff, name)
			}
		}
		return
	}
	scan := s.names.len()
	if s.wildcard {
		scan = set.Len()
	}
	if len(s.held.diff) == 0 || 4*len(s.held.diff) < scan {
		return
	}
	next := map[string]*snapshot.Resource{}
	against := func(r *snapshot.Resource) {
		if h := s.held.diff[r.Name]; h != r {
			next[r.Name] = h
		}
	}
	if s.wildcard {
		set.All(against)
	} else {
		s.names.all(func(name string) {
			if r := set.Get(name); r != nil {
				against(r)
			}
		})
	}
	for name, h := range s.held.diff {
		if h != nil && (!s.subscribed(name) || set.Get(name) == nil) {
			next[name] = h
		}
	}
	if len(next) < len(s.held.diff)/2 {
		s.held = holding{base: set, whole: true, diff: next}
	}
}

func (s *subscription) subscribed(name string) bool {
	if s.wildcard {
		return true
	}
	return s.names.has(name)
}

// holds reports whether the proxy holds exactly r. Versions are content
// hashes, so an equal version is the same resource.
func (s *subscription) holds(r *snapshot.Resource) bool {
	h := s.heldRes(r.Name)
	return h != nil && (h == r || h.Version == r.Version)
}

// forgetUnsubscribed drops what the proxy no longer subscribes to: it drops
// those resources itself, and they are no longer owed.
func (s *subscription) forgetUnsubscribed() {
	for name := range s.held.diff {
		if !s.subscribed(name) {
			delete(s.held.diff, name) // the base implies nothing for it either
		}
	}
	for name := range s.owed {
		if !s.subscribed(name) {
			delete(s.owed, name)
		}
	}
}

// asked tells the feedback how a subscription changed, for the client
// status service and the usage of the scope's Services: the names added
// and removed, and whether it went to or from a wildcard.
func (st *stream) asked(s *subscription, added, removed []string, wildcardBefore bool) {
	t, wildcardAfter := s.t, s.wildcard
	if len(added) == 0 && len(removed) == 0 && wildcardBefore == wildcardAfter {
		return
	}
	st.srv.fb.Subscribed(st.key, st.id, t.URL(), s.names.frozen(), wildcardAfter)
	// Only names the scope serves count: the usage of a Service outlives
	// the stream by the cost window, and made-up names (a client
	// reconnecting with new ones at the pacing rate) must not grow it. The
	// check is made when the subscription changes: a name the proxy named
	// before the scope served it is not counted (its later removal may
	// uncount the Service early), and one the scope stopped serving before
	// the proxy dropped it stays counted until the stream ends. Both are
	// rare for Envoy, which names what the scope announced, and neither
	// holds more than the scope served.
	var asked, dropped []model.Key
	st.read(func(v snapshot.View) {
		services := func(list []string) (out []model.Key) {
			for _, n := range list {
				if v.Get(t, n) == nil {
					continue
				}
				if svc, ok := v.Get(t, n).Service(); ok {
					out = append(out, svc)
				}
			}
			return out
		}
		asked, dropped = services(added), services(removed)
	})
	wildcard := 0
	switch {
	case wildcardAfter && !wildcardBefore:
		wildcard = 1
	case wildcardBefore && !wildcardAfter:
		wildcard = -1
	}
	if len(asked) > 0 || len(dropped) > 0 || wildcard != 0 {
		st.srv.fb.Asks(st.key, st.id, asked, dropped, wildcard)
	}
}

// sent records that a response carried r: the proxy holds it, and it is
// no longer owed.
func (s *subscription) sent(r *snapshot.Resource) {
	s.hold(r.Name, r)
	delete(s.owed, r.Name)
}

// sentAll is sent of every resource of a response planned from set, which
// lists each name once. A stream's first response, which brings a proxy
// that held nothing set's resource of every name it subscribes to, leaves
// it holding set: recorded as that, not name by name for settle to fold.
func (s *subscription) sentAll(res []*snapshot.Resource, set snapshot.TypeSet) {
	if len(res) > 0 && !s.held.whole && len(s.held.diff) == 0 && s.covers(res, set) {
		s.holdSet(set)
		for _, r := range res {
			delete(s.owed, r.Name)
		}
		return
	}
	for _, r := range res {
		s.sent(r)
	}
}

// covers reports whether res, which lists each name once, is set's
// resource of every name subscribed.
func (s *subscription) covers(res []*snapshot.Resource, set snapshot.TypeSet) bool {
	n := set.Len()
	if !s.wildcard {
		n = 0
		s.names.all(func(name string) {
			if set.Get(name) != nil {
				n++
			}
		})
	}
	if len(res) != n {
		return false
	}
	for _, r := range res {
		if r != set.Get(r.Name) || !s.subscribed(r.Name) {
			return false
		}
	}
	return true
}

// rejected records a NACK of the response of version whose names are now
// owed, and reports it with the proxy's error detail and what the rejection
// held back, here and in the other protocol. Beyond the stream's NACK pace
// the rejection is still taken (the stream goes on as the protocol says)
// but only counted: a proxy rejects once per response, so a stream
// rejecting faster is a loop or an attack, and its text must not drive
// status writes and Events.
func (st *stream) rejected(s *subscription, version, detail string, owed map[string]string, held feedback.HeldBack) {
	st.answers++
	maps.Copy(s.owed, owed)
	s.rejecting = true
	if !st.nacks.Allow() {
		metrics.NACKsPaced.WithLabelValues(st.key.String()).Inc()
		return
	}
	st.srv.fb.NACKed(st.key, st.id, s.t.URL(), version, detail, held)
}

// accepted records an ACK of version. Rejected resources not yet sent again
// keep the proxy short of the scope: it stays counted as rejecting.
func (st *stream) accepted(s *subscription, version string) {
	st.answers++
	s.rejecting = len(s.owed) > 0
	st.srv.fb.ACK(st.key, st.id, s.t.URL(), version, !s.rejecting)
}

// eachChange calls fn once for every name of the type that may differ for
// the stream since it caught up: the names the scope's change log lists, or
// every name held or served when the log no longer reaches back. It returns
// the deduplicated fn, for the owed names that follow (sendOwed).
func (s *subscription) eachChange(v snapshot.View, since uint64, fn func(name string)) (once func(name string)) {
	seen := map[string]struct{}{}
	once = func(name string) {
		if _, dup := seen[name]; !dup {
			seen[name] = struct{}{}
			fn(name)
		}
	}
	if !v.ChangedSince(since, s.t, once) {
		s.eachHeld(func(r *snapshot.Resource) { once(r.Name) })
		v.All(s.t, func(r *snapshot.Resource) { once(r.Name) })
	}
	return once
}

// rejectedAgain reports whether a planned change (res upserted, removed
// dropped) is only what the proxy rejected and was owed since, unchanged:
// every name owed, each at the version it was rejected at. Sending it
// would have the proxy reject the same thing again, so it is not a change.
// A planned change reaches owed names unchanged when a scope change lists
// them without changing them (a zone-priority switch, for a proxy in no
// zone) or the scope's change log no longer reaches back and every name is
// compared.
func (s *subscription) rejectedAgain(res []*snapshot.Resource, removed []string) bool {
	if len(res) == 0 && len(removed) == 0 {
		return false
	}
	for _, r := range res {
		if v, ok := s.owed[r.Name]; !ok || v != r.Version {
			return false
		}
	}
	for _, name := range removed {
		if v, ok := s.owed[name]; !ok || v != "" {
			return false
		}
	}
	return true
}

// sendOwed hands the owed names to once when a push sends the type anyway.
func (s *subscription) sendOwed(once func(name string)) {
	for name := range s.owed {
		once(name)
	}
	clear(s.owed)
}

// response is one planned response of either protocol.
type response struct {
	t       xdstype.Type
	version string
	// otherVersion is the version the other protocol's response would
	// carry (SotW responses only: delta's system_version_info is the
	// type's version, a by-name SotW response's is not).
	otherVersion string
	// set is the type's resources in the view the response was planned
	// from: what a full set holds, and what the stream settles on after.
	set snapshot.TypeSet
	res []*snapshot.Resource
	// removed names resources the proxy must drop: sent in delta; in SotW
	// only priced, as what a delta response would have removed.
	removed []string
	// full marks a SotW full-state response, which replaces what the proxy holds.
	full bool
	// connect marks the stream's first response of the type.
	connect bool
	// silent marks a change the other protocol would send and this one
	// does not (a by-name removal in SotW): it is priced, never sent.
	silent bool
	// other prices the response in the other protocol, once priced is
	// set: delta prices SotW while planning, inside the scope's view; SotW
	// prices delta when sending, from what the proxy held before.
	other  otherResponse
	priced bool
}

// otherResponse is what the other protocol would have sent for a
// response: the bytes its resources and removals add, how many resources,
// and in how many responses (0: it would have sent nothing).
type otherResponse struct {
	entries   int
	resources int
	responses int
	// drains counts the responses among them that SotW sends as a
	// make-before-break step, whose version carries the draining suffix.
	drains int
	// typeURL and version, when set, head the responses instead of this
	// response's type and version: the other protocol carries the change
	// as another type (an Envoy-mode scope's virtual hosts are VHDS
	// resources in delta, inline in the route configuration in SotW).
	typeURL, version string
	// vhds counts further responses of virtual hosts at vhdsVersion: where
	// SotW sends an inline route configuration when a stream connects,
	// delta sends the route configuration and then its virtual hosts.
	vhds        int
	vhdsVersion string
}

// price is the other protocol's responses in bytes, each with the header
// this response's version and type would have had there, and the nonce the
// other protocol's stream would have numbered it with, counted in *nonces.
func (o otherResponse) price(version, typeURL string, nonces *uint64) int {
	if o.typeURL != "" {
		typeURL, version = o.typeURL, o.version
	}
	n := o.entries
	header := func(version, typeURL string) int {
		*nonces++
		return cost.Header(version, typeURL, strconv.FormatUint(*nonces, 10))
	}
	for i := range o.responses {
		if i < o.drains {
			n += header(version+draining, typeURL)
		} else {
			n += header(version, typeURL)
		}
	}
	for range o.vhds {
		n += header(o.vhdsVersion, xdstype.VirtualHost.URL())
	}
	return n
}

// deltaVHDS reports whether the scope's Delta proxies fetch (or, for a SotW
// scope, would fetch) its virtual hosts by VHDS: what a SotW stream prices
// the other protocol's route configurations with. Otherwise Delta carries
// them inline, as SotW does.
func deltaVHDS(v snapshot.View) bool {
	spec := v.Spec()
	return spec != nil && spec.Listener.Mode == model.ListenerEnvoy && spec.Listener.VHDS
}

// envoyMode reports whether the view's scope is in Envoy mode, whose
// virtual hosts are VirtualHost resources in both protocols (see
// translate.VHDS), and whether its route configuration fetches them by
// VHDS rather than carrying them inline.
func envoyMode(v snapshot.View) (envoy, vhds bool) {
	spec := v.Spec()
	if spec == nil || spec.Listener.Mode != model.ListenerEnvoy {
		return false, false
	}
	return true, translate.VHDS(spec)
}

// routeOf is the route configuration a VHDS resource belongs to: its name
// before the last slash.
func routeOf(virtualHost string) string {
	if i := strings.LastIndexByte(virtualHost, '/'); i >= 0 {
		return virtualHost[:i]
	}
	return virtualHost
}

// requestedType resolves a request's type URL and checks its name count.
func (st *stream) requestedType(url string, names int) (xdstype.Type, error) {
	t, ok := xdstype.ByURL(url)
	if !ok {
		return 0, unknownType(url)
	}
	if names > st.srv.opts.MaxNamesPerRequest {
		st.srv.fb.Refuse(st.key, RefusedTooManyNames)
		return 0, tooManyNames(names, st.srv.opts.MaxNamesPerRequest)
	}
	return t, nil
}

// catchUp reads the scope once: it ends the stream when the scope no
// longer serves protocol p, else plans the responses that bring the proxy
// to the current revision and marks the stream caught up with it.
func catchUp[R any](st *stream, p model.Protocol, plan func(v snapshot.View) []R) ([]R, error) {
	var (
		out []R
		err error
	)
	st.read(func(v snapshot.View) {
		if err = st.stillServes(v, p); err != nil {
			return
		}
		st.watchTransition(v, p)
		out = plan(v)
		st.caughtUp(v)
	})
	return out, err
}

// sendAll sends planned responses in order and then reports whether the
// proxy is in sync.
func sendAll[R any](st *stream, resps []R, send func(R) error, settled func() bool) error {
	for _, r := range resps {
		if err := send(r); err != nil {
			return err
		}
	}
	st.reportSynced(settled)
	return nil
}

// reportSynced tells feedback the proxy is at the stream's scope version
// once every response was answered and none was rejected (settled).
func (st *stream) reportSynced(settled func() bool) {
	if settled() {
		st.srv.fb.AtVersion(st.key, st.id, st.ver, st.revTime)
	}
}
