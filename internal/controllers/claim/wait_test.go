package claim

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// A claim without an IPAddress that waits ends its reconcile with an error (ipamutil's loop
// would create the IPAddress otherwise): the controller queues it again when the wait ends,
// and its back-off starts over; any other failure backs off. The log says Waiting, at V(1),
// not "Reconciler error".
func TestAWaitComesBackWhenItEndsAndIsLoggedAsAWait(t *testing.T) {
	r := &Reconciler{}
	limiter := waitLimiter{
		TypedRateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](backoffBase, backoffMax),
		waits:            &r.waits,
	}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "apps", Name: "c"}}
	for i, want := range []time.Duration{backoffBase, 2 * backoffBase} {
		if d := limiter.When(req); d != want {
			t.Fatalf("failure %d backs off %s, want %s", i+1, d, want)
		}
	}
	h := &Handler{Reconciler: r, claim: &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "c"}}}
	err := fmt.Errorf("failed to create or patch address: %w", h.waiting(7*time.Second, errors.New("an earlier registration may still be in flight")))
	if d := limiter.When(req); d != 7*time.Second {
		t.Fatalf("a wait of 7s comes back after %s", d)
	}
	if d := limiter.When(req); d != backoffBase {
		t.Fatalf("after a wait, a failure backs off %s, want %s (from the start)", d, backoffBase)
	}

	var lines []string
	r.log = funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: 1})
	log := r.logFor(&req)
	log.Error(err, "Reconciler error")
	log.Error(errors.New("connection refused"), "Reconciler error")
	all := strings.Join(lines, "\n")
	if len(lines) != 2 || strings.Count(all, "Reconciler error") != 1 || !strings.Contains(lines[0], `"msg"="Waiting"`) ||
		!strings.Contains(lines[0], "may still be in flight") || !strings.Contains(lines[0], `"level"=1`) {
		t.Fatalf("the log of a wait and of a failure:\n%s", all)
	}
	r.log = funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: 0})
	lines = nil
	r.logFor(&req).Error(err, "Reconciler error")
	if len(lines) != 0 {
		t.Fatalf("a wait logged at the default verbosity: %q", lines)
	}
}
