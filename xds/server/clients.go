package server

import (
	"sync"

	"github.com/scopeplane/scopeplane/xds/auth"
)

// clientStreams counts the open ADS streams of each client — an identity
// at one client IP address — against Options.MaxStreamsPerClient.
//
// The bound is what keeps one admitted client from holding the replica's
// memory: gRPC assembles each request whole (up to MaxRequestBytes)
// before the handler sees any of it, and nothing in grpc-go lets the
// server budget those bytes before they are allocated, so what a client
// can make the server hold at once is its streams times MaxRequestBytes. A
// proxy holds one ADS stream, a gRPC process one per xDS target it dials.
// The address is part of the key because many Pods share a ServiceAccount
// (and a SPIFFE ID): each replica of a Deployment has its own address and
// its own count, while one Pod cannot open streams for all of them.
type clientStreams struct {
	max int

	mu   sync.Mutex
	open map[string]int
}

func newClientStreams(max int) *clientStreams {
	return &clientStreams{max: max, open: map[string]int{}}
}

// clientKey names the client of a stream: its identity (nil for an
// anonymous one) at its peer address.
func clientKey(id *auth.Identity, peer string) string {
	return id.String() + "@" + peer
}

// take counts a new stream of client, or reports false when the client
// holds as many as it may.
func (cs *clientStreams) take(client string) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.open[client] >= cs.max {
		return false
	}
	cs.open[client]++
	return true
}

// release uncounts a stream of client.
func (cs *clientStreams) release(client string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.open[client]--; cs.open[client] <= 0 {
		delete(cs.open, client)
	}
}
