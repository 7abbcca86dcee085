package server

import (
	"cmp"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/cost"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/translate"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// pricer frames what a stream sends for the other protocol, from sizes, so
// that every push is priced in both (docs/choosing-a-protocol.md): a SotW
// stream's in delta (deltaPricing), a delta stream's in SotW
// (sotwPricing). Like go-control-plane's Callbacks it is a side concern:
// the protocol handlers call it at fixed points of a push or an answer and
// never read what it computes, and it reads only what is shared (the
// subscription, the planned responses, the view), never a protocol's own
// state.
type pricer interface {
	// planned is told, inside the view they were planned from and before
	// any is sent, each type's change of a push (push set) or of the
	// answer to a request, and the subscriptions (nil where none); since
	// is the revision the stream caught up with before.
	planned(v snapshot.View, since uint64, subs [xdstype.Count]*subscription, changes [xdstype.Count]*response, push bool)
	// sending is told each response as the protocol frames it, in order,
	// before it is sent (or passed over, when the protocol frames a change
	// as nothing), while s still says what the proxy held before it.
	sending(s *subscription, r *response)
	// sent returns what the other protocol's responses for r cost, in
	// bytes, and remembers r as the response of nonce ("" for one not
	// sent) until the proxy answers it.
	sent(r *response, nonce string) int
	// answered forgets the response of nonce of type t, now answered, and
	// returns how many resources the other protocol's responses for it
	// carried: what a rejection holds back there.
	answered(t xdstype.Type, nonce string) int
	// forgot is told that the stream forgot its unanswered responses of t.
	forgot(t xdstype.Type)
}

// newPricer returns the pricer of a stream of protocol p.
func newPricer(p model.Protocol) pricer {
	if p == model.Delta {
		return &sotwPricing{}
	}
	return &deltaPricing{}
}

// pricing is what both pricers keep: the nonces the other protocol's
// stream would have numbered its responses with.
type pricing struct {
	// nonces counts the responses the other protocol would have sent on
	// this stream, whose nonces its headers are priced with: delta sends
	// one more when a stream connects to a VHDS scope.
	nonces uint64
}

// bytes prices r's other responses, each with the header it would have
// had there: the type's version (or the version the other protocol frames
// it with) and the next nonce.
func (p *pricing) bytes(r *response) int {
	return r.other.price(r.typeVersion, r.t.URL(), &p.nonces)
}

// unanswered is a response sent and not yet answered: its type, and how
// many resources the other protocol's responses for it carried.
type unanswered struct {
	t         xdstype.Type
	resources int
}

// deltaPricing prices a SotW stream's responses as delta would have sent
// them: from what the stream knows its proxy held before each, so at the
// moment it is sent, unless it was priced while planning (from the view).
type deltaPricing struct {
	pricing
	// last is, per type, the nonce of the last response sent and what it
	// carried there: a SotW proxy answers only the last one.
	last [xdstype.Count]struct {
		nonce string
		unanswered
	}
}

func (p *deltaPricing) planned(v snapshot.View, since uint64, subs [xdstype.Count]*subscription, changes [xdstype.Count]*response, push bool) {
	if push {
		splitInDelta(subs, changes)
	}
	for t, r := range changes {
		switch {
		case r == nil:
		case r.claimed:
			// A delta proxy declares what it holds, all of it at the
			// served version, and is sent what claimPrice prices.
			r.other, r.priced = claimPrice(v, r.t), true
		case r.t == xdstype.Route && deltaVHDS(v) && (!r.removesOnly() || subs[t].wildcard):
			// A route configuration SotW sends (it sends nothing for a
			// by-name removal, which delta sends as one).
			r.other, r.priced = priceVHDS(v, since, r), true
		}
	}
}

func (p *deltaPricing) sending(s *subscription, r *response) {
	if !r.priced {
		r.other, r.priced = priceDelta(s, r), true
	}
}

// sent keeps only the type's last response: SotW answers supersede.
func (p *deltaPricing) sent(r *response, nonce string) int {
	if nonce != "" {
		p.last[r.t].nonce, p.last[r.t].unanswered = nonce, unanswered{t: r.t, resources: r.other.resources}
	}
	return p.bytes(r)
}

func (p *deltaPricing) answered(t xdstype.Type, nonce string) int {
	last := &p.last[t]
	if nonce == "" || last.nonce != nonce {
		return 0
	}
	n := last.resources
	p.forgot(t)
	return n
}

func (p *deltaPricing) forgot(t xdstype.Type) {
	p.last[t].nonce, p.last[t].unanswered = "", unanswered{}
}

// sotwPricing prices a delta stream's responses as SotW would have sent
// them, from the view while planning: SotW frames a full-state type's
// change as its whole subscribed set, whose size the view keeps.
type sotwPricing struct {
	pricing
	// waiting holds, by nonce, the responses sent and not yet answered.
	waiting map[string]unanswered
	// parts is, per type, the SotW responses of the push being sent, split
	// as delta splits the type's change into its upserts and its removals;
	// nil between pushes.
	parts map[xdstype.Type]parts
	// last is, per type, the nonce of the last response that SotW would
	// have answered with a response of the type too: while it is
	// unanswered, a SotW stream would have its response unanswered (see
	// sotw.version).
	last [xdstype.Count]string
}

// parts is the SotW responses that would have carried a type's change in
// a push: those of its upserts (adds) and of its removals (rms), and
// whether the change has each.
type parts struct {
	adds, rms       otherResponse
	hasAdds, hasRms bool
}

func (p *sotwPricing) planned(v snapshot.View, _ uint64, subs [xdstype.Count]*subscription, changes [xdstype.Count]*response, push bool) {
	for t, r := range changes {
		if r != nil {
			_, pending := p.waiting[p.last[t]]
			r.other, r.priced = priceSotW(v, subs[t], r, r.connect, pending), !push
		}
	}
	if !push {
		return
	}
	if rc, vh := changes[xdstype.Route], changes[xdstype.VirtualHost]; rc != nil && vh != nil && rc.other.responses > 0 {
		if _, vhds := envoyMode(v); vhds {
			// The route configuration SotW would send carries the virtual
			// hosts: priced once, there.
			vh.other = otherResponse{}
		}
	}
	removesLater := false
	for _, r := range changes {
		if r != nil && !r.t.Info().RemovedLast {
			removesLater = true
		}
	}
	p.parts = nil
	for t, r := range changes {
		if r == nil {
			continue
		}
		if p.parts == nil {
			p.parts = map[xdstype.Type]parts{}
		}
		pt := parts{adds: r.other, hasAdds: len(r.res) > 0, hasRms: len(r.removed) > 0}
		if removesLater && r.t.Info().RemovedLast && len(r.removed) > 0 && r.t.FullState() {
			// Make before break: SotW first sends the full set with the
			// departing resources still in, and drops them only in a
			// second, final set after the listeners and routes, when
			// dropping them first would move traffic (movesTraffic).
			if gone := held(subs[t], r.removed); len(gone) > 0 && movesTraffic(gone, r.set) {
				pt.rms = r.other
				pt.adds.entries += departing(gone)
				pt.adds.drains = 1
			}
		}
		p.parts[r.t] = pt
	}
}

// sending prices a push's response from its type's parts: a response
// carrying both the upserts and the removals, or the only part there is,
// carries the SotW responses of both. The type's parts are dropped with
// its last response.
func (p *sotwPricing) sending(_ *subscription, r *response) {
	if r.priced {
		return
	}
	pt := p.parts[r.t]
	if len(r.removed) > 0 || !pt.hasRms {
		if delete(p.parts, r.t); len(p.parts) == 0 {
			p.parts = nil
		}
	}
	switch {
	case len(r.res) > 0 && (len(r.removed) > 0 || !pt.hasRms):
		r.other = sumOther(pt.adds, pt.rms)
	case len(r.res) > 0:
		r.other = pt.adds
	case pt.hasAdds:
		r.other = pt.rms
	default:
		r.other = sumOther(pt.rms, pt.adds)
	}
	r.priced = true
}

func (p *sotwPricing) sent(r *response, nonce string) int {
	if nonce != "" {
		if p.waiting == nil {
			p.waiting = map[string]unanswered{}
		}
		p.waiting[nonce] = unanswered{t: r.t, resources: r.other.resources}
		if r.other.responses > 0 && r.other.typeURL == "" {
			p.last[r.t] = nonce
		}
	}
	return p.bytes(r)
}

func (p *sotwPricing) answered(t xdstype.Type, nonce string) int {
	u, ok := p.waiting[nonce]
	if !ok || u.t != t {
		return 0
	}
	delete(p.waiting, nonce)
	return u.resources
}

func (p *sotwPricing) forgot(t xdstype.Type) {
	for nonce, u := range p.waiting {
		if u.t == t {
			delete(p.waiting, nonce)
		}
	}
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
	// pipelined marks the first of them as a SotW by-name response sent
	// while the one before it was unanswered, whose version says so.
	pipelined bool
	// typeURL, when set, heads the responses instead of this response's
	// type: the other protocol carries the change as another type (an
	// Envoy-mode scope's virtual hosts are VHDS resources in delta, inline
	// in the route configuration in SotW). version, when set, is their
	// version: SotW's by-name versions cover the names subscribed, and so
	// differ from delta's, the type's.
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
	typeURL, version = cmp.Or(o.typeURL, typeURL), cmp.Or(o.version, version)
	n := o.entries
	header := func(version, typeURL string) int {
		*nonces++
		// The random part of a nonce (nextNonce) has a fixed length.
		return cost.Header(version, typeURL, strconv.FormatUint(*nonces, 10)+"."+strings.Repeat("0", nonceRandom))
	}
	for i := range o.responses {
		switch {
		case i < o.drains:
			n += header(version+draining, typeURL)
		case i == 0 && o.pipelined:
			n += header(version+pipelined, typeURL)
		default:
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

// claimPrice is what delta sends a proxy of type t that declares, on a new
// stream, exactly what is served: one empty response of the type (and,
// for route configurations fetching their virtual hosts by VHDS, one of
// those). Pricing it takes their nonces, so later prices stay in step.
func claimPrice(v snapshot.View, t xdstype.Type) otherResponse {
	o := otherResponse{responses: 1}
	if t == xdstype.Route && deltaVHDS(v) {
		o.vhds, o.vhdsVersion = 1, v.TypeVersion(xdstype.VirtualHost)
	}
	return o
}

// priceDelta is the delta response that would have brought the proxy what
// r brings, from what the stream knows it holds before r: the resources it
// lacks, and the removals of what a full set drops or a by-name change
// removed. A delta proxy answers a first request even when nothing differs.
func priceDelta(ts *subscription, r *response) otherResponse {
	var o otherResponse
	for _, res := range r.res {
		if !ts.holds(res) {
			o.entries += cost.DeltaEntry(res.Name, res.Version, res.Size)
			o.resources++
		}
	}
	removed := len(r.removed) + len(r.missing)
	for _, name := range r.removed {
		o.entries += cost.Removed(name)
	}
	for _, name := range r.missing {
		// Delta announces a name subscribed explicitly that is not
		// served, so that the proxy does not wait for it.
		o.entries += cost.Removed(name)
	}
	if r.full {
		keep := make(map[string]struct{}, len(r.res))
		for _, res := range r.res {
			keep[res.Name] = struct{}{}
		}
		ts.eachHeld(func(h *snapshot.Resource) {
			if _, ok := keep[h.Name]; !ok {
				o.entries += cost.Removed(h.Name)
				removed++
			}
		})
	}
	if o.resources > 0 || removed > 0 || r.connect {
		o.responses = 1
	}
	if r.splitInDelta && o.resources > 0 && removed > 0 {
		o.responses = 2
	}
	return o
}

// splitInDelta marks the SotW responses of a push that delta would send
// as two, its upserts and its removals apart (delta.plan): upserts go in
// ADS order and removals after them, children first, and a type's two go
// in one response only when its upserts are the last and its removals
// the first, nothing between them. A SotW push sends each type once, its
// departing resources dropped by omission; it makes before breaking (two
// responses of its own) only where traffic would move (movesTraffic).
func splitInDelta(subs [xdstype.Count]*subscription, changes [xdstype.Count]*response) {
	lastAdds, lastRms := -1, -1
	var adds, rms [xdstype.Count]bool
	for t, r := range changes {
		if r == nil || subs[t] == nil {
			continue
		}
		ts := subs[t]
		for _, res := range r.res {
			if !ts.holds(res) {
				adds[t] = true
				break
			}
		}
		rms[t] = len(r.removed) > 0
		if r.full && !rms[t] {
			rms[t] = dropsHeld(ts, r.res)
		}
		if adds[t] {
			lastAdds = t
		}
		if rms[t] {
			lastRms = max(lastRms, t)
		}
	}
	for t, r := range changes {
		if r != nil && adds[t] && rms[t] && (t != lastAdds || t != lastRms) {
			r.splitInDelta = true
		}
	}
}

// priceVHDS is the delta response that would have brought the proxy what
// r, an Envoy-mode scope's inline route configuration, brings, where delta
// fetches the virtual hosts by VHDS (deltaVHDS). On a stream's
// first one that is the route configuration naming VHDS as its source and
// then a response of every virtual host; after, only the virtual hosts that
// changed since the stream last looked, and the removals of those gone (an
// upper bound, every virtual host, when the scope's log no longer reaches
// back that far).
func priceVHDS(v snapshot.View, since uint64, r *response) otherResponse {
	vhVersion := v.TypeVersion(xdstype.VirtualHost)
	if r.connect {
		o := otherResponse{responses: 1, vhds: 1, vhdsVersion: vhVersion}
		for _, rc := range r.res {
			value, err := proto.MarshalOptions{Deterministic: true}.Marshal(translate.VHDSRouteConfig(rc.Name))
			if err != nil {
				continue // names are valid UTF-8: cannot happen
			}
			o.entries += cost.DeltaEntry(rc.Name, snapshot.ContentVersion(value), snapshot.NewResource(xdstype.Route, rc.Name, "", value).Size)
			o.resources++
		}
		v.All(xdstype.VirtualHost, func(vh *snapshot.Resource) {
			o.entries += cost.DeltaEntry(vh.Name, vh.Version, vh.Size)
			o.resources++
		})
		return o
	}
	o := otherResponse{typeURL: xdstype.VirtualHost.URL(), version: vhVersion}
	removed := 0
	seen := map[string]struct{}{}
	add := func(name string) {
		if _, dup := seen[name]; dup {
			return
		}
		seen[name] = struct{}{}
		if vh := v.Get(xdstype.VirtualHost, name); vh != nil {
			o.entries += cost.DeltaEntry(vh.Name, vh.Version, vh.Size)
			o.resources++
		} else {
			o.entries += cost.Removed(name)
			removed++
		}
	}
	if !v.ChangedSince(since, xdstype.VirtualHost, add) {
		v.All(xdstype.VirtualHost, func(vh *snapshot.Resource) { add(vh.Name) })
	}
	if o.resources > 0 || removed > 0 {
		o.responses = 1
	}
	return o
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
func priceSotW(v snapshot.View, ts *subscription, r *response, all, pending bool) otherResponse {
	o := sotwChange(v, ts, r, all)
	if o.responses == 0 || o.typeURL != "" {
		return o
	}
	if !ts.wildcard {
		digest := ts.namesDigest
		if len(r.removed) > 0 {
			// SotW's response to a removal is versioned over the names
			// the proxy keeps (sotw.versionWithout).
			for _, name := range r.removed {
				digest ^= snapshot.NameDigest(name)
			}
		}
		o.version = snapshot.SubsetVersion(v.TypeVersion(ts.t), digest)
	}
	// A by-name proxy's empty response after a removal ends a push, which
	// SotW sends only once the proxy took the responses before.
	o.pipelined = pending && !ts.t.FullState() && (o.resources > 0 || ts.wildcard)
	return o
}

// sotwChange is the SotW responses of priceSotW, headed by delta's type
// and version.
func sotwChange(v snapshot.View, ts *subscription, r *response, all bool) otherResponse {
	if all && len(r.res) == 0 && len(r.removed) == 0 && ts.holdsAny() {
		// A reconnect declaring exactly what is served: a SotW proxy
		// holding the same names the served version and is sent nothing
		// (a delta proxy is no gRPC client, whose by-name claims SotW
		// does not adopt: see sotw.adopt).
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
	if len(r.removed) > 0 && o.responses == 0 {
		// SotW sends no removal, but when nothing else of the type
		// changed, ends the push with an empty response that moves the
		// proxy's version (for a by-name proxy, as Envoy subscribes to
		// assignments and routes, to the names it keeps once it dropped
		// these with their clusters or listeners; see sotw.adopt).
		o.responses = 1
	}
	return o
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

// dropsHeld reports whether ts holds a resource that a full set of res
// drops.
func dropsHeld(ts *subscription, res []*snapshot.Resource) bool {
	keep := make(map[string]struct{}, len(res))
	for _, r := range res {
		keep[r.Name] = struct{}{}
	}
	drops := false
	ts.eachHeld(func(h *snapshot.Resource) {
		if _, ok := keep[h.Name]; !ok {
			drops = true
		}
	})
	return drops
}

// held is what ts holds of the names removed.
func held(ts *subscription, removed []string) []*snapshot.Resource {
	out := make([]*snapshot.Resource, 0, len(removed))
	for _, name := range removed {
		if h := ts.heldRes(name); h != nil {
			out = append(out, h)
		}
	}
	return out
}

// departing is what the resources a removal takes away, as the proxy holds
// them (gone), add to a SotW response.
func departing(gone []*snapshot.Resource) int {
	n := 0
	for _, h := range gone {
		n += cost.SotWEntry(h.Size)
	}
	return n
}
