package claim

import (
	"context"
	"strconv"
	"time"

	"github.com/pkg/errors"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/predicates"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/ipamutil"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
)

// Reconciler reconciles the IPAddressClaims of this provider's pools. Its loop is
// modelled on ipamutil.ClaimReconciler (v1.1.0: the finalizer first, FetchPool, the
// IPAddress created or patched around EnsureAddress, ReleaseAddress on deletion, the
// same finalizers, owner references and pausing), calling the Handler's methods of
// ipamutil.ClaimHandler. ipamutil's reconciler is not used, for one reason: its
// Cluster API patch helper writes a claim's conditions
// and its addressRef in two status patches, and re-sends annotations the handler has
// already written. Here the claim's metadata and its status each go out in at most one
// patch, holding only what changed since the last write, and the finalizer goes out
// with the pending record: a claim is bound with three writes (finalizer and pending
// record, IPAddress, status with addressRef and Ready).
type Reconciler struct {
	Client           client.Client
	WatchFilterValue string
	Adapter          *Adapter
}

// SetupWithManager registers the claim controller: ipamutil's watches (claims, and
// Clusters that are unpaused) and the Adapter's.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		Named("ipaddressclaim").
		WithEventFilter(predicates.ResourceNotPausedAndHasFilterLabel(mgr.GetScheme(), ctrl.LoggerFrom(ctx), r.WatchFilterValue)).
		// An unpaused Cluster re-queues its claims.
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(r.clusterToClaims), builder.WithPredicates(clusterUnpaused()))
	if err := r.Adapter.SetupWithManager(ctx, b); err != nil {
		return err
	}
	return b.Complete(r)
}

// Reconcile binds or releases one claim.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	// The waiting back-off counts the waits in a row: any other end of a reconcile
	// (the claim went on, failed, or is gone) starts it again.
	waited := false
	defer func() {
		if !waited {
			r.Adapter.waits().Forget(req.NamespacedName)
		}
	}()
	claim := &ipamv1.IPAddressClaim{}
	if err := r.Client.Get(ctx, req.NamespacedName, claim); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if paused, err := r.clusterPaused(ctx, claim); err != nil || paused {
		return ctrl.Result{}, err
	}
	h := &Handler{Adapter: r.Adapter, claim: claim, written: claim.DeepCopy()}
	defer func() {
		if err := h.patchClaim(ctx); err != nil {
			reterr = kerrors.NewAggregate([]error{reterr, err})
		}
	}()
	// The finalizer goes out with the claim's first write (its pending record, before
	// anything is sent), not in a reconcile and a write of its own as in ipamutil.
	if !controllerutil.ContainsFinalizer(claim, ipamutil.ReleaseAddressFinalizer) {
		if !claim.DeletionTimestamp.IsZero() {
			return ctrl.Result{}, nil // never registered anything: nothing to release
		}
		controllerutil.AddFinalizer(claim, ipamutil.ReleaseAddressFinalizer)
	}

	pool, res, err := h.FetchPool(ctx)
	if errors.Is(err, errPoolNotCached) {
		// Nothing is written (not even the finalizer) until the pool is seen; its watch
		// event brings the claim back, the requeue is a fallback.
		h.claim = h.written.DeepCopy()
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if err != nil || res != nil {
		if apierrors.IsNotFound(err) {
			if !claim.DeletionTimestamp.IsZero() {
				return r.reconcileDelete(ctx, claim, h)
			}
			return ctrl.Result{}, nil // the pool's watch brings the claim back
		}
		return unwrap(res), errors.Wrap(err, "failed to fetch pool")
	}
	if annotations.HasPaused(pool) {
		ctrl.LoggerFrom(ctx).V(2).Info("The claim's pool is paused, skipping reconciliation", "pool", pool.GetName())
		h.claim = h.written.DeepCopy() // nothing is written, not even the finalizer
		return ctrl.Result{}, nil
	}
	if !claim.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, claim, h)
	}

	// ipamutil's IPAddress: named after the claim, owned by it (controller) and the pool.
	address := ipamutil.NewIPAddress(claim, pool)
	op, err := createOrPatchAddress(ctx, r.Client, &address, func() error {
		if res, err = h.EnsureAddress(ctx, &address); err != nil {
			return err
		}
		if err := controllerutil.SetOwnerReference(pool, &address, r.Client.Scheme()); err != nil {
			return errors.Wrap(err, "failed to ensure owner references on address")
		}
		if err := controllerutil.SetControllerReference(claim, &address, r.Client.Scheme()); err != nil {
			return errors.Wrap(err, "failed to ensure owner references on address")
		}
		if v, ok := claim.Labels[clusterv1.ClusterNameLabel]; ok {
			if address.Labels == nil {
				address.Labels = map[string]string{}
			}
			address.Labels[clusterv1.ClusterNameLabel] = v
		}
		// No ipamutil ProtectAddress finalizer: the claim's record and the IPAM-API hold
		// the address, not the IPAddress, so a lost IPAddress is made again with the same
		// address (a subnet pick counts the claim's record too). Without it a delete
		// costs one request fewer, and an IPAddress never outlives an uninstalled
		// provider. One from an earlier version is taken off when its claim goes.
		return nil
	})
	if res, backoff, ok := r.waiting(ctx, req.NamespacedName, err); ok {
		waited = backoff
		return res, nil
	}
	if res != nil || err != nil {
		return unwrap(res), errors.Wrap(err, "failed to create or patch address")
	}
	if op == controllerutil.OperationResultCreated {
		ctrl.LoggerFrom(ctx).V(2).Info("IPAddress created", "address", address.Spec.Address)
		// Subnet picks of other claims count the address from now on, not from when the
		// cache shows it.
		h.subnets.observe(&address, false)
		// The claim's status (addressRef, Ready) is patched first; then the reconcile
		// waits until the cache shows the IPAddress, and only then forgets what this
		// process kept about the request (see patchClaim).
		h.created = &address
		if h.boundHasWork(&address) {
			// The pending record sent was made before the claim's annotations changed (or
			// a rotation is recorded): bound carries the change, at once.
			res = &ctrl.Result{RequeueAfter: time.Millisecond}
		}
	}
	claim.Status.AddressRef = ipamv1.IPAddressReference{Name: address.Name}
	return unwrap(res), nil
}

// reconcileDelete releases the address, then lets the IPAddress and the claim go.
func (r *Reconciler) reconcileDelete(ctx context.Context, claim *ipamv1.IPAddressClaim, h *Handler) (ctrl.Result, error) {
	res, err := h.ReleaseAddress(ctx)
	if res, _, ok := r.waiting(ctx, client.ObjectKeyFromObject(claim), err); ok {
		return res, nil
	}
	if err != nil {
		return unwrap(res), errors.Wrap(err, "release address")
	}
	if res != nil && (res.RequeueAfter > 0 || res.Requeue) { //nolint:staticcheck // ipamutil's contract
		return *res, nil
	}
	address := &ipamv1.IPAddress{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(claim), address); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, errors.Wrap(err, "failed to fetch address")
	}
	if controllerutil.ContainsFinalizer(address, ipamutil.ProtectAddressFinalizer) {
		// Written by an earlier version (this one adds none).
		p := client.MergeFrom(address.DeepCopy())
		controllerutil.RemoveFinalizer(address, ipamutil.ProtectAddressFinalizer)
		if err := r.Client.Patch(ctx, address, p); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, errors.Wrap(err, "failed to remove address finalizer")
		}
	}
	// Deleted by name, whatever the cache shows: a cache that lags (after an API server
	// restart, say) may not show an IPAddress that exists, and the claim would go
	// without it.
	gone := &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Namespace: claim.Namespace, Name: claim.Name}}
	if err := r.Client.Delete(ctx, gone); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, errors.Wrap(err, "failed to delete address")
	}
	controllerutil.RemoveFinalizer(claim, ipamutil.ReleaseAddressFinalizer)
	return ctrl.Result{}, nil
}

// waiting turns the error of a waiting outcome into the reconcile's result: no error,
// and the claim back when its wait ends, or (backoff) with the waiting back-off when
// nothing tells when that is.
func (r *Reconciler) waiting(ctx context.Context, key types.NamespacedName, err error) (_ ctrl.Result, backoff, ok bool) {
	var w waitError
	if !errors.As(err, &w) {
		return ctrl.Result{}, false, false
	}
	ctrl.LoggerFrom(ctx).V(1).Info("Waiting", "reason", w.Error())
	if w.after > 0 {
		return ctrl.Result{RequeueAfter: w.after}, false, true
	}
	return ctrl.Result{RequeueAfter: r.Adapter.waits().When(key)}, true, true
}

// clusterPaused reports whether the claim's Cluster (by spec.clusterName or the
// cluster-name label) is paused. A live claim of a Cluster that is not found waits; a
// deleted one goes on (the Cluster may be gone before its claims).
func (r *Reconciler) clusterPaused(ctx context.Context, claim *ipamv1.IPAddressClaim) (bool, error) {
	name := claim.Spec.ClusterName
	if name == "" {
		name = claim.Labels[clusterv1.ClusterNameLabel]
	}
	if name == "" {
		return false, nil
	}
	cluster := &clusterv1.Cluster{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: name}, cluster)
	switch {
	case apierrors.IsNotFound(err):
		if claim.DeletionTimestamp.IsZero() {
			ctrl.LoggerFrom(ctx).Info("IPAddressClaim linked to a cluster that is not found, unable to determine cluster's paused state, skipping reconciliation")
			return true, nil
		}
		return false, nil
	case err != nil:
		return false, errors.Wrap(err, "fetching the claim's Cluster")
	}
	if annotations.IsPaused(cluster, cluster) {
		ctrl.LoggerFrom(ctx).V(2).Info("IPAddressClaim linked to a cluster that is paused, skipping reconciliation")
		return true, nil
	}
	return false, nil
}

func (r *Reconciler) clusterToClaims(ctx context.Context, o client.Object) []reconcile.Request {
	claims := &ipamv1.IPAddressClaimList{}
	if err := r.Client.List(ctx, claims, client.InNamespace(o.GetNamespace()), client.MatchingFields{index.ClaimClusterName: o.GetName()}); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(claims.Items))
	for _, c := range claims.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&c)})
	}
	return reqs
}

func clusterUnpaused() predicate.Funcs {
	paused := func(o client.Object) bool { c, ok := o.(*clusterv1.Cluster); return ok && annotations.IsPaused(c, c) }
	return predicate.Funcs{
		UpdateFunc:  func(e event.UpdateEvent) bool { return paused(e.ObjectOld) && !paused(e.ObjectNew) },
		CreateFunc:  func(e event.CreateEvent) bool { return !paused(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return !paused(e.Object) },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// patchClaim writes what the reconcile changed on the claim since it was read or last
// written: its metadata in one patch, its status (addressRef, conditions) in another.
func (h *Handler) patchClaim(ctx context.Context) error {
	var errs []error
	lastFinalizer := !h.claim.DeletionTimestamp.IsZero() && len(h.claim.Finalizers) == 0 && len(h.written.Finalizers) > 0
	err := h.patchMetadata(ctx)
	if err == nil && lastFinalizer {
		// The last finalizer went: the API server deleted the claim and answered with its
		// last stored state (the old resourceVersion, the finalizer still on). Only its
		// absence from the cache tells the next reconcile not to release it again.
		_ = waitForCache(ctx, h.Client, &ipamv1.IPAddressClaim{}, client.ObjectKeyFromObject(h.claim), "", untilGone)
		return nil
	}
	if err != nil {
		errs = append(errs, errors.Wrap(err, "patching the claim"))
	}
	if !apiequality.Semantic.DeepEqual(h.claim.Status, h.written.Status) {
		st := statusOnly(h.claim)
		if err := h.Client.Status().Patch(ctx, st, client.MergeFrom(statusOnly(h.written))); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, errors.Wrap(err, "patching the claim's status"))
		} else {
			h.written.Status = *h.claim.Status.DeepCopy()
			h.writtenVersion = st.ResourceVersion
		}
	}
	if a := h.created; a != nil {
		// As ipamutil does: the next reconcile must see the new IPAddress in the cache, or
		// it would create it again. Then the IPAddress speaks for the claim, in the cache
		// too, and what this process kept about its request goes, as in bound (no second
		// reconcile comes to do it: the creation of a claim's own IPAddress and its
		// finalizer do not re-queue it). Waiting after the status patch, not before it,
		// binds the claim one watch delay sooner.
		if err := waitForCache(ctx, h.Client, &ipamv1.IPAddress{}, client.ObjectKeyFromObject(a), a.ResourceVersion, untilSeen); err != nil {
			errs = append(errs, errors.Wrapf(err, "waiting for IPAddress %s to be visible in the cache after create", a.Name))
		} else {
			h.forget()
		}
	}
	if h.writtenVersion != "" {
		// The next reconcile must not act on the copy before this reconcile's writes
		// (also those made on the way, such as a pending record, and also when a later
		// write failed): it would write them again, or take the attempt it finds for one
		// whose answer this process never saw. A claim that is gone is done.
		_ = waitForCache(ctx, h.Client, &ipamv1.IPAddressClaim{}, client.ObjectKeyFromObject(h.claim), h.writtenVersion, untilSeenOrGone)
	}
	return kerrors.NewAggregate(errs)
}

// patchMetadata writes the claim's metadata (finalizers, annotations, labels) where it
// differs from what was written, on the version it was read at or last written: a
// reconcile that acted on a stale read (a cache that has not caught up after an API
// server restart, say, and does not show the claim's deletion) gets a conflict here,
// before the request its record announces goes out, and is run again on what the API
// server has.
func (h *Handler) patchMetadata(ctx context.Context) error {
	meta, written := withoutStatus(h.claim), withoutStatus(h.written)
	if apiequality.Semantic.DeepEqual(meta.ObjectMeta, written.ObjectMeta) && apiequality.Semantic.DeepEqual(meta.Spec, written.Spec) {
		return nil
	}
	err := h.Client.Patch(ctx, meta, client.MergeFromWithOptions(written, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsNotFound(err) && len(meta.Finalizers) == 0 {
		return nil // a claim whose last finalizer went is gone
	}
	if err != nil {
		return err
	}
	// What the API server answered is what it has: the claim takes its resourceVersion
	// and the other fields the server sets.
	h.claim.ObjectMeta = *meta.ObjectMeta.DeepCopy()
	status := h.written.Status
	h.written = meta
	h.written.Status = status
	h.writtenVersion = meta.ResourceVersion
	return nil
}

// createOrPatchAddress is controllerutil.CreateOrPatch for an IPAddress, which has no
// status: it reads the IPAddress; if there is none, mutate fills it in and it is
// created; else mutate changes it and what changed is patched (nothing, when nothing
// did). CreateOrPatch makes three deep copies, two conversions to unstructured and a
// DeepEqual over them on every reconcile of a bound claim; this makes one copy and
// compares it with the forked DeepEqual that counts nil and empty maps as equal, as
// the unstructured comparison does.
func createOrPatchAddress(ctx context.Context, c client.Client, address *ipamv1.IPAddress, mutate func() error) (controllerutil.OperationResult, error) {
	key := client.ObjectKeyFromObject(address)
	if err := c.Get(ctx, key, address); err != nil {
		if !apierrors.IsNotFound(err) {
			return controllerutil.OperationResultNone, err
		}
		if err := mutateAddress(address, key, mutate); err != nil {
			return controllerutil.OperationResultNone, err
		}
		if err := c.Create(ctx, address); err != nil {
			return controllerutil.OperationResultNone, err
		}
		return controllerutil.OperationResultCreated, nil
	}
	before := address.DeepCopy()
	if err := mutateAddress(address, key, mutate); err != nil {
		return controllerutil.OperationResultNone, err
	}
	if apiequality.Semantic.DeepEqual(before, address) {
		return controllerutil.OperationResultNone, nil
	}
	if err := c.Patch(ctx, address, client.MergeFrom(before)); err != nil {
		return controllerutil.OperationResultNone, err
	}
	return controllerutil.OperationResultUpdated, nil
}

// mutateAddress runs mutate and refuses a change of the IPAddress's name or namespace,
// as controllerutil does.
func mutateAddress(address *ipamv1.IPAddress, key types.NamespacedName, mutate func() error) error {
	if err := mutate(); err != nil {
		return err
	}
	if client.ObjectKeyFromObject(address) != key {
		return errors.New("MutateFn cannot mutate object name and/or object namespace")
	}
	return nil
}

// cacheWait is what waitForCache waits for.
type cacheWait int

const (
	// untilSeen: the object at the resourceVersion or later.
	untilSeen cacheWait = iota
	// untilSeenOrGone: that, or the object no longer there.
	untilSeenOrGone
	// untilGone: the object no longer there.
	untilGone
)

// waitForCache waits (1 ms polls, at most 5 s) until the cache holds the object at key
// as until says. obj is an empty object of the kind.
func waitForCache(ctx context.Context, c client.Reader, obj client.Object, key types.NamespacedName, rv string, until cacheWait) error {
	want, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		want = 0 // not a number: the object being there is enough
	}
	return wait.PollUntilContextTimeout(ctx, time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, key, obj); err != nil {
			if apierrors.IsNotFound(err) {
				return until != untilSeen, nil
			}
			return false, err
		}
		if until == untilGone {
			return false, nil
		}
		got, err := strconv.ParseUint(obj.GetResourceVersion(), 10, 64)
		return err != nil || got >= want, nil
	})
}

func withoutStatus(c *ipamv1.IPAddressClaim) *ipamv1.IPAddressClaim {
	out := c.DeepCopy()
	out.Status = ipamv1.IPAddressClaimStatus{}
	return out
}

func statusOnly(c *ipamv1.IPAddressClaim) *ipamv1.IPAddressClaim {
	out := &ipamv1.IPAddressClaim{TypeMeta: c.TypeMeta, Status: *c.Status.DeepCopy()}
	out.Namespace, out.Name, out.UID = c.Namespace, c.Name, c.UID
	return out
}

func unwrap(res *ctrl.Result) ctrl.Result {
	if res == nil {
		return ctrl.Result{}
	}
	return *res
}
