package claim

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/ipamutil"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
)

// Reconcile runs ipamutil's claim loop once for the claim of req, with this provider as its
// adapter: the loop the manager's controller runs, driven directly by tests.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return r.loop().Reconcile(ctx, req)
}

// loop is ipamutil's ClaimReconciler with this provider as its ProviderAdapter. It does
// what every Cluster API IPAM provider on ipamutil does: it skips claims of paused Clusters
// and pools, adds the release finalizer first, creates or patches the IPAddress (owned by
// claim and pool, with the ProtectAddress finalizer) once the handler filled it, waits for it
// in the cache, sets the claim's addressRef, and on deletion deletes the IPAddress and
// removes the finalizer after the handler released the address; Cluster API's patch helper
// writes the claim.
func (r *Reconciler) loop() *ipamutil.ClaimReconciler {
	return &ipamutil.ClaimReconciler{Client: r.Client, Scheme: r.Client.Scheme(), WatchFilterValue: r.Config.WatchFilterValue, Adapter: adapter{r}}
}

// adapter is this provider's ipamutil.ProviderAdapter: its watches (SetupWithManager, in
// watches.go) and a Handler per reconcile.
type adapter struct{ *Reconciler }

var _ ipamutil.ProviderAdapter = adapter{}

// ClaimHandlerFor is the handler of one reconcile of claim, as the loop read it. Another
// provider's claim (ipamutil's Cluster watch enqueues every claim of a Cluster) gets one that
// stops the loop before it does anything more.
func (a adapter) ClaimHandlerFor(_ client.Client, claim *ipamv1.IPAddressClaim) ipamutil.ClaimHandler {
	if ref := claim.Spec.PoolRef; ref.APIGroup != ipamv1alpha1.GroupVersion.Group || !slices.Contains(poolKinds, ref.Kind) {
		return notOurs{}
	}
	if claim.DeletionTimestamp.IsZero() {
		a.InFlight.SawAlive(claim.UID) // deleted later, only this process releases it
	}
	// A wait an earlier reconcile ended in was used when the claim was queued again (or the
	// claim came back sooner, by a watch): this reconcile's own counts.
	a.waits.Delete(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(claim)})
	return &Handler{Reconciler: a.Reconciler, claim: claim, read: claim.DeepCopy(), written: claim.DeepCopy()}
}

// notOurs is the handler of another provider's claim: it stops the loop (a result without
// an error), which then writes nothing more.
type notOurs struct{}

func (notOurs) FetchPool(context.Context) (client.Object, *ctrl.Result, error) {
	return nil, &ctrl.Result{}, nil
}

func (notOurs) EnsureAddress(context.Context, *ipamv1.IPAddress) (*ctrl.Result, error) {
	return nil, errors.New("not this provider's claim")
}

func (notOurs) ReleaseAddress(context.Context) (*ctrl.Result, error) {
	return nil, errors.New("not this provider's claim")
}

// FetchPool reads the claim's pool. A deleted claim whose pool is gone gets NotFound, and the
// loop releases it without one; a live one says so in its Ready condition and waits for the
// pool's watch. A claim this process released, and the API server no longer has, stops the
// loop: only the cache still shows it.
func (h *Handler) FetchPool(ctx context.Context) (client.Object, *ctrl.Result, error) {
	if h.goneAfterRelease(ctx) {
		return nil, &ctrl.Result{}, nil
	}
	pool, err := h.fetchPool(ctx)
	switch {
	case errors.Is(err, errPoolNotCached):
		// Created moments ago: its watch event (or the wait's end) brings the claim back.
		return nil, nil, h.waiting(time.Second, err)
	case err != nil:
		return nil, nil, err
	}
	return pool, nil, nil
}

// EnsureAddress binds the claim: allocate registers an address for a claim without an
// IPAddress, bound keeps an existing one true to the claim's annotations. The loop creates
// or patches the IPAddress only if this returns no error, and drops the result of a claim
// without one: every wait of such a claim is an error (waiting), brought back when the wait
// ends.
func (h *Handler) EnsureAddress(ctx context.Context, address *ipamv1.IPAddress) (*ctrl.Result, error) {
	defer h.handOver(ctx)
	exists := address.ResourceVersion != ""
	if !exists && h.namespaceEnding(ctx, h.claim.Namespace) {
		// Nothing is registered for a claim its namespace is taking away (nor can its
		// IPAddress be created there); its deletion, which follows, releases what its
		// record names.
		return nil, h.waiting(time.Minute, errors.Errorf("namespace %s is being deleted: nothing is allocated for the claim, "+
			"and what its record names is released when the claim goes", h.claim.Namespace))
	}
	h.creating = !exists
	o := h.bound
	if !exists {
		o = h.allocate
	}
	res, err := h.report(ctx, o(ctx, address))
	switch {
	case err != nil:
		return nil, err
	case !res.IsZero():
		return &res, nil // a bound claim's wait: the loop patches the IPAddress and comes back
	}
	// A new IPAddress: the claim's addressRef, once written, brings it back (claimChanged),
	// and bound says Ready then, and carries what the claim's annotations ask of the address
	// since it was registered.
	return nil, nil
}

// ReleaseAddress releases what the claim's record names; the loop then deletes the IPAddress
// and removes the finalizer. A claim this process released already (the cache still shows
// it with its finalizer, or removing that failed) sends nothing again; nor does one the cache
// no longer shows, which the loop read a moment before the cache showed it gone.
func (h *Handler) ReleaseAddress(ctx context.Context) (*ctrl.Result, error) {
	defer h.handOver(ctx)
	if _, done := h.releasedHere.Load(h.claim.UID); done {
		record.Remove(h.claim)
		return nil, nil
	}
	if h.goneFromCache(ctx) {
		// The claim is gone: coming back, the loop finds nothing to do.
		return &ctrl.Result{RequeueAfter: time.Millisecond}, nil
	}
	res, err := h.report(ctx, h.release(ctx))
	switch {
	case err != nil:
		return nil, err
	case !res.IsZero():
		return &res, nil
	}
	h.releasedHere.Store(h.claim.UID, struct{}{})
	h.refusals.Delete(h.claimKey())
	return nil, h.deleteUncachedAddress(ctx)
}

// deleteUncachedAddress deletes the claim's IPAddress if the cache does not show it yet (one
// another process created moments ago, say): the loop deletes only one the cache shows, and
// its ProtectAddress finalizer would keep one it missed for good.
func (h *Handler) deleteUncachedAddress(ctx context.Context) error {
	key := client.ObjectKeyFromObject(h.claim)
	if err := h.Client.Get(ctx, key, &ipamv1.IPAddress{}); h.Reader == nil || !apierrors.IsNotFound(err) {
		return nil // shown: the loop deletes it
	}
	addr := &ipamv1.IPAddress{}
	if err := h.Reader.Get(ctx, key, addr); err != nil || !metav1.IsControlledBy(addr, h.claim) {
		return errors.Wrap(client.IgnoreNotFound(err), "reading the claim's IPAddress")
	}
	p := client.MergeFromWithOptions(addr.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if controllerutil.RemoveFinalizer(addr, ipamutil.ProtectAddressFinalizer) {
		if err := h.Client.Patch(ctx, addr, p); err != nil {
			return errors.Wrap(client.IgnoreNotFound(err), "removing the IPAddress's finalizer")
		}
	}
	return errors.Wrap(client.IgnoreNotFound(h.Client.Delete(ctx, addr, client.Preconditions{UID: &addr.UID})), "deleting the claim's IPAddress")
}

// goneAfterRelease reports whether this process released the claim and the API server no
// longer has it (read uncached): the cache still shows it deleting with its finalizer, the
// event of its end on the way.
func (h *Handler) goneAfterRelease(ctx context.Context) bool {
	if _, done := h.releasedHere.Load(h.claim.UID); !done || h.Reader == nil {
		return false
	}
	return apierrors.IsNotFound(h.Reader.Get(ctx, client.ObjectKeyFromObject(h.claim), &ipamv1.IPAddressClaim{}))
}

// goneFromCache reports whether the cache no longer shows the claim the loop read from it
// (or shows another of its name): the API server deleted it, its finalizers gone, so nothing
// is left to release. The claim's delete event, which takes it out of releasedHere, may come
// after the loop read it. Called after releasedHere was looked at, just before a release: the
// cache drops a claim before that event, so a claim this process released is found in one or
// the other, and a release is sent only for a claim it did not release.
func (h *Handler) goneFromCache(ctx context.Context) bool {
	cur := &ipamv1.IPAddressClaim{}
	err := h.Client.Get(ctx, client.ObjectKeyFromObject(h.claim), cur)
	return apierrors.IsNotFound(err) || err == nil && cur.UID != h.claim.UID
}

// namespaceEnding reports whether the namespace is being deleted, as the cache shows it (one
// the cache does not show yet is not: reading it for the claim's identity fails, and retries).
func (r *Reconciler) namespaceEnding(ctx context.Context, name string) bool {
	ns := &corev1.Namespace{}
	return r.Client.Get(ctx, client.ObjectKey{Name: name}, ns) == nil && !ns.DeletionTimestamp.IsZero()
}

// waiting is a reconcile that ended in a wait whose end is known: the claim controller's rate
// limiter brings the claim back when it ends (waitLimiter), and its log says Waiting, not
// "Reconciler error" (quietWaits).
type waiting struct {
	err error
	d   time.Duration
}

func (w *waiting) Error() string { return w.err.Error() }
func (w *waiting) Unwrap() error { return w.err }

// waiting returns the error of a wait of d: the claim comes back after d, without back-off.
func (h *Handler) waiting(d time.Duration, err error) error {
	d = max(d, time.Millisecond)
	h.waits.Store(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(h.claim)}, d)
	return &waiting{err: fmt.Errorf("%w (again in %s)", err, d.Round(time.Millisecond)), d: d}
}
