package main

import (
	"fmt"
	"time"

	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// churnTrack is one resource a churn changes, as one scope serves it: its
// version (digest) after each change of it, when that change was handed to
// the control plane, and which change of the churn it was.
type churnTrack struct {
	digests []uint64
	at      []time.Time
	change  []int
	// index is digests inverted: every change moves an endpoint to an
	// address of its own, so a version names one change.
	index map[uint64]int
}

func (tr *churnTrack) add(d uint64, at time.Time, change int) {
	tr.index[d] = len(tr.digests)
	tr.digests = append(tr.digests, d)
	tr.at = append(tr.at, at)
	tr.change = append(tr.change, change)
}

// builds is how many versions the control plane has built.
func (p *cpProc) builds() (int64, error) {
	l, err := p.do("builds")
	if err != nil {
		return 0, err
	}
	var n int64
	_, err = fmt.Sscanf(l, "builds %d", &n)
	return n, err
}

// runChurn measures a sustained churn (see Churn) on a synced load.
//
// Convergence: a change has converged at a proxy once the proxy ACKed the
// version of the resource that change made, or a later version of the same
// resource — a later change supersedes it, and with coalescing a proxy may
// never be sent the superseded version at all, which is the point. A
// change's convergence time runs from when the driver handed it to the
// control plane until every proxy of every scope serving the resource had
// converged on it; each (change, proxy) pair's time is in the phase's Lat.
// The phase ends when every proxy holds the last version of every churned
// resource and traffic stopped; then, as after every event, each proxy's
// whole state must be the truth.
func runChurn(cp *cpProc, l *load, w *World, truths map[int]*Truth, c Cell, o RunOptions) (*Phase, error) {
	n := c.Churn.Changes()
	ph := &Phase{Name: EvChurn, Churn: &ChurnStats{Changes: n}}

	// The world after the churn (events are deterministic), so its truth
	// is known up front and the driver need not translate whole scopes
	// while it keeps the schedule.
	end := w.copy()
	for range n {
		if _, err := end.Apply(EvChurn); err != nil {
			return nil, err
		}
	}
	final, err := truthsOf(end, c.N)
	if err != nil {
		return nil, err
	}
	// The assignments the churn changes, per scope with proxies.
	tracks := map[int]map[resKey]*churnTrack{}
	for k := range churnServices {
		svc := end.Services[churnKey(k)]
		for s := range final {
			as, err := Assignments(end.Scopes[s], svc)
			if err != nil {
				return nil, err
			}
			for name := range as {
				if tracks[s] == nil {
					tracks[s] = map[resKey]*churnTrack{}
				}
				tracks[s][resKey{xdstype.Endpoint, name}] = &churnTrack{index: map[uint64]int{}}
			}
		}
	}
	for _, p := range l.proxies {
		keys := make([]resKey, 0, len(tracks[p.scope]))
		for k := range tracks[p.scope] {
			keys = append(keys, k)
		}
		p.watch(keys)
		if len(keys) > 0 {
			ph.Affected++
		}
	}

	st := ph.Churn
	trigger := func() error {
		builds0, err := cp.builds()
		if err != nil {
			return err
		}
		cpu0, err := cp.cpu()
		if err != nil {
			return err
		}
		counts0, load0 := l.counts(), cpuNanos()
		start := time.Now()
		interval := c.Churn.For / time.Duration(n)
		for i := range n {
			time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
			ch, err := w.Apply(EvChurn)
			if err != nil {
				return err
			}
			at := time.Now()
			if _, err := cp.do("event " + EvChurn); err != nil {
				return err
			}
			for s, byKey := range tracks {
				as, err := Assignments(w.Scopes[s], ch.Upserted[0])
				if err != nil {
					return err
				}
				for name, r := range as {
					byKey[resKey{xdstype.Endpoint, name}].add(r.Digest, at, i)
				}
			}
		}
		time.Sleep(time.Until(start.Add(c.Churn.For)))
		st.Window = time.Since(start)
		counts := l.counts()
		st.Bytes, st.Responses = counts.Bytes-counts0.Bytes, counts.Responses-counts0.Responses
		st.LoadCPU = time.Duration(cpuNanos() - load0)
		cpu1, err := cp.cpu()
		if err != nil {
			return err
		}
		st.CPU = cpu1 - cpu0
		builds1, err := cp.builds()
		if err != nil {
			return err
		}
		st.Builds = builds1 - builds0
		// Each proxy is done once it holds the last version of every
		// churned resource its scope serves.
		for _, p := range l.proxies {
			if len(tracks[p.scope]) == 0 {
				continue // unaffected: armed by watch, not waited for
			}
			last := map[resKey]want{}
			for k, tr := range tracks[p.scope] {
				if len(tr.digests) == 0 {
					continue
				}
				d := tr.digests[len(tr.digests)-1]
				if d != final[p.scope][k.t][k.name].Digest {
					return fmt.Errorf("churn: %s %q of %s alone differs from the truth", k.t, k.name, w.Scopes[p.scope].Key)
				}
				last[k] = want{present: true, digest: d}
			}
			p.armLast(last)
		}
		return nil
	}
	if err := measure(cp, l, ph, o, trigger, final); err != nil {
		return nil, err
	}

	// Convergence of each change at each proxy, from what the proxies
	// ACKed: a version converges its own change and every earlier one of
	// the same resource not converged yet.
	ph.Lat = ph.Lat[:0]
	changeLat := make([]time.Duration, n)
	affected := make([]bool, n)
	for _, p := range l.proxies {
		held := p.takeHistory()
		for k, tr := range tracks[p.scope] {
			next := 0
			for _, h := range held[k] {
				j, ok := tr.index[h.digest]
				for ; ok && next <= j; next++ {
					d := h.at.Sub(tr.at[next])
					ph.Lat = append(ph.Lat, d)
					i := tr.change[next]
					changeLat[i], affected[i] = max(changeLat[i], d), true
				}
			}
		}
	}
	for i, ok := range affected {
		if ok {
			st.ChangeLat = append(st.ChangeLat, changeLat[i])
		}
	}
	return ph, nil
}
