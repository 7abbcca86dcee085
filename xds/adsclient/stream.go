package adsclient

import (
	"context"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// nackStatus is the error_detail of a NACK. Envoy reports rejected configuration as
// INVALID_ARGUMENT with the rejection reason as the message.
func nackStatus(detail string) *rpcstatus.Status {
	if detail == "" {
		return nil
	}
	return &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: detail}
}

// runSotW runs one StreamAggregatedResources stream until it fails.
func (c *Client) runSotW(ctx context.Context, ads discoveryv3.AggregatedDiscoveryServiceClient) error {
	stream, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	c.sendMu.Lock()
	c.mu.Lock()
	c.sotw = stream
	var reqs []*discoveryv3.DiscoveryRequest
	for _, t := range c.order {
		if s := c.subs[t]; s.interested() {
			s.opened = true
			reqs = append(reqs, c.sotwRequestLocked(t, s, ""))
		}
	}
	c.mu.Unlock()
	for _, req := range reqs {
		if stream.Send(req) != nil {
			break // the cause surfaces from Recv
		}
	}
	c.sendMu.Unlock()
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		c.handleSotW(stream, resp)
	}
}

// sotwRequestLocked builds the next SotW request for t: the full name list, the last accepted
// version and the last nonce, plus error_detail for a NACK. c.mu must be held.
func (c *Client) sotwRequestLocked(t string, s *subscription, detail string) *discoveryv3.DiscoveryRequest {
	var names []string
	switch {
	case s.wildcard && len(s.names) > 0:
		// Adding names to a wildcard subscription must name the wildcard explicitly, or the
		// server would take the list as leaving wildcard mode.
		names = append([]string{Wildcard}, s.sortedNames()...)
	case !s.wildcard:
		names = s.sortedNames()
	}
	c.countsFor(t).Requests++
	return &discoveryv3.DiscoveryRequest{
		VersionInfo:   s.version,
		Node:          c.cfg.Node,
		ResourceNames: names,
		TypeUrl:       t,
		ResponseNonce: s.nonce,
		ErrorDetail:   nackStatus(detail),
	}
}

// handleSotW checks, judges, applies and answers one SotW response.
func (c *Client) handleSotW(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient, resp *discoveryv3.DiscoveryResponse) {
	at := time.Now()
	size := proto.Size(resp)
	t := resp.GetTypeUrl()
	c.mu.Lock()
	n := c.countsFor(t)
	n.Bytes += int64(size)
	s := c.subs[t]
	if s == nil || !s.opened {
		n.Ignored++
		c.mu.Unlock()
		return
	}
	n.Responses++
	n.Resources += int64(len(resp.GetResources()))
	c.mu.Unlock()

	rs, detail := c.parseSotW(resp)
	if detail == "" && c.cfg.Reject != nil {
		detail = c.cfg.Reject(t, resp.GetResources(), nil)
	}

	c.sendMu.Lock()
	c.mu.Lock()
	s.nonce = resp.GetNonce()
	if detail == "" {
		c.applySotWLocked(t, s, resp.GetVersionInfo(), rs)
		s.version = resp.GetVersionInfo()
		n.ACKs++
	} else {
		n.NACKs++
	}
	req := c.sotwRequestLocked(t, s, detail)
	c.mu.Unlock()
	_ = stream.Send(req) // a failed Send surfaces as Recv's error
	c.sendMu.Unlock()

	c.finish(Event{
		TypeURL: t, Version: resp.GetVersionInfo(), Nonce: resp.GetNonce(),
		Accepted: detail == "", ErrorDetail: detail, Bytes: size, Received: at,
	}, rs, nil)
}

// applySotWLocked applies an accepted SotW response: full-state types are replaced, by-name types
// merged, and resources nobody subscribed to are dropped. c.mu must be held.
func (c *Client) applySotWLocked(t string, s *subscription, version string, rs []received) {
	n := c.countsFor(t)
	held := c.held[t]
	next := held
	if fullState(t) || held == nil {
		next = make(map[string]Held, len(rs))
	}
	for _, r := range rs {
		if !s.wants(r.name) {
			n.Unrequested++
			continue
		}
		if r.payload == nil { // TTL heartbeat: keep what is held
			if h, ok := held[r.name]; ok {
				next[r.name] = h
			}
			continue
		}
		next[r.name] = Held{Version: version, Resource: r.payload}
	}
	c.held[t] = next
}

// runDelta runs one DeltaAggregatedResources stream until it fails.
func (c *Client) runDelta(ctx context.Context, ads discoveryv3.AggregatedDiscoveryServiceClient) error {
	stream, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		return err
	}
	c.sendMu.Lock()
	c.mu.Lock()
	c.delta = stream
	var reqs []*discoveryv3.DeltaDiscoveryRequest
	for _, t := range c.order {
		if s := c.subs[t]; s.interested() {
			reqs = append(reqs, c.deltaFirstRequestLocked(t, s))
		}
	}
	c.mu.Unlock()
	for _, req := range reqs {
		if stream.Send(req) != nil {
			break // the cause surfaces from Recv
		}
	}
	c.sendMu.Unlock()
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		c.handleDelta(stream, resp)
	}
}

// deltaFirstRequestLocked builds the first Delta request for t on the current stream: the whole
// subscription, and initial_resource_versions declaring everything held, so that a reconnect is
// answered with only the difference. The node goes on the stream's first request. c.mu must be
// held.
func (c *Client) deltaFirstRequestLocked(t string, s *subscription) *discoveryv3.DeltaDiscoveryRequest {
	s.opened = true
	var sub []string
	if s.wildcard {
		sub = append(sub, Wildcard)
	}
	sub = append(sub, s.sortedNames()...)
	req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: t, ResourceNamesSubscribe: sub}
	if !c.nodeSent {
		req.Node = c.cfg.Node
		c.nodeSent = true
	}
	if held := c.held[t]; len(held) > 0 {
		req.InitialResourceVersions = make(map[string]string, len(held))
		for name, h := range held {
			req.InitialResourceVersions[name] = h.Version
		}
	}
	c.countsFor(t).Requests++
	return req
}

// handleDelta checks, judges, applies and answers one Delta response.
func (c *Client) handleDelta(stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, resp *discoveryv3.DeltaDiscoveryResponse) {
	at := time.Now()
	size := proto.Size(resp)
	t := resp.GetTypeUrl()
	c.mu.Lock()
	n := c.countsFor(t)
	n.Bytes += int64(size)
	s := c.subs[t]
	if s == nil || !s.opened {
		n.Ignored++
		c.mu.Unlock()
		return
	}
	n.Responses++
	n.Resources += int64(len(resp.GetResources()))
	n.Removed += int64(len(resp.GetRemovedResources()) + len(resp.GetRemovedResourceNames()))
	c.mu.Unlock()

	rs, removed, detail := c.parseDelta(resp)
	if detail == "" && c.cfg.Reject != nil {
		payloads := make([]*anypb.Any, 0, len(rs))
		for _, r := range rs {
			if r.payload != nil {
				payloads = append(payloads, r.payload)
			}
		}
		detail = c.cfg.Reject(t, payloads, removed)
	}

	c.sendMu.Lock()
	c.mu.Lock()
	if detail == "" {
		c.applyDeltaLocked(t, s, rs, removed)
		n.ACKs++
	} else {
		n.NACKs++
	}
	n.Requests++
	c.mu.Unlock()
	_ = stream.Send(&discoveryv3.DeltaDiscoveryRequest{
		TypeUrl:       t,
		ResponseNonce: resp.GetNonce(),
		ErrorDetail:   nackStatus(detail),
	}) // a failed Send surfaces as Recv's error
	c.sendMu.Unlock()

	c.finish(Event{
		TypeURL: t, Version: resp.GetSystemVersionInfo(), Nonce: resp.GetNonce(),
		Accepted: detail == "", ErrorDetail: detail, Bytes: size, Received: at,
	}, rs, removed)
}

// applyDeltaLocked upserts the changed resources the client subscribed to and deletes the
// removed ones. c.mu must be held.
func (c *Client) applyDeltaLocked(t string, s *subscription, rs []received, removed []string) {
	n := c.countsFor(t)
	held := c.held[t]
	if held == nil {
		held = make(map[string]Held, len(rs))
		c.held[t] = held
	}
	for _, r := range rs {
		if !s.wants(r.name) {
			n.Unrequested++
			continue
		}
		if h, ok := held[r.name]; ok && r.payload == nil && h.Version == r.version {
			continue // TTL heartbeat: same version, no payload
		}
		held[r.name] = Held{Version: r.version, Resource: r.payload}
	}
	for _, name := range removed {
		delete(held, name)
	}
}

// finish publishes one processed response: it records the event if asked, wakes WaitFor (after
// the ACK or NACK is on the wire, so a satisfied condition implies the answer was sent) and
// calls OnEvent with no lock held.
func (c *Client) finish(ev Event, rs []received, removed []string) {
	if !c.cfg.RecordEvents && c.cfg.OnEvent == nil {
		c.mu.Lock()
		c.broadcastLocked()
		c.mu.Unlock()
		return
	}
	ev.Names = make([]string, len(rs))
	for i, r := range rs {
		ev.Names[i] = r.name
	}
	ev.Removed = removed
	c.mu.Lock()
	if c.cfg.RecordEvents {
		c.events = append(c.events, ev)
	}
	c.broadcastLocked()
	c.mu.Unlock()
	if c.cfg.OnEvent != nil {
		c.cfg.OnEvent(ev)
	}
}
