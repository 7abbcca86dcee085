package testkit

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestShrinkFindsTheStepsThatFail shrinks a list that fails once it has
// seen both 3 and 7, in either order, to those two steps, cut after the
// failing one.
func TestShrinkFindsTheStepsThatFail(t *testing.T) {
	steps := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
	replays := 0
	fails := func(cand []int) (int, error) {
		replays++
		seen3, seen7 := false, false
		for i, s := range cand {
			seen3, seen7 = seen3 || s == 3, seen7 || s == 7
			if seen3 && seen7 {
				return i, errors.New("3 and 7")
			}
		}
		return -1, nil
	}
	idx, err := fails(steps)
	if err == nil {
		t.Fatal("the full list does not fail")
	}
	got, gotErr := Shrink(steps[:idx+1], err, fails, time.Minute)
	if !slices.Equal(got, []int{3, 7}) || gotErr == nil {
		t.Fatalf("shrunk to %v (%v), want [3 7]", got, gotErr)
	}
	t.Logf("%d replays", replays)
}

// TestShrinkKeepsAListThatDoesNotShrink returns a one-step failure as it is.
func TestShrinkKeepsAListThatDoesNotShrink(t *testing.T) {
	want := errors.New("fails")
	got, err := Shrink([]int{5}, want, func([]int) (int, error) { return 0, want }, time.Minute)
	if !slices.Equal(got, []int{5}) || !errors.Is(err, want) {
		t.Fatalf("got %v, %v", got, err)
	}
}
