package claim_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// flipClock is a wall clock two hours ahead and two hours behind at alternate reads.
type flipClock struct{ n atomic.Int64 }

func (c *flipClock) Now() time.Time {
	if c.n.Add(1)%2 == 0 {
		return time.Now().Add(2 * time.Hour)
	}
	return time.Now().Add(-2 * time.Hour)
}
func (c *flipClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// A claim whose registration answer was lost waits the request out, then sends it
// again. The wait is a condition and a requeue for when it ends (one quarantine, on the
// process's monotonic clock), not a reconcile error and not a timer on the wall clock:
// a wall clock that jumps two hours at every read neither stretches the wait nor makes
// the claim come back later than it ends.
func TestAWaitComesBackWhenItEndsWhateverTheClock(t *testing.T) {
	w := newWorld(t)
	w.cfg.Clock = &flipClock{}
	// A lost answer is waited out for the quarantine (in a manager, twice the request
	// timeout): short here.
	w.cfg.RequestTimeout, w.cfg.QuarantineTime = time.Second, 2*time.Second
	w.start()
	pools(w)
	w.create(claimObj("c", "routed", nil))
	must(t, w.api.SetFaults(sim.Faults{DropAfterNext: 1, Routes: []sim.Route{sim.RouteRegister}}))

	key := ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: "c"}}
	var waited time.Duration
	for i := 0; i < 10 && waited == 0; i++ {
		wait, err := waitOf(w.claims.Reconcile(w.ctx, key))
		if c := readyOf(w.get(claimObj("c", "", nil)).(*ipamv1.IPAddressClaim)); c != nil && strings.Contains(c.Message, "may still be in flight") {
			if err != nil {
				t.Fatalf("waiting out an unanswered request is a reconcile error: %v", err)
			}
			waited = wait
		}
		_, _ = w.protector.Reconcile(w.ctx, ctrl.Request{NamespacedName: w.cfg.DefaultSecret}) // protects it
	}
	if w.api.Stats().DroppedAfter != 1 {
		t.Fatalf("the registration's answer was not lost (%d lost)", w.api.Stats().DroppedAfter)
	}
	if waited <= 0 || waited > w.cfg.Quarantine() {
		t.Fatalf("the waiting claim comes back after %v, want when the wait ends (at most the quarantine, %v)\n%s",
			waited, w.cfg.Quarantine(), w.describe())
	}
	time.Sleep(waited)
	w.settle()
	w.bound(t, "c")
	w.check()
}
