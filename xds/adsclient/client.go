// Package adsclient is an xDS ADS client that behaves on the wire the way Envoy does, for both
// State-of-the-World (StreamAggregatedResources) and Delta (DeltaAggregatedResources).
//
// It exists so that tests and the benchmark harness can drive scopeplane's ADS server with a
// client whose ACK/NACK, subscription and reconnect behaviour is spec-faithful, including the
// parts grpc-go's xDS client cannot exercise (delta, initial_resource_versions, NACKs on demand).
// A Client keeps what it holds across streams, so calling Run again after a stream ends is a
// reconnect, exactly as a proxy would do it.
package adsclient

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// Wildcard is the resource name that stands for "every resource of the type", usable with
// Subscribe and Unsubscribe like any other name.
const Wildcard = "*"

// Protocol selects the ADS flavour a Client speaks, because a proxy picks exactly one per stream
// (Envoy's ads_config.api_type GRPC or DELTA_GRPC).
type Protocol int

const (
	// SotW is State-of-the-World ADS: every request carries the full subscription and every
	// response for Listener and Cluster carries the full set.
	SotW Protocol = iota
	// Delta is incremental ADS: requests carry subscription changes and responses carry only
	// changed resources plus the names of removed ones.
	Delta
)

// String returns the protocol's name as the ProxyScope API spells it, so logs and test names
// match what users write.
func (p Protocol) String() string {
	switch p {
	case SotW:
		return "SotW"
	case Delta:
		return "Delta"
	default:
		return "Protocol(?)"
	}
}

// Config describes one client: its protocol, its node identity, what it subscribes to and how it
// judges responses. It is read by New and not retained by reference except for the callbacks.
type Config struct {
	// Protocol is the ADS flavour; the zero value is SotW.
	Protocol Protocol
	// Node identifies the client. SotW sends it on every request (Envoy's default); Delta sends it
	// on the first request of each stream only, as the delta protocol requires.
	Node *corev3.Node
	// Types lists type URLs in the order their first requests are sent (CDS before EDS, LDS
	// before RDS, as Envoy does). Types named only in Wildcard or Names follow in sorted order.
	// A type listed here with neither a wildcard nor names keeps its place in the order but sends
	// nothing until Subscribe gives it an interest, like an Envoy with no watch for that type.
	Types []string
	// Wildcard marks types subscribed as wildcard: an empty resource_names on the first SotW
	// request (legacy wildcard), "*" in resource_names_subscribe for Delta.
	Wildcard map[string]bool
	// Names holds the explicitly subscribed resource names per type.
	Names map[string][]string
	// Reject, if set, is asked about every response that passed the client's own checks and
	// returns a non-empty error detail to NACK it. resources are the Any payloads as received
	// (Delta: each Resource's payload; resources without one are left out); removed is Delta's
	// removed_resources (nil for SotW). It is called from Run's goroutine with no lock held.
	Reject func(typeURL string, resources []*anypb.Any, removed []string) string
	// Validate makes the client decode every received resource and run its generated
	// ValidateAll, NACKing failures as Envoy does. It costs CPU, so the benchmark leaves it off;
	// without it the client only checks what it needs to key resources by name.
	Validate bool
	// RecordEvents keeps every processed response as an Event, readable with Events. It is off
	// by default because a benchmark with thousands of clients cannot afford the history.
	RecordEvents bool
	// OnEvent, if set, is called after each processed response (applied or NACKed), from Run's
	// goroutine with no lock held, so harnesses can timestamp convergence without polling.
	OnEvent func(Event)
}

// WildcardConfig is a client of protocol p for node that subscribes to
// every type p has as wildcard, validating what it receives as Envoy does:
// a proxy that wants all its scope serves.
func WildcardConfig(p Protocol, node *corev3.Node) Config {
	cfg := Config{Protocol: p, Node: node, Validate: true, Wildcard: map[string]bool{}}
	for _, t := range xdstype.All() {
		if p == SotW && t.Info().DeltaOnly {
			continue
		}
		cfg.Types = append(cfg.Types, t.URL())
		cfg.Wildcard[t.URL()] = true
	}
	return cfg
}

// Held is one resource as the client holds it after applying responses.
type Held struct {
	// Version is the resource's version: the response's version_info for SotW, the Resource's
	// own version for Delta.
	Version string
	// Resource is the payload as received; it is shared and must not be modified. It is nil for
	// a Delta resource sent without a payload.
	Resource *anypb.Any
}

// Event describes one response the client processed, in the order processed, so tests can count
// responses (for example, that a NACK does not start a resend loop) and see what each carried.
type Event struct {
	TypeURL string
	// Version is version_info (SotW) or system_version_info (Delta).
	Version string
	Nonce   string
	// Names are the names of the resources the response carried, in response order.
	Names []string
	// Removed are Delta's removed resource names; always nil for SotW.
	Removed []string
	// Accepted reports whether the response was ACKed and applied; when false, ErrorDetail holds
	// the NACK's message and the held state was left unchanged.
	Accepted    bool
	ErrorDetail string
	// Bytes is proto.Size of the response.
	Bytes int
	// Received is when the response was read off the stream.
	Received time.Time
}

// Counts are traffic counters, kept per type and in total, because the benchmark's cost model is
// bytes and resources on the wire per event.
type Counts struct {
	// Responses counts responses received for subscribed types.
	Responses int64
	// Resources counts resources carried by those responses.
	Resources int64
	// Removed counts names received in Delta removed_resources.
	Removed int64
	// Bytes sums proto.Size of every response received, subscribed or not.
	Bytes int64
	// Requests counts every request sent, including ACKs and NACKs.
	Requests int64
	// ACKs and NACKs count requests sent in answer to a response.
	ACKs  int64
	NACKs int64
	// Unrequested counts resources a response carried that the client had not subscribed to;
	// like Envoy, the client drops them, and a correct server sends none.
	Unrequested int64
	// Ignored counts responses for types with no subscription on the stream; Envoy ignores
	// them too (without ACK), so a correct server sends none.
	Ignored int64
}

func (c *Counts) add(o Counts) {
	c.Responses += o.Responses
	c.Resources += o.Resources
	c.Removed += o.Removed
	c.Bytes += o.Bytes
	c.Requests += o.Requests
	c.ACKs += o.ACKs
	c.NACKs += o.NACKs
	c.Unrequested += o.Unrequested
	c.Ignored += o.Ignored
}

// Stats is a snapshot of the client's counters: the embedded Counts are totals, ByType splits
// them per type URL.
type Stats struct {
	Counts
	ByType map[string]Counts
}

// subscription is the client's interest in one type plus the per-stream protocol state for it.
type subscription struct {
	wildcard bool
	names    map[string]struct{}
	// version is the last accepted SotW version_info. It survives reconnects: Envoy sends it on
	// the first request of a new stream so the server can skip an unchanged resend.
	version string
	// nonce is the last SotW nonce received on the current stream.
	nonce string
	// opened reports whether the type's first request was sent on the current stream.
	opened bool
}

func (s *subscription) interested() bool { return s.wildcard || len(s.names) > 0 }

func (s *subscription) wants(name string) bool {
	if s.wildcard {
		return true
	}
	_, ok := s.names[name]
	return ok
}

func (s *subscription) sortedNames() []string {
	return slices.Sorted(maps.Keys(s.names))
}

// Client is one simulated proxy. Its methods are safe for concurrent use; Run may be called again
// after it returns to reconnect with the state held so far.
type Client struct {
	cfg Config

	// sendMu serialises Send on the active stream (gRPC allows one sender at a time) and keeps
	// the order of requests on the wire equal to the order of the state changes they describe.
	// It is taken before mu, never after.
	sendMu sync.Mutex

	mu        sync.Mutex
	running   bool
	sotw      discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	delta     discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	nodeSent  bool // Delta: the node went out on the current stream
	order     []string
	subs      map[string]*subscription
	held      map[string]map[string]Held
	counts    map[string]*Counts
	events    []Event
	changed   chan struct{}
	streamErr error
}

// New returns a client for cfg; it holds nothing and sends nothing until Run.
func New(cfg Config) *Client {
	c := &Client{
		cfg:     cfg,
		subs:    map[string]*subscription{},
		held:    map[string]map[string]Held{},
		counts:  map[string]*Counts{},
		changed: make(chan struct{}),
	}
	for _, t := range cfg.Types {
		c.subscription(t)
	}
	var rest []string
	for t, w := range cfg.Wildcard {
		if w {
			rest = append(rest, t)
		}
	}
	for t, names := range cfg.Names {
		if len(names) > 0 {
			rest = append(rest, t)
		}
	}
	slices.Sort(rest)
	for _, t := range rest {
		s := c.subscription(t)
		s.wildcard = s.wildcard || cfg.Wildcard[t]
		for _, n := range cfg.Names[t] {
			if n == Wildcard {
				s.wildcard = true
				continue
			}
			s.names[n] = struct{}{}
		}
	}
	return c
}

// subscription returns the subscription for t, creating it at the end of the order. c.mu must be
// held (or c not yet shared).
func (c *Client) subscription(t string) *subscription {
	s, ok := c.subs[t]
	if !ok {
		s = &subscription{names: map[string]struct{}{}}
		c.subs[t] = s
		c.order = append(c.order, t)
	}
	return s
}

func (c *Client) countsFor(t string) *Counts {
	n, ok := c.counts[t]
	if !ok {
		n = &Counts{}
		c.counts[t] = n
	}
	return n
}

// errRunning is returned by Run when another Run of the same client is in progress, because one
// client is one proxy with one ADS stream.
var errRunning = errors.New("adsclient: Run is already in progress for this client")

// Run opens one ADS stream on conn, sends the first request of every subscribed type, then ACKs
// or NACKs each response until ctx is done or the stream fails. It returns the error that ended
// the stream: the gRPC status error from the server (status.Code works on it), a Canceled status
// when ctx ended, or io.EOF when the server closed the stream with OK. Held state, accepted
// versions and counters survive, so calling Run again is a reconnect.
func (c *Client) Run(ctx context.Context, conn grpc.ClientConnInterface) error {
	c.mu.Lock()
	if c.running {
		c.mu.Unlock()
		return errRunning
	}
	c.running = true
	c.mu.Unlock()
	defer c.endStream()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // runs before endStream, unblocking any Send that holds sendMu
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	var err error
	if c.cfg.Protocol == Delta {
		err = c.runDelta(ctx, ads)
	} else {
		err = c.runSotW(ctx, ads)
	}
	c.mu.Lock()
	c.streamErr = err
	c.mu.Unlock()
	return err
}

// endStream forgets the per-stream state so the next Run starts a fresh stream, and wakes
// WaitFor so conditions on Running can be observed.
func (c *Client) endStream() {
	c.sendMu.Lock()
	c.mu.Lock()
	c.running = false
	c.sotw, c.delta, c.nodeSent = nil, nil, false
	for _, s := range c.subs {
		s.opened, s.nonce = false, ""
	}
	c.broadcastLocked()
	c.mu.Unlock()
	c.sendMu.Unlock()
}

// Running reports whether Run is in progress, for conditions passed to WaitFor.
func (c *Client) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running
}

// Err returns the error that ended the last stream, or nil if none has ended yet.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streamErr
}

// broadcastLocked wakes every WaitFor; c.mu must be held.
func (c *Client) broadcastLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Subscribe adds names (Wildcard for the wildcard) to the subscription for typeURL, creating the
// subscription if needed. While Run is going it sends the request at once: SotW repeats the full
// name list with the last accepted version and nonce; Delta sends only the new names in
// resource_names_subscribe (or the type's first request, if this opens the type on the stream).
// Names already subscribed are not sent again. The error is the stream's Send error, if any.
func (c *Client) Subscribe(typeURL string, names ...string) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.mu.Lock()
	s := c.subscription(typeURL)
	var added []string
	for _, n := range names {
		if n == Wildcard {
			if !s.wildcard {
				s.wildcard = true
				added = append(added, n)
			}
			continue
		}
		if _, ok := s.names[n]; !ok {
			s.names[n] = struct{}{}
			added = append(added, n)
		}
	}
	send := c.requestLocked(typeURL, s, added, nil)
	c.mu.Unlock()
	return send()
}

// Unsubscribe removes names (Wildcard for the wildcard) from the subscription for typeURL and
// drops held resources of that type no longer covered, as Envoy stops tracking them. While Run is
// going it sends the request at once: SotW the remaining full name list (empty if none remain),
// Delta the removed names in resource_names_unsubscribe.
func (c *Client) Unsubscribe(typeURL string, names ...string) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.mu.Lock()
	s, ok := c.subs[typeURL]
	if !ok {
		c.mu.Unlock()
		return nil
	}
	var removed []string
	for _, n := range names {
		if n == Wildcard {
			if s.wildcard {
				s.wildcard = false
				removed = append(removed, n)
			}
			continue
		}
		if _, ok := s.names[n]; ok {
			delete(s.names, n)
			removed = append(removed, n)
		}
	}
	if len(removed) > 0 && !s.wildcard {
		held := c.held[typeURL]
		for name := range held {
			if !s.wants(name) {
				delete(held, name)
			}
		}
		c.broadcastLocked()
	}
	send := c.requestLocked(typeURL, s, nil, removed)
	c.mu.Unlock()
	return send()
}

// requestLocked builds the request that announces a subscription change on the active stream,
// if any, and returns a function that sends it; c.mu and c.sendMu must be held, and the returned
// function must be called with c.sendMu still held but c.mu released.
func (c *Client) requestLocked(t string, s *subscription, added, removed []string) func() error {
	noop := func() error { return nil }
	switch {
	case c.sotw != nil:
		if !s.opened && !s.interested() || s.opened && len(added)+len(removed) == 0 {
			return noop
		}
		s.opened = true
		req := c.sotwRequestLocked(t, s, "")
		stream := c.sotw
		return func() error { return stream.Send(req) }
	case c.delta != nil:
		var req *discoveryv3.DeltaDiscoveryRequest
		switch {
		case !s.opened && s.interested():
			req = c.deltaFirstRequestLocked(t, s)
		case s.opened && len(added)+len(removed) > 0:
			req = &discoveryv3.DeltaDiscoveryRequest{
				TypeUrl:                  t,
				ResourceNamesSubscribe:   added,
				ResourceNamesUnsubscribe: removed,
			}
			c.countsFor(t).Requests++
		default:
			return noop
		}
		stream := c.delta
		return func() error { return stream.Send(req) }
	default:
		return noop
	}
}

// State returns a copy of what the client holds for typeURL, keyed by resource name.
func (c *Client) State(typeURL string) map[string]Held {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.held[typeURL])
}

// Versions returns name -> version of what the client holds for typeURL: exactly what a Delta
// reconnect declares in initial_resource_versions.
func (c *Client) Versions(typeURL string) map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]string, len(c.held[typeURL]))
	for name, h := range c.held[typeURL] {
		out[name] = h.Version
	}
	return out
}

// VersionInfo returns the last SotW version_info the client accepted for typeURL: what its
// next request of the type, and its first on a new stream, names.
func (c *Client) VersionInfo(typeURL string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.subs[typeURL]; s != nil {
		return s.version
	}
	return ""
}

// Stats returns a copy of the counters.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Stats{ByType: make(map[string]Counts, len(c.counts))}
	for t, n := range c.counts {
		st.ByType[t] = *n
		st.add(*n)
	}
	return st
}

// Events returns the processed responses so far, oldest first; it is empty unless
// Config.RecordEvents is set.
func (c *Client) Events() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// WaitFor blocks until cond(c) is true or ctx is done, returning ctx's error in the latter case.
// cond is evaluated at once and again after every processed response, subscription change and
// stream end; it runs without the client's lock, so it may call State, Stats and the like.
func (c *Client) WaitFor(ctx context.Context, cond func(*Client) bool) error {
	for {
		c.mu.Lock()
		ch := c.changed
		c.mu.Unlock()
		if cond(c) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Decode unmarshals a held resource into a new T, which must be a pointer to a generated message
// type (for example *clusterv3.Cluster), sparing tests the anypb boilerplate.
func Decode[T proto.Message](h Held) (T, error) {
	var zero T
	if h.Resource == nil {
		return zero, errors.New("adsclient: held resource has no payload")
	}
	m, ok := zero.ProtoReflect().New().Interface().(T)
	if !ok {
		return zero, errors.New("adsclient: Decode needs a pointer to a generated message type")
	}
	if err := h.Resource.UnmarshalTo(m); err != nil {
		return zero, err
	}
	return m, nil
}
