package server

import (
	"maps"

	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
)

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

// rejected records a NACK of the response of nonce and version, which
// carried resources and whose names are now owed, and reports it with the
// proxy's error detail and what the rejection held back, here and (as the
// pricer says) in the other protocol. Beyond the stream's NACK pace
// the rejection is still taken (the stream goes on as the protocol says)
// but only counted: a proxy rejects once per response, so a stream
// rejecting faster is a loop or an attack, and its text must not drive
// status writes and Events.
func (st *stream) rejected(s *subscription, nonce, version, detail string, owed map[string]string, resources int) {
	st.answers++
	held := feedback.HeldBack{Resources: resources, OtherResources: st.price.answered(s.t, nonce)}
	maps.Copy(s.owed, owed)
	s.rejecting = true
	if !st.nacks.Allow() {
		metrics.NACKsPaced.WithLabelValues(metrics.Scope(st.key.String())).Inc()
		return
	}
	st.srv.fb.NACKed(st.key, st.id, s.t.URL(), version, detail, held)
}

// accepted records an ACK of the response of nonce ("" for none: a claim
// taken as answered) at version. Rejected resources not yet sent again
// keep the proxy short of the scope: it stays counted as rejecting.
func (st *stream) accepted(s *subscription, nonce, version string) {
	st.answers++
	st.price.answered(s.t, nonce)
	s.rejecting = len(s.owed) > 0
	st.srv.fb.ACK(st.key, st.id, s.t.URL(), version, !s.rejecting)
}

// reportSynced tells feedback the proxy is at the stream's scope version
// once every response was answered and none was rejected (settled).
func (st *stream) reportSynced(settled func() bool) {
	if settled() {
		st.srv.fb.AtVersion(st.key, st.id, st.ver, st.revTime)
	}
}

// sent tells the feedback what a response cost, on the wire (bytes; 0 for
// a change the protocol sends nothing for) and in the other protocol, and
// has the pricer remember the response of nonce until it is answered.
func (st *stream) sent(r *response, nonce string, bytes int) {
	st.srv.fb.Sent(st.key, st.protocol, r.t.URL(), feedback.Push{
		Resources: len(r.res), Bytes: bytes, Connect: r.connect,
		OtherBytes: st.price.sent(r, nonce),
	})
}
