package testkit

import (
	"slices"
	"time"
)

// Shrink is delta debugging over a failing step list, for the randomized
// tests that record their steps: it drops chunks of steps (halves, then
// quarters, ...) while the rest still fails, and cuts the list after the
// step that fails, until no single step can go or budget runs out. fails
// replays a candidate list from scratch and returns the index of the step
// that failed and its error, or a nil error when the whole list passed.
// Shrink returns the shortest failing list it found and its error (steps
// and lastErr when nothing could go). Steps must carry everything they
// need, so that any subsequence replays.
func Shrink[S any](steps []S, lastErr error, fails func([]S) (int, error), budget time.Duration) ([]S, error) {
	deadline := time.Now().Add(budget)
	n := 2
	for len(steps) >= 2 && time.Now().Before(deadline) {
		size := (len(steps) + n - 1) / n
		reduced := false
		for start := 0; start < len(steps) && time.Now().Before(deadline); start += size {
			cand := append(slices.Clone(steps[:start]), steps[min(start+size, len(steps)):]...)
			if len(cand) == 0 {
				continue
			}
			if idx, err := fails(cand); err != nil {
				steps, lastErr = cand[:idx+1], err
				n = max(n-1, 2)
				reduced = true
				break
			}
		}
		if !reduced {
			if n >= len(steps) {
				break
			}
			n = min(2*n, len(steps))
		}
	}
	return steps, lastErr
}
