// Package shard divides the ProxyScopes among shards of replicas, so that
// a replica holds the translations and snapshots of its shard's scopes
// only (docs/sharding.md). A scope hashes to one of a fixed number of
// slots, each reached at an xDS address of its own, and slot i belongs to
// shard i mod the shard count: every replica computes a scope's slot and
// shard alike, with nothing stored and nothing to agree on, and a scope's
// address, its slot's, stays when the shard count changes.
package shard

import (
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/scopeplane/scopeplane/xds/model"
)

// Shards is this replica's place among the shards. The zero value is one
// shard that owns every scope: today's unsharded control plane.
type Shards struct {
	// Index is this replica's shard, from 0.
	Index int
	// N is the number of shards; 0 means one per address.
	N int
	// Addresses are the slots' xDS addresses (host:port), in slot order:
	// what the bootstraps of each slot's scopes name, and what a refusal
	// tells a proxy that reached the wrong shard. Their number is the slot
	// count, at least N; none means one shard. With one slot per shard a
	// slot is its shard, and a change of the count moves the fewest
	// scopes, each to another address; with more slots than shards (a
	// Service per slot whose selector follows the count, as the chart
	// renders) a scope keeps its address across counts that keep the
	// slots.
	Addresses []string
}

// Count is the number of shards.
func (s Shards) Count() int {
	if s.N > 0 {
		return s.N
	}
	return max(1, len(s.Addresses))
}

// Slots is the number of slots: one, unsharded.
func (s Shards) Slots() int {
	if !s.Sharded() {
		return 1
	}
	return len(s.Addresses)
}

// Sharded reports whether there is more than one shard.
func (s Shards) Sharded() bool { return s.Count() > 1 }

// SlotOf is the slot of key's scope.
func (s Shards) SlotOf(key model.Key) int { return Of(key, s.Slots()) }

// ShardOf is the shard that owns key's scope: its slot's.
func (s Shards) ShardOf(key model.Key) int { return s.SlotOf(key) % s.Count() }

// Owns reports whether key's scope is this replica's shard's.
func (s Shards) Owns(key model.Key) bool { return s.ShardOf(key) == s.Index }

// AddressOf is the xDS address of key's scope, its slot's; sharded only.
func (s Shards) AddressOf(key model.Key) string { return s.Addresses[s.SlotOf(key)] }

// Check refuses an index outside the shards, fewer slots than shards,
// addresses that are not host:port of an IP or a DNS name, and an address
// given to two slots.
func (s Shards) Check() error {
	if s.N < 0 {
		return fmt.Errorf("%d shards: there is at least one", s.N)
	}
	if s.Index < 0 || s.Index >= s.Count() {
		return fmt.Errorf("shard %d is not one of the %d shards (0 to %d)", s.Index, s.Count(), s.Count()-1)
	}
	if s.Sharded() && len(s.Addresses) < s.Count() {
		return fmt.Errorf("%d xDS address(es) for %d shards: each shard serves at least one slot, and each slot has its own address", len(s.Addresses), s.Count())
	}
	seen := make([]string, 0, len(s.Addresses))
	for i, a := range s.Addresses {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return fmt.Errorf("slot %d's xDS address %q: %w", i, a, err)
		}
		if ip, err := netip.ParseAddr(host); err == nil {
			if ip.Zone() != "" {
				return fmt.Errorf("slot %d's xDS address %q: an address with a zone reaches one host's link only", i, a)
			}
			host = ip.Unmap().String()
		} else if errs := validation.IsDNS1123Subdomain(host); len(errs) > 0 {
			return fmt.Errorf("slot %d's xDS address %q: the host is neither an IP nor a DNS name: %s", i, a, strings.Join(errs, "; "))
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("slot %d's xDS address %q: the port is not 1-65535", i, a)
		}
		// Two spellings of one address ([::1] and [0::1],
		// [::ffff:10.0.0.1] and 10.0.0.1, 18000 and 018000) are one
		// address.
		canonical := net.JoinHostPort(host, strconv.Itoa(p))
		if j := slices.Index(seen, canonical); j >= 0 {
			return fmt.Errorf("slots %d and %d have the same xDS address %q (%q): each slot is reached at its own", j, i, canonical, a)
		}
		seen = append(seen, canonical)
	}
	return nil
}

// Of is the bucket, of count, of key's scope: jump consistent hashing
// (Lamping and Veach, 2014) of the scope's namespace and name. Scopes
// spread evenly; when the count grows by one, only the scopes the new
// bucket takes move (1/count of them), and when it shrinks by one, only
// the last bucket's scopes move. Count below 1 is taken as 1.
func Of(key model.Key, count int) int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key.Namespace))
	_, _ = h.Write([]byte{'/'})
	_, _ = h.Write([]byte(key.Name))
	k := mix(h.Sum64())
	b, j := int64(-1), int64(0)
	for j < int64(max(1, count)) {
		b = j
		k = k*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((k>>33)+1)))
	}
	return int(b)
}

// mix spreads FNV's bits over the whole word (splitmix64's finalizer):
// the jump's steps read the high bits, where FNV of similar names differs
// little.
func mix(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	return z ^ z>>31
}
