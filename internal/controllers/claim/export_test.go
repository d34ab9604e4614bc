package claim

import (
	"errors"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Observe tells the Reconciler what an IPAddress or claim names now (gone: it is
// deleted), as the cache's events do in a manager.
func (r *Reconciler) Observe(o client.Object, gone bool) { r.subnets.observe(o, gone) }

// Cached tells the Reconciler that the cache shows o now, or no longer (gone), as the
// cache's create and delete events do in a manager.
func (r *Reconciler) Cached(o client.Object, gone bool) { r.cached(o, gone) }

// WaitOf is the wait a reconcile's error stands for: the claim comes back after it, without
// back-off (ok false: not a wait).
func WaitOf(err error) (time.Duration, bool) {
	var w *waiting
	if errors.As(err, &w) {
		return w.d, true
	}
	return 0, false
}
