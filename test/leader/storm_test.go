package leader

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
)

var (
	stormSteps  = flag.Int("storm.steps", 100, "TestRestartStorm: replica crashes, shutdowns and restarts")
	stormSeed   = flag.Uint64("storm.seed", 1, "TestRestartStorm: seed; 0 picks one from the clock")
	stormShrink = flag.Duration("storm.shrink", 3*time.Minute, "TestRestartStorm: time budget for shrinking a failing step list")
)

// stormServices are the Services the storm's churn changes.
var stormServices = []string{"svc-0", "svc-1", "svc-2"}

// stormAction is what a storm step does to a replica.
type stormAction uint8

const (
	crash    stormAction = iota // it loses its connections and dies, holding the Lease
	shutdown                    // it drains its streams and gives the Lease up
	restart                     // it starts again (a new pod, a new port)
)

// actionNames name the stormActions in step lists.
var actionNames = []string{"Crash", "Shutdown", "Restart"}

// change is one change of the world made during a storm step: a Service's
// endpoints set to addrs (created if it does not exist), or the Service
// deleted.
type change struct {
	svc    string
	addrs  []string
	delete bool
}

// stormStep is one recorded step: an action on a replica while the world
// changes. Everything it needs is in it, so that a subsequence replays; an
// action that does not apply (crashing a replica that is not running, or
// the last one; restarting a running one) does nothing.
type stormStep struct {
	action  stormAction
	replica string
	changes []change
}

func (s stormStep) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", actionNames[s.action], s.replica)
	for _, c := range s.changes {
		if c.delete {
			fmt.Fprintf(&b, "; delete %s", c.svc)
		} else {
			fmt.Fprintf(&b, "; %s endpoints %v", c.svc, c.addrs)
		}
	}
	return b.String()
}

// generateStorm draws n steps from seed: a crash, a shutdown or a restart of
// one of replicas a, b and c (never the last running one down), with, in
// seven steps out of ten, one or two changes of the Services' endpoints
// made while the replica goes down or comes up.
func generateStorm(seed uint64, n int) []stormStep {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	running := map[string]bool{"a": true, "b": true, "c": true}
	steps := make([]stormStep, 0, n)
	for range n {
		var up, down []string
		for _, name := range abc {
			if running[name] {
				up = append(up, name)
			} else {
				down = append(down, name)
			}
		}
		var s stormStep
		switch x := r.IntN(100); {
		case len(up) > 1 && (x < 45 || len(down) == 0 && x < 72):
			s = stormStep{action: crash, replica: up[r.IntN(len(up))]}
		case len(up) > 1 && (x < 65 || len(down) == 0):
			s = stormStep{action: shutdown, replica: up[r.IntN(len(up))]}
		default:
			s = stormStep{action: restart, replica: down[r.IntN(len(down))]}
		}
		running[s.replica] = s.action == restart
		if r.IntN(10) < 7 {
			for range 1 + r.IntN(2) {
				c := change{svc: stormServices[r.IntN(len(stormServices))]}
				if r.IntN(100) < 15 {
					c.delete = true
				} else {
					for _, i := range r.Perm(6)[:r.IntN(4)] {
						c.addrs = append(c.addrs, fmt.Sprintf("10.4.0.%d", 1+i))
					}
					slices.Sort(c.addrs)
				}
				s.changes = append(s.changes, c)
			}
		}
		steps = append(steps, s)
	}
	return steps
}

// stormResult counts what a storm did.
type stormResult struct {
	done     [3]int // actions taken, by stormAction
	noop     int    // actions that did not apply
	changes  int
	moves    int // streams proxies began after the first ones
	pure     int // steps without changes, after which delta streams were checked
	settled  settleStats
	duration time.Duration
}

func (r *stormResult) String() string {
	return fmt.Sprintf("%d crashes, %d shutdowns, %d restarts (%d steps did nothing); %d Service changes; %d proxy reconnects; %d steps without changes had their delta streams checked for only differences; %d quiescent points: %d proxy states and %d resources compared with the truth, %d stale",
		r.done[crash], r.done[shutdown], r.done[restart], r.noop, r.changes, r.moves, r.pure, r.settled.points, r.settled.proxies, r.settled.resources, r.settled.stale)
}

// stormRuns numbers the storms played on one API server: each plays in
// a namespace (and for a Lease) of its own.
var stormRuns int

// playStorm plays steps on a new fleet of three replicas with three SotW
// and three delta proxies, settling after every step, and returns the index
// of the step that failed and its error (-1 and nil when none did).
func playStorm(t *testing.T, env *localapi.Env, seed uint64, steps []stormStep, res *stormResult) (int, error) {
	stormRuns++
	start := time.Now()
	f := newFleet(t, env, fmt.Sprintf("storm-%d", stormRuns), stormServices, abc)
	defer f.close()
	f.addProxies(sotwScope, 3, abc, seed)
	f.addProxies(deltaScope, 3, abc, seed+1)
	if err := f.settle(&res.settled); err != nil {
		return 0, fmt.Errorf("before the first step: %w", err)
	}
	first := f.streamMarks()
	for i, s := range steps {
		marks := f.streamMarks()
		changed := make(chan error, 1)
		go func() {
			for _, c := range s.changes {
				var err error
				if c.delete {
					err = f.deleteService(c.svc)
				} else {
					err = f.upsertService(c.svc, c.addrs)
				}
				if err != nil {
					changed <- err
					return
				}
			}
			changed <- nil
		}()
		applied := true
		switch s.action {
		case crash, shutdown:
			applied = len(f.running()) > 1 && f.end(s.replica, s.action == crash)
		case restart:
			applied = f.replica(s.replica) == nil
			f.start(s.replica)
		}
		if err := <-changed; err != nil {
			return i, err
		}
		if applied {
			res.done[s.action]++
		} else {
			res.noop++
		}
		res.changes += len(s.changes)
		if err := f.settle(&res.settled); err != nil {
			return i, err
		}
		if len(s.changes) == 0 {
			trs, err := f.truths()
			if err != nil {
				return i, err
			}
			if _, err := f.onlyDifferences(marks, trs); err != nil {
				return i, err
			}
			res.pure++
		}
	}
	for p, n := range first {
		res.moves += p.streamCount() - n
	}
	res.duration = time.Since(start)
	return -1, nil
}

// shrinkStorm is testkit.Shrink over the steps, then tries dropping each
// Service change of the steps left, one at a time.
func shrinkStorm(steps []stormStep, lastErr error, fails func([]stormStep) (int, error), budget time.Duration) ([]stormStep, error) {
	deadline := time.Now().Add(budget)
	steps, lastErr = testkit.Shrink(steps, lastErr, fails, budget)
	for i := 0; i < len(steps) && time.Now().Before(deadline); i++ {
		for j := 0; j < len(steps[i].changes) && time.Now().Before(deadline); j++ {
			cand := slices.Clone(steps)
			cand[i].changes = slices.Delete(slices.Clone(cand[i].changes), j, j+1)
			if idx, err := fails(cand); err != nil && idx >= i {
				steps, lastErr = cand[:idx+1], err
				j--
			}
		}
	}
	return steps, lastErr
}

// TestRestartStorm crashes, shuts down and restarts replicas of three at
// random while Services' endpoints change, and checks after every step that
// every running replica serves the truth of the API objects and every proxy
// holds it: no proxy is left with a resource that no longer exists. After a
// step with no change, delta proxies that moved were sent nothing they
// held. A failing step list is replayed and shrunk, as the model test of
// package server does, and reported with the command that reproduces it.
func TestRestartStorm(t *testing.T) {
	ctrl.SetLogger(logr.Discard())
	seed := *stormSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	env := startEnv(t)
	steps := generateStorm(seed, *stormSteps)
	var res stormResult
	failedAt, err := playStorm(t, env, seed, steps, &res)
	if err == nil {
		t.Logf("seed %d: %d steps, 6 proxies (3 SotW, 3 delta), in %v: %s", seed, len(steps), res.duration.Round(time.Millisecond), &res)
		return
	}
	failing := steps[:failedAt+1]
	t.Logf("seed %d failed at step %d: %v", seed, failedAt, err)
	replay := func(cand []stormStep) (int, error) {
		var r stormResult
		return playStorm(t, env, seed, cand, &r)
	}
	shrunk, shrunkErr := failing, err
	how := "not shrunk: the failure did not reproduce when the steps were replayed (timing-dependent)"
	if idx, rerr := replay(failing); rerr != nil {
		shrunk, shrunkErr = shrinkStorm(failing[:idx+1], rerr, replay, *stormShrink)
		how = fmt.Sprintf("shrunk from %d", len(failing))
	}
	var b strings.Builder
	for i := range shrunk {
		fmt.Fprintf(&b, "  %3d  %s\n", i, shrunk[i])
	}
	t.Fatalf("seed %d failed at step %d of %d: %v\n\nreproduce: KUBEBUILDER_ASSETS=$(hack/envtest.sh) go test ./test/leader/ -run 'TestRestartStorm' -storm.seed %d -storm.steps %d\n\n%d steps (%s), which fail with: %v\n%s",
		seed, failedAt, len(steps), err, seed, failedAt+1, len(shrunk), how, shrunkErr, b.String())
}
