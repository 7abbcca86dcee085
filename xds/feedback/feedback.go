// Package feedback records what proxies tell the control plane: which
// streams are connected to which scope, what each proxy ACKed or NACKed, and
// which streams were refused and why. The status writer and the metrics read
// it; the ADS server writes it.
package feedback

import (
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/scopeplane/scopeplane/xds/keyset"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
)

// Refusal reasons, as counted per scope.
const (
	RefusedNoScope      = "NoScope"
	RefusedUnknownScope = "UnknownScope"
	RefusedWrongProto   = "WrongProtocol"
)

// Client kinds. The advice to a client refused for its protocol depends on
// its kind: a proxy such as Envoy chooses its protocol in its bootstrap
// (ads_config.api_type), while every gRPC xDS client speaks State of the
// World only, so for it the only fix is the scope's protocol.
const (
	KindGRPC  = "gRPC"
	KindProxy = "proxy"
)

// ClientKind is the kind of the client node says it is: gRPC when its
// user_agent_name starts with "gRPC" (as every gRPC library sets it),
// else a proxy.
func ClientKind(node *corev3.Node) string {
	if ua := node.GetUserAgentName(); len(ua) >= 4 && strings.EqualFold(ua[:4], "grpc") {
		return KindGRPC
	}
	return KindProxy
}

// WrongProtocolKey is the key of LastRefused under which the last
// wrong-protocol refusal of a client of the kind is recorded (besides
// RefusedWrongProto, which records any).
func WrongProtocolKey(kind string) string { return RefusedWrongProto + "/" + kind }

// MaxNACKs bounds how many rejections are kept per scope, newest first.
const MaxNACKs = 10

// NACK is one configuration a proxy rejected. Its text fields are valid
// UTF-8 cut to the limits of status.recentNACKs (MaxNodeChars and the rest):
// Node is the proxy's node id in that form (NodeID).
type NACK struct {
	Node string
	// Peer is the address the proxy's stream came from: gRPC clients of a
	// scope share one node id (their bootstrap is one ConfigMap), so it is
	// what tells them apart.
	Peer string
	// Identity is who the proxy authenticated as (auth.Identity's String),
	// empty for an anonymous stream.
	Identity string
	// Zone is where the proxy runs (model.Location's Zone), "" when unknown.
	Zone    string
	TypeURL string
	Version string
	Detail  string
	Time    time.Time
}

// Proxy is one connected stream.
type Proxy struct {
	ID       uint64
	Node     string
	Protocol model.Protocol
	// Cluster and UserAgent are what the proxy's node says it is (the
	// user agent as "name version"), kept for the proxy-status view.
	Cluster   string
	UserAgent string
	// Peer is the stream's remote address (host:port), which tells apart
	// proxies of one node id, as every gRPC client of a scope is.
	Peer string
	// Identity is who the proxy authenticated as (auth.Identity's String),
	// empty for an anonymous stream: never a metrics label, which stay
	// bounded.
	Identity string
	// Location is where the proxy runs.
	Location model.Location
	// Since is when the stream was bound to the scope.
	Since time.Time
	// Acked is the last version the proxy ACKed, by type URL.
	Acked map[string]string
	// Nacked is set, by type URL, while the proxy's last answer for the type was a NACK.
	Nacked map[string]bool
	// LastNACK is the proxy's most recent rejection, by type URL; it stays
	// after a later ACK, as a record of what went wrong last.
	LastNACK map[string]NACK
	// AtVersion is the scope version the proxy has fully ACKed: everything
	// the scope held at that version was sent to it and accepted.
	AtVersion string
	// asks counts, per Service by its number in the scope's usage, the
	// resource names the proxy subscribes to; wildcards its wildcard
	// subscriptions (see Asks).
	asks      []uint16
	wildcards int
	// subs is what the proxy subscribes to, by type URL (see Subscribed).
	subs map[string]*subscription
}

// Report is what is known about the proxies of one scope.
type Report struct {
	Proxies map[uint64]*Proxy
	Refused map[string]int64
	// LastRefused is when a stream was last refused, by reason; a
	// wrong-protocol refusal also by client kind (WrongProtocolKey).
	LastRefused map[string]time.Time
	// LastAdmitted is when a stream of each client kind was last bound to
	// the scope: a kind admitted after its last wrong-protocol refusal has
	// come back on the right protocol.
	LastAdmitted map[string]time.Time
	NACKs        []NACK
	Sent         Counters
	LastPush     time.Time
	// Cost is what the scope's proxies were sent over the cost window,
	// priced in both protocols (in Get's copy only); Total since the
	// control plane started.
	Cost  CostWindow
	Total Cost
	cost  costRing
	// Usage is which Services the proxies asked for during the cost window
	// (in Get's copy only).
	Usage Usage
	usage usage
}

// Counters accumulate what was sent to a scope's proxies.
type Counters struct {
	Responses int64
	Resources int64
	Bytes     int64
}

// Tracker is safe for concurrent use.
type Tracker struct {
	bucket  time.Duration
	mu      sync.Mutex
	nextID  uint64
	scopes  map[model.Key]*Report
	changed *keyset.Set
	now     func() time.Time
	// sent holds the send counters of each scope, type and protocol, looked
	// up once: a response is counted in five series, and hashing their
	// label values every time was 4% of a proxy's initial sync.
	sent map[sentKey]*sentCounters
}

type sentKey struct {
	scope   model.Key
	typeURL string
	p       model.Protocol
}

type sentCounters struct {
	otherBytes, connectBytes, connectOtherBytes, pushes, resources, bytes prometheus.Counter
}

// sentLocked returns the counters of responses of typeURL sent to proxies
// of the scope over p.
func (t *Tracker) sentLocked(key model.Key, typeURL string, p model.Protocol) *sentCounters {
	k := sentKey{key, typeURL, p}
	if c := t.sent[k]; c != nil {
		return c
	}
	scope, proto := metrics.Scope(key.String()), string(p)
	c := &sentCounters{
		otherBytes:        metrics.OtherProtocolBytes.WithLabelValues(scope, typeURL, proto),
		connectBytes:      metrics.ConnectBytes.WithLabelValues(scope, proto),
		connectOtherBytes: metrics.ConnectOtherProtocolBytes.WithLabelValues(scope, proto),
		pushes:            metrics.Pushes.WithLabelValues(scope, typeURL, proto),
		resources:         metrics.ResourcesSent.WithLabelValues(scope, typeURL, proto),
		bytes:             metrics.BytesSent.WithLabelValues(scope, typeURL, proto),
	}
	t.sent[k] = c
	return c
}

// New returns an empty tracker whose cost window has buckets of
// costBucket (DefaultCostBucket when zero).
func New(costBucket time.Duration) *Tracker {
	if costBucket <= 0 {
		costBucket = DefaultCostBucket
	}
	return NewWithClock(costBucket, time.Now)
}

// NewWithClock is New with the clock it reads: the status's tests replay
// refusals and admissions in an order no wall clock could make ambiguous.
func NewWithClock(costBucket time.Duration, now func() time.Time) *Tracker {
	if costBucket <= 0 {
		costBucket = DefaultCostBucket
	}
	return &Tracker{bucket: costBucket, scopes: map[model.Key]*Report{}, changed: keyset.New(), now: now, sent: map[sentKey]*sentCounters{}}
}

// Changes holds the scopes something was recorded for; the status writer
// takes them.
func (t *Tracker) Changes() *keyset.Set { return t.changed }

func (t *Tracker) scopeLocked(key model.Key) *Report {
	s := t.scopes[key]
	if s == nil {
		s = &Report{Proxies: map[uint64]*Proxy{}, Refused: map[string]int64{}, LastRefused: map[string]time.Time{}, LastAdmitted: map[string]time.Time{}}
		s.cost.width = t.bucket
		t.scopes[key] = s
	}
	return s
}

// proxyLocked is the connected stream id of scope key, or nil: a stream
// reports changes only while it is connected, and a late report after its
// Disconnect is dropped.
func (t *Tracker) proxyLocked(key model.Key, id uint64) *Proxy {
	if s := t.scopes[key]; s != nil {
		return s.Proxies[id]
	}
	return nil
}

// Connect records a new stream of node from peer (its remote address, ""
// when unknown), authenticated as identity ("" when anonymous), running
// at loc, and returns its id.
func (t *Tracker) Connect(key model.Key, node *corev3.Node, p model.Protocol, peer, identity string, loc model.Location) uint64 {
	ua := node.GetUserAgentName()
	if v := node.GetUserAgentVersion(); v != "" {
		ua += " " + v
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nextID++
	t.scopeLocked(key).LastAdmitted[ClientKind(node)] = t.now()
	t.scopeLocked(key).Proxies[t.nextID] = &Proxy{
		ID: t.nextID, Node: node.GetId(), Protocol: p, Cluster: node.GetCluster(), UserAgent: ua, Peer: peer, Identity: identity, Location: loc, Since: t.now(),
		Acked: map[string]string{}, Nacked: map[string]bool{}, LastNACK: map[string]NACK{},
	}
	metrics.ConnectedProxies.WithLabelValues(metrics.Scope(key.String()), string(p)).Inc()
	t.changed.Add(key)
	return t.nextID
}

// Disconnect forgets a stream: per-proxy state lives only as long as its
// stream, so it cannot pile up.
func (t *Tracker) Disconnect(key model.Key, id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.scopes[key]; s != nil {
		if p := s.Proxies[id]; p != nil {
			metrics.ConnectedProxies.WithLabelValues(metrics.Scope(key.String()), string(p.Protocol)).Dec()
			s.usage.forget(p, t.now())
		}
		delete(s.Proxies, id)
	}
	t.changed.Add(key)
}

// ACK records that a proxy accepted a version of a type. clean is false
// while the proxy still lacks resources of the type it rejected earlier:
// it then stays counted as rejecting.
func (t *Tracker) ACK(key model.Key, id uint64, typeURL, version string, clean bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.scopeLocked(key).Proxies[id]; p != nil {
		p.Acked[typeURL] = version
		if clean {
			delete(p.Nacked, typeURL)
		}
	}
	t.changed.Add(key)
}

// AtVersion records that a proxy accepted everything of the scope at
// version, which the control plane observed changing at observed (zero when
// unknown): the difference is the proxy's convergence time.
func (t *Tracker) AtVersion(key model.Key, id uint64, version string, observed time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.scopeLocked(key).Proxies[id]; p != nil && p.AtVersion != version {
		// Only a proxy that was in sync before has converged to a change;
		// one that just connected, or just recovered from a NACK, has not.
		moved := p.AtVersion != ""
		p.AtVersion = version
		if moved && !observed.IsZero() {
			metrics.Convergence.WithLabelValues(string(p.Protocol)).Observe(t.now().Sub(observed).Seconds())
		}
		t.changed.Add(key)
	}
}

// Behind records that a proxy counted at its scope's version lacks part
// of it after all: a reconnecting SotW proxy is counted in sync as soon as
// the types it holds at the served version are taken, and a type it
// requests next, naming an older version, is sent in full. It counts at a
// version again once everything is answered (AtVersion).
func (t *Tracker) Behind(key model.Key, id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.proxyLocked(key, id); p != nil && p.AtVersion != "" {
		p.AtVersion = ""
		t.changed.Add(key)
	}
}

// HeldBack is what a rejected response kept from the proxy: how many
// resources it carried, and how many the other protocol's response for the
// same change would have (its blast radius there).
type HeldBack struct{ Resources, OtherResources int }

// NACKed records that a proxy rejected a version of a type. What the
// proxy sent is kept only as the NACK's cut text, whatever its length or
// encoding.
func (t *Tracker) NACKed(key model.Key, id uint64, typeURL, version, detail string, held HeldBack) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.scopeLocked(key)
	p := s.Proxies[id]
	if p == nil {
		return
	}
	p.Nacked[typeURL] = true
	p.AtVersion = ""
	metrics.NACKs.WithLabelValues(metrics.Scope(key.String()), typeURL).Inc()
	n := NACK{
		Node: NodeID(p.Node), Peer: p.Peer, Identity: p.Identity, Zone: p.Location.Zone, TypeURL: Cut(typeURL, MaxTypeURLChars, math.MaxInt), Version: Cut(version, MaxVersionChars, math.MaxInt),
		Detail: Cut(detail, MaxDetailChars, math.MaxInt), Time: t.now(),
	}
	p.LastNACK[typeURL] = n
	c := Cost{NACKs: 1, HeldBack: int64(held.Resources), OtherHeldBack: int64(held.OtherResources)}
	s.cost.at(n.Time).add(&c)
	s.Total.add(&c)
	scope := metrics.Scope(key.String())
	metrics.HeldBack.WithLabelValues(scope, string(p.Protocol)).Add(float64(held.Resources))
	metrics.OtherProtocolHeldBack.WithLabelValues(scope, string(p.Protocol)).Add(float64(held.OtherResources))
	s.NACKs = append([]NACK{n}, s.NACKs...)
	if len(s.NACKs) > MaxNACKs {
		s.NACKs = s.NACKs[:MaxNACKs]
	}
	t.changed.Add(key)
}

// RefuseWrongProtocol counts a stream of the scope refused for its
// protocol, from a client of the kind (ClientKind).
func (t *Tracker) RefuseWrongProtocol(key model.Key, kind string) {
	t.Refuse(key, RefusedWrongProto)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.scopeLocked(key).LastRefused[WrongProtocolKey(kind)] = t.now()
}

// Refuse counts a refused stream for a scope (the zero Key when the proxy
// named none, or none that exists, so that made-up names cannot grow the
// tracker).
func (t *Tracker) Refuse(key model.Key, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.scopeLocked(key)
	s.Refused[reason]++
	s.LastRefused[reason] = t.now()
	scope := ""
	if key != (model.Key{}) {
		scope = key.String()
	}
	metrics.Refusals.WithLabelValues(metrics.Scope(scope), reason).Inc()
	t.changed.Add(key)
}

// Sent counts one response sent to a proxy of the scope, and what the
// other protocol would have sent instead.
func (t *Tracker) Sent(key model.Key, p model.Protocol, typeURL string, push Push) {
	sent := push.Bytes > 0
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.sentLocked(key, typeURL, p)
	m.otherBytes.Add(float64(push.OtherBytes))
	if push.Connect {
		m.connectBytes.Add(float64(push.Bytes))
		m.connectOtherBytes.Add(float64(push.OtherBytes))
	}
	if sent {
		m.pushes.Inc()
		m.resources.Add(float64(push.Resources))
		m.bytes.Add(float64(push.Bytes))
	}
	s := t.scopeLocked(key)
	now := t.now()
	c := Cost{Bytes: int64(push.Bytes), OtherBytes: int64(push.OtherBytes)}
	if push.Connect {
		c.Connects, c.ConnectBytes, c.ConnectOtherBytes = 1, int64(push.Bytes), int64(push.OtherBytes)
	}
	if sent {
		c.Pushes = 1
	}
	s.cost.at(now).add(&c)
	s.Total.add(&c)
	if !sent {
		return
	}
	s.Sent.Responses++
	s.Sent.Resources += int64(push.Resources)
	s.Sent.Bytes += int64(push.Bytes)
	s.LastPush = now
}

// Get returns a copy of what is known about a scope.
func (t *Tracker) Get(key model.Key) Report {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.scopes[key]
	if s == nil {
		return Report{Proxies: map[uint64]*Proxy{}, Refused: map[string]int64{}, LastRefused: map[string]time.Time{},
			Cost: CostWindow{Bucket: t.bucket}}
	}
	out := Report{Proxies: make(map[uint64]*Proxy, len(s.Proxies)), Refused: make(map[string]int64, len(s.Refused)),
		LastRefused: make(map[string]time.Time, len(s.LastRefused)),
		NACKs:       append([]NACK(nil), s.NACKs...), Sent: s.Sent, LastPush: s.LastPush, Cost: s.cost.window(t.now()), Total: s.Total,
		Usage: s.usage.within(CostBuckets*t.bucket, t.now())}
	for id, p := range s.Proxies {
		c := *p
		c.Acked = maps.Clone(p.Acked)
		c.asks, c.subs = nil, nil
		c.Nacked = maps.Clone(p.Nacked)
		c.LastNACK = maps.Clone(p.LastNACK)
		out.Proxies[id] = &c
	}
	for k, v := range s.Refused {
		out.Refused[k] = v
	}
	for k, v := range s.LastRefused {
		out.LastRefused[k] = v
	}
	out.LastAdmitted = maps.Clone(s.LastAdmitted)
	return out
}

// Connected returns the scopes that have at least one connected proxy, in
// order.
func (t *Tracker) Connected() []model.Key {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []model.Key
	for key, s := range t.scopes {
		if len(s.Proxies) > 0 && key != (model.Key{}) {
			out = append(out, key)
		}
	}
	slices.SortFunc(out, model.Key.Compare)
	return out
}
