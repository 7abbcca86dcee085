package feedback

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/scopeplane/scopeplane/xds/model"
)

// MaxNacking bounds how many of a scope's rejecting proxies a Summary
// names; the rest are counted.
const MaxNacking = 20

// Summary is what a scope's status needs of its proxies' feedback, in a
// form that adds up across replicas: proxies are counted, not listed, so a
// replica can publish it at any fleet size, and the leader merges the
// replicas' Summaries into one (Merge).
type Summary struct {
	// Proxies counts the connected proxies by the scope version they are
	// fully at ("" for none yet) and protocol, in order. Versions are
	// content hashes, the same on every replica that saw the same
	// objects, so the counts of replicas add up.
	Proxies []ProxyCount
	// Nacking names proxies whose last answer for some type was a NACK,
	// by cut node id (NodeID), sorted, at most MaxNacking; NackingCount
	// counts all of them.
	Nacking      []string
	NackingCount int
	Refused      map[string]int64
	LastRefused  map[string]time.Time
	LastAdmitted map[string]time.Time
	// NACKs are the newest rejections, newest first, at most MaxNACKs.
	NACKs    []NACK
	LastPush time.Time
	Cost     CostWindow
	Usage    Usage
}

// ProxyCount is how many proxies of one protocol are at one version.
type ProxyCount struct {
	AtVersion string
	Protocol  model.Protocol
	Count     int
}

// Connected is how many proxies the Summary counts, and how many of them
// are at version.
func (s *Summary) Connected(version string) (connected, synced int) {
	for _, c := range s.Proxies {
		connected += c.Count
		if c.AtVersion == version {
			synced += c.Count
		}
	}
	return connected, synced
}

// Speaking is how many proxies speak protocol p.
func (s *Summary) Speaking(p model.Protocol) int {
	n := 0
	for _, c := range s.Proxies {
		if c.Protocol == p {
			n += c.Count
		}
	}
	return n
}

// Summary is the report's proxies counted (see Summary).
func (r *Report) Summary() Summary {
	return summarize(r.Proxies, Summary{
		Refused: r.Refused, LastRefused: r.LastRefused, LastAdmitted: r.LastAdmitted, NACKs: r.NACKs, LastPush: r.LastPush, Cost: r.Cost, Usage: r.Usage,
	})
}

// Summary is what is known about a scope, counted: Get's copy without
// copying every proxy's record.
func (t *Tracker) Summary(key model.Key) Summary {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.scopes[key]
	if s == nil {
		return Summary{Refused: map[string]int64{}, LastRefused: map[string]time.Time{}, Cost: CostWindow{Bucket: t.bucket}}
	}
	now := t.now()
	return summarize(s.Proxies, Summary{
		Refused: maps.Clone(s.Refused), LastRefused: maps.Clone(s.LastRefused), LastAdmitted: maps.Clone(s.LastAdmitted), NACKs: slices.Clone(s.NACKs), LastPush: s.LastPush,
		Cost: s.cost.window(now), Usage: s.usage.within(CostBuckets*t.bucket, now),
	})
}

// Scopes returns every scope something was recorded for, in order: those
// with proxies, and those whose refusals, rejections or cost window are
// still reported.
func (t *Tracker) Scopes() []model.Key {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]model.Key, 0, len(t.scopes))
	for key := range t.scopes {
		if key != (model.Key{}) {
			out = append(out, key)
		}
	}
	slices.SortFunc(out, model.Key.Compare)
	return out
}

// summarize counts proxies into s.
func summarize(proxies map[uint64]*Proxy, s Summary) Summary {
	counts := map[ProxyCount]int{}
	for _, p := range proxies {
		counts[ProxyCount{AtVersion: p.AtVersion, Protocol: p.Protocol}]++
		if len(p.Nacked) > 0 {
			s.NackingCount++
			s.Nacking = append(s.Nacking, NodeID(p.Node))
		}
	}
	for c, n := range counts {
		c.Count = n
		s.Proxies = append(s.Proxies, c)
	}
	sortCounts(s.Proxies)
	slices.Sort(s.Nacking)
	s.Nacking = s.Nacking[:min(len(s.Nacking), MaxNacking)]
	return s
}

func sortCounts(c []ProxyCount) {
	slices.SortFunc(c, func(a, b ProxyCount) int {
		return cmp.Or(cmp.Compare(a.AtVersion, b.AtVersion), cmp.Compare(a.Protocol, b.Protocol))
	})
}

// Merge adds up the Summaries of one scope from several replicas: counts
// add, the newest NACKs and refusal times win, and the cost windows, which
// cover the same buckets on every replica, add bucket by bucket.
func Merge(parts ...Summary) Summary {
	out := Summary{Refused: map[string]int64{}, LastRefused: map[string]time.Time{}, LastAdmitted: map[string]time.Time{}}
	counts := map[ProxyCount]int{}
	nacking := map[string]bool{}
	for i := range parts {
		p := &parts[i]
		for _, c := range p.Proxies {
			n := c.Count
			c.Count = 0
			counts[c] += n
		}
		for _, n := range p.Nacking {
			nacking[n] = true
		}
		out.NackingCount += p.NackingCount
		for k, v := range p.Refused {
			out.Refused[k] += v
		}
		for k, v := range p.LastRefused {
			if v.After(out.LastRefused[k]) {
				out.LastRefused[k] = v
			}
		}
		for k, v := range p.LastAdmitted {
			if v.After(out.LastAdmitted[k]) {
				out.LastAdmitted[k] = v
			}
		}
		out.NACKs = append(out.NACKs, p.NACKs...)
		if p.LastPush.After(out.LastPush) {
			out.LastPush = p.LastPush
		}
		out.Cost.add(&p.Cost.Cost)
		out.Cost.Span = max(out.Cost.Span, p.Cost.Span)
		out.Cost.Bucket = cmp.Or(out.Cost.Bucket, p.Cost.Bucket)
		out.Cost.Pending = out.Cost.Pending || p.Cost.Pending
		out.Usage.All = out.Usage.All || p.Usage.All
		for svc := range p.Usage.Services {
			if out.Usage.Services == nil {
				out.Usage.Services = map[model.Key]bool{}
			}
			out.Usage.Services[svc] = true
		}
	}
	for c, n := range counts {
		c.Count = n
		out.Proxies = append(out.Proxies, c)
	}
	sortCounts(out.Proxies)
	for n := range nacking {
		out.Nacking = append(out.Nacking, n)
	}
	slices.Sort(out.Nacking)
	out.Nacking = out.Nacking[:min(len(out.Nacking), MaxNacking)]
	slices.SortStableFunc(out.NACKs, func(a, b NACK) int { return b.Time.Compare(a.Time) })
	out.NACKs = out.NACKs[:min(len(out.NACKs), MaxNACKs)]
	return out
}
