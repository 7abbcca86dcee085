package main

import (
	"fmt"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"time"
)

// peakSample is the operator process's memory at one moment of its life.
type peakSample struct {
	// At is the time since the process started.
	At time.Duration
	// RSS is the resident set (/proc/self/status VmRSS); Live the heap
	// the last collection found live; Objects the heap's objects, live or
	// not yet swept; Goal the collector's heap goal then.
	RSS, Live, Objects, Goal int64
}

func (s peakSample) String() string {
	return fmt.Sprintf("rss=%dMiB live=%dMiB objects=%dMiB goal=%dMiB at=%s",
		s.RSS>>20, s.Live>>20, s.Objects>>20, s.Goal>>20, s.At.Round(100*time.Millisecond))
}

// peakWatch samples the process's memory every peakEvery and keeps, per
// phase of its life, the sample of its highest resident set: where the
// start's peak (VmHWM) comes from, since a sample after the sync tells
// only what stayed. phase names the phase a sample falls in.
type peakWatch struct {
	start time.Time
	phase func() string

	mu     sync.Mutex
	order  []string
	peaks  map[string]peakSample
	rising func(peakSample) // called at each new high of the whole life
	high   int64
}

// peakEvery is how often peakWatch samples: a start's peak lasts seconds
// (a collection near GOMEMLIMIT takes a good part of one at S=100,000).
const peakEvery = 50 * time.Millisecond

// peakMetrics are the runtime/metrics peakWatch reads, in peakSample's order.
var peakMetrics = []string{"/gc/heap/live:bytes", "/memory/classes/heap/objects:bytes", "/gc/heap/goal:bytes"}

func newPeakWatch(start time.Time, phase func() string, rising func(peakSample)) *peakWatch {
	return &peakWatch{start: start, phase: phase, peaks: map[string]peakSample{}, rising: rising}
}

// run samples until stop is closed.
func (w *peakWatch) run(stop <-chan struct{}) {
	t := time.NewTicker(peakEvery)
	defer t.Stop()
	samples := make([]metrics.Sample, len(peakMetrics))
	for i, name := range peakMetrics {
		samples[i].Name = name
	}
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		rss, err := selfStatus("VmRSS")
		if err != nil {
			continue
		}
		metrics.Read(samples)
		s := peakSample{At: time.Since(w.start), RSS: rss,
			Live: int64(samples[0].Value.Uint64()), Objects: int64(samples[1].Value.Uint64()), Goal: int64(samples[2].Value.Uint64())}
		w.record(w.phase(), s)
	}
}

func (w *peakWatch) record(phase string, s peakSample) {
	w.mu.Lock()
	p, seen := w.peaks[phase]
	if !seen {
		w.order = append(w.order, phase)
	}
	if !seen || s.RSS > p.RSS {
		w.peaks[phase] = s
	}
	rise := s.RSS > w.high
	if rise {
		w.high = s.RSS
	}
	w.mu.Unlock()
	if rise && w.rising != nil {
		w.rising(s)
	}
}

// String answers the "peaks" command: each phase seen so far, in order,
// with the sample of its highest resident set.
func (w *peakWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	b.WriteString("peaks")
	for _, ph := range w.order {
		fmt.Fprintf(&b, " %s:%s", ph, w.peaks[ph])
	}
	return b.String()
}

// selfStatus reads one size field of this process's /proc status, in bytes.
func selfStatus(field string) (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	return statusField(b, field)
}

// statusField is one size field of a /proc status file, in bytes.
func statusField(b []byte, field string) (int64, error) {
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s", field)
}
