package simulation

import (
	"sort"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// queue is a controller's work queue on virtual time, with client-go's semantics: an
// item is queued once, never handed to two workers at once, and one added while it is
// being processed comes back after Done. Which ready item a worker takes is the
// scheduler's draw, from the items in sorted order, so the order of adds (a map's, say)
// does not change a replay.
type queue struct {
	clock      *simClock
	limiter    workqueue.TypedRateLimiter[reconcile.Request]
	dirty      map[reconcile.Request]bool
	processing map[reconcile.Request]bool
	// again: added while being processed.
	again   map[reconcile.Request]bool
	waiting map[reconcile.Request]time.Time
	down    bool
}

var _ workqueue.TypedRateLimitingInterface[reconcile.Request] = &queue{}

func newQueue(clk *simClock, limiter workqueue.TypedRateLimiter[reconcile.Request]) *queue {
	if limiter == nil {
		limiter = workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](5*time.Millisecond, 1000*time.Second)
	}
	return &queue{clock: clk, limiter: limiter, dirty: map[reconcile.Request]bool{}, processing: map[reconcile.Request]bool{},
		again: map[reconcile.Request]bool{}, waiting: map[reconcile.Request]time.Time{}}
}

func (q *queue) Add(item reconcile.Request) {
	if q.down {
		return
	}
	delete(q.waiting, item)
	if q.processing[item] {
		q.again[item] = true
		return
	}
	q.dirty[item] = true
}

func (q *queue) AddAfter(item reconcile.Request, d time.Duration) {
	if d <= 0 {
		q.Add(item)
		return
	}
	if q.down || q.dirty[item] {
		return
	}
	at := q.clock.now.Add(d)
	if w, ok := q.waiting[item]; !ok || at.Before(w) {
		q.waiting[item] = at
	}
}

func (q *queue) AddRateLimited(item reconcile.Request) { q.AddAfter(item, q.limiter.When(item)) }
func (q *queue) Forget(item reconcile.Request)         { q.limiter.Forget(item) }
func (q *queue) NumRequeues(item reconcile.Request) int {
	return q.limiter.NumRequeues(item)
}

// promote makes the items whose delay ran out ready.
func (q *queue) promote() {
	for item, at := range q.waiting {
		if !q.clock.now.Before(at) {
			delete(q.waiting, item)
			q.Add(item)
		}
	}
}

// readyItems is the items a worker may take now, sorted.
func (q *queue) readyItems() []reconcile.Request {
	out := make([]reconcile.Request, 0, len(q.dirty))
	for item := range q.dirty {
		out = append(out, item)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// take hands item to a worker.
func (q *queue) take(item reconcile.Request) {
	delete(q.dirty, item)
	q.processing[item] = true
}

func (q *queue) Done(item reconcile.Request) {
	delete(q.processing, item)
	if q.again[item] {
		delete(q.again, item)
		q.Add(item)
	}
}

// next is the earliest delayed item's time (zero: none).
func (q *queue) next() time.Time {
	var out time.Time
	for _, at := range q.waiting {
		if out.IsZero() || at.Before(out) {
			out = at
		}
	}
	return out
}

func (q *queue) Get() (reconcile.Request, bool) {
	panic("the simulation's workers take items themselves")
}
func (q *queue) Len() int           { return len(q.dirty) }
func (q *queue) ShutDown()          { q.down = true }
func (q *queue) ShutDownWithDrain() { q.down = true }
func (q *queue) ShuttingDown() bool { return q.down }
