package registrar

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// Queue brings objects to a controller from outside its watches: the Secret protector
// wakes claims, and waiting claims ask the protector to look at a Secret. Add puts them
// straight into the controller's work queue, which is unbounded: it never blocks, and
// while the controller runs it never drops. Before the controller has started, Add drops:
// a controller starts its sources before it reconciles every object once. The zero value
// is ready to use.
type Queue struct {
	mu sync.Mutex
	q  workqueue.TypedRateLimitingInterface[reconcile.Request]
}

// Source is the controller's end of the queue (WatchesRawSource).
func (w *Queue) Source() source.Source {
	return source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.q = q
		return nil
	})
}

// Add enqueues the objects of keys, and reports whether the controller has started (false:
// dropped).
func (w *Queue) Add(keys ...types.NamespacedName) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.q == nil {
		return false
	}
	for _, k := range keys {
		w.q.Add(reconcile.Request{NamespacedName: k})
	}
	return true
}
