package server

import (
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

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
