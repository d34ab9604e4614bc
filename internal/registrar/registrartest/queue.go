package registrartest

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// Start starts q's source as a controller would, into a work queue of its own.
func Start(t *testing.T, q *registrar.Queue) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	t.Helper()
	wq := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	t.Cleanup(wq.ShutDown)
	if err := q.Source().Start(context.Background(), wq); err != nil {
		t.Fatal(err)
	}
	return wq
}

// Drain takes what is in the work queue, in order.
func Drain(wq workqueue.TypedRateLimitingInterface[reconcile.Request]) []types.NamespacedName {
	var out []types.NamespacedName
	for wq.Len() > 0 {
		r, _ := wq.Get()
		wq.Done(r)
		out = append(out, r.NamespacedName)
	}
	return out
}
