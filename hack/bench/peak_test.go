package main

import (
	"testing"
	"time"
)

// TestPeakWatchKeepsEachPhasesHighest feeds peakWatch samples across
// phases: each phase keeps the sample of its highest resident set, the
// phases are reported in the order they were first seen, and the rising
// callback fires only at a new high of the whole life.
func TestPeakWatchKeepsEachPhasesHighest(t *testing.T) {
	var rises []int64
	w := newPeakWatch(time.Now(), nil, func(s peakSample) { rises = append(rises, s.RSS) })
	for _, s := range []struct {
		phase string
		rss   int64
	}{{"list", 100 << 20}, {"list", 300 << 20}, {"list", 200 << 20}, {"build", 250 << 20}, {"build", 900 << 20}, {"serve", 400 << 20}, {"build", 800 << 20}} {
		w.record(s.phase, peakSample{RSS: s.rss, Live: s.rss / 2, At: time.Duration(s.rss>>20) * time.Millisecond})
	}
	want := "peaks list:rss=300MiB live=150MiB objects=0MiB goal=0MiB at=300ms build:rss=900MiB live=450MiB objects=0MiB goal=0MiB at=900ms serve:rss=400MiB live=200MiB objects=0MiB goal=0MiB at=400ms"
	if got := w.String(); got != want {
		t.Errorf("peaks:\n got %s\nwant %s", got, want)
	}
	if got, want := rises, []int64{100 << 20, 300 << 20, 900 << 20}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("rising at %v, want %v", got, want)
	}
}

// TestPeakWatchSamplesThisProcess runs the sampler on this process: it
// reads a resident set and a heap, in the phase the phase function names.
func TestPeakWatchSamplesThisProcess(t *testing.T) {
	w := newPeakWatch(time.Now(), func() string { return "list" }, nil)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { w.run(stop); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		s, ok := w.peaks["list"]
		w.mu.Unlock()
		if ok {
			if s.RSS <= 0 || s.Objects <= 0 || s.Goal <= 0 {
				t.Errorf("sample %s: want a resident set, a heap and a goal", s)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no sample in 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	<-done
}
