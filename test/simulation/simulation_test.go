package simulation

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
)

func init() { ctrl.SetLogger(logr.Discard()) }

// tailLines is how many steps a failure prints: SIM_TAIL, else 150.
func tailLines() int {
	n := 150
	if v := os.Getenv("SIM_TAIL"); v != "" {
		_, _ = fmt.Sscan(v, &n)
	}
	return n
}

// ciSeeds is how many seeds go test runs (SIM_SEEDS runs more, SIM_SEED one).
const ciSeeds = 40

// TestSimulation runs the seeded simulation of every controller: for each seed, a run of
// user actions and faults with the oracle at every quiet point, then calm until
// everything settles. Each seed is a subtest; the last line counts them.
func TestSimulation(t *testing.T) {
	var failed []uint64
	list := seeds(t, ciSeeds)
	for _, seed := range list {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			w := newWorld(t, seed, defaultBudget)
			if f := w.run(); f != "" {
				failed = append(failed, seed)
				t.Errorf("seed %d fails after %d steps (replay: SIM_SEED=%d go test ./test/simulation -run 'TestSimulation$' -v):\n%s\n\nlast steps:\n%s\n\nstate:\n%s",
					seed, w.s.seen, seed, f, strings.Join(w.s.tail(tailLines()), "\n"), w.describe())
				return
			}
			t.Logf("%d steps, %d user actions, %d crashes, %s virtual", w.s.seen, w.users, w.crashes, w.s.clock.elapsed())
			if os.Getenv("SIM_TRACE") != "" {
				t.Logf("trace:\n%s", strings.Join(w.s.trace, "\n"))
			}
		})
	}
	t.Logf("the simulation ran %d seeds: %d passed, %d failed %v", len(list), len(list)-len(failed), len(failed), failed)
}

// TestSimulationReplays checks that a seed replays: the same seed, the same run, step
// for step.
func TestSimulationReplays(t *testing.T) {
	for _, seed := range []uint64{2, 19} {
		a, b := newWorld(t, seed, defaultBudget), newWorld(t, seed, defaultBudget)
		fa, fb := a.run(), b.run()
		if fa != fb || strings.Join(a.s.trace, "\n") != strings.Join(b.s.trace, "\n") {
			for i := range min(len(a.s.trace), len(b.s.trace)) {
				if a.s.trace[i] != b.s.trace[i] {
					t.Fatalf("seed %d: the runs part at step %d:\n%s\n%s", seed, i, a.s.trace[i], b.s.trace[i])
				}
			}
			t.Fatalf("seed %d: the runs differ in length: %d and %d steps", seed, len(a.s.trace), len(b.s.trace))
		}
	}
}
