package server

import (
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// response is one type's part of a push, or the answer to a request: the
// change the stream owes its proxy (the resources it lacks, res, and those
// it must drop, removed), as the protocol frames it (version, full). A
// protocol may frame a change as nothing at all (SotW, for a by-name
// type's removals, which the proxy makes itself).
type response struct {
	t       xdstype.Type
	version string
	// typeVersion is the type's version in the view the response was
	// planned from, whatever version the protocol frames it with.
	typeVersion string
	// set is the type's resources in the view the response was planned
	// from: what a full set holds, and what the stream settles on after.
	set snapshot.TypeSet
	res []*snapshot.Resource
	// removed names resources the proxy must drop; missing, names the
	// proxy just subscribed to that the scope does not serve (a protocol
	// may announce them, so that the proxy does not wait for them).
	removed, missing []string
	// full marks a SotW full-state response, which replaces what the proxy holds.
	full bool
	// connect marks the stream's first response of the type; claimed, one
	// answering a proxy that claims, as it connects, to hold what the scope
	// serves (for a SotW full-state type nothing is sent then).
	connect, claimed bool
	// other is the response in the other protocol, which only the stream's
	// pricer reads and writes (price.go); priced is set once it is.
	other  otherResponse
	priced bool
	// splitInDelta marks a SotW response whose upserts and removals delta
	// would send apart, with other types' changes between them (see
	// delta.plan): the pricer counts two delta responses for it.
	splitInDelta bool
}

// removesOnly reports whether the change only removes resources.
func (r *response) removesOnly() bool { return len(r.res) == 0 && len(r.removed) > 0 }

// only is the changes of a request's answer: r, of one type.
func only(r *response) (changes [xdstype.Count]*response) {
	changes[r.t] = r
	return changes
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

// draining marks the version of a make-before-break response.
const draining = "-draining"

// movesTraffic reports whether a SotW push that drops departing resources
// of a full-state type (clusters, listeners), while other types change,
// may move live traffic from one of them to a resource of set that stays:
// only then must the push make before it breaks, sending the full set with
// the departing ones still in, then the routes, then the final set (sotw.
// plan). A route that names a resource the proxy no longer holds fails its
// requests (Envoy: 503 NC; gRPC: UNAVAILABLE), which matters only for
// requests that would have gone somewhere once the push is done: a
// Service whose port changed (its bare host names pass from the departing
// port's cluster to the new one's), or a short host name that passes to a
// Service of the same name in another namespace when its holder goes. A
// departing resource of a Service no other Service shares a name with
// takes its host names with it, and its requests fail either way, so the
// full set sent once, without it, is enough. A resource of no Service (an
// Envoy-mode listener) is assumed to move traffic, and so is one served as
// a mesh route's backend: the route that named it moves its requests
// elsewhere, under host names that stay.
func movesTraffic(departing []*snapshot.Resource, set snapshot.TypeSet) bool {
	names := make(map[string]struct{}, len(departing))
	for _, r := range departing {
		svc, ok := r.Service()
		if !ok || r.From.Backend {
			return true
		}
		names[svc.Name] = struct{}{}
	}
	moves := false
	set.All(func(r *snapshot.Resource) {
		if svc, ok := r.Service(); ok && !moves {
			_, moves = names[svc.Name]
		}
	})
	return moves
}

// pipelined marks the version of a by-name response sent while an earlier
// one of its type was unanswered.
const pipelined = "-pipelined"
