package main

import (
	"fmt"
	"io"
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

func (tr *churnTrack) add(d uint64, change int) {
	tr.index[d] = len(tr.digests)
	tr.digests = append(tr.digests, d)
	tr.change = append(tr.change, change)
}

// send writes one command without waiting for its answer.
func (p *cpProc) send(cmd string) error {
	_, err := io.WriteString(p.stdin, cmd+"\n")
	return err
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

	// Every change and the world after them, up front (events are
	// deterministic), so that keeping the schedule is all the driver does
	// meanwhile: the versions each change makes of the assignments it
	// touches, per scope with proxies, and the truth at the end.
	views := w.Views()
	tracks := map[int]map[resKey]*churnTrack{}
	touched := make([][]*churnTrack, n)
	for i := range n {
		ch, err := w.Apply(EvChurn)
		if err != nil {
			return nil, err
		}
		for s := range truths {
			as, err := w.Assignments(views[s], ch.Upserted[0])
			if err != nil {
				return nil, err
			}
			for name, r := range as {
				if tracks[s] == nil {
					tracks[s] = map[resKey]*churnTrack{}
				}
				k := resKey{xdstype.Endpoint, name}
				tr := tracks[s][k]
				if tr == nil {
					tr = &churnTrack{index: map[uint64]int{}}
					tracks[s][k] = tr
				}
				tr.add(r.Digest, i)
				touched[i] = append(touched[i], tr)
			}
		}
	}
	final, err := truthsOf(w, c.N)
	if err != nil {
		return nil, err
	}
	for _, p := range l.proxies {
		keys := make([]resKey, 0, len(tracks[p.view]))
		for k := range tracks[p.view] {
			keys = append(keys, k)
		}
		p.watch(keys)
		if len(keys) > 0 {
			ph.Affected++
		}
	}

	st := ph.Churn
	trigger := func() error {
		// The control plane's answers are read as they come, so a busy
		// control plane never delays the next change.
		answered := make(chan error, 1)
		go func() {
			for range n {
				l, err := cp.read(o.Timeout)
				if err == nil && l != "ok" {
					err = fmt.Errorf("event %s: %s", EvChurn, l)
				}
				if err != nil {
					answered <- err
					return
				}
			}
			answered <- nil
		}()
		start := time.Now()
		interval := c.Churn.For / time.Duration(n)
		for i := range n {
			time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
			at := time.Now()
			if err := cp.send("event " + EvChurn); err != nil {
				return err
			}
			for _, tr := range touched[i] {
				tr.at = append(tr.at, at)
			}
		}
		time.Sleep(time.Until(start.Add(c.Churn.For)))
		if err := <-answered; err != nil {
			return err
		}
		st.Window = time.Since(start)
		// Each proxy is done once it holds the last version of every
		// churned resource its scope serves.
		for _, p := range l.proxies {
			if len(tracks[p.view]) == 0 {
				continue // unaffected: armed by watch, not waited for
			}
			last := map[resKey]want{}
			for k, tr := range tracks[p.view] {
				if len(tr.digests) == 0 {
					continue
				}
				d := tr.digests[len(tr.digests)-1]
				if d != final[p.view][k.t][k.name].Digest {
					return fmt.Errorf("churn: %s %q of %s alone differs from the truth", k.t, k.name, w.Scopes[views[p.view].Scope].Key)
				}
				last[k] = want{present: true, digest: d}
			}
			p.armLast(last)
		}
		return nil
	}
	builds0, err := cp.builds()
	if err != nil {
		return nil, err
	}
	// The proxies have Timeout to converge after the schedule.
	o.Timeout += c.Churn.For
	if err := measure(cp, l, ph, o, trigger, final); err != nil {
		return nil, err
	}
	builds1, err := cp.builds()
	if err != nil {
		return nil, err
	}
	st.Builds, st.Drained = builds1-builds0, ph.Converged()

	// Convergence of each change at each proxy, from what the proxies
	// ACKed: a version converges its own change and every earlier one of
	// the same resource not converged yet.
	ph.Lat = ph.Lat[:0]
	changeLat := make([]time.Duration, n)
	affected := make([]bool, n)
	for _, p := range l.proxies {
		held := p.takeHistory()
		for k, tr := range tracks[p.view] {
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
