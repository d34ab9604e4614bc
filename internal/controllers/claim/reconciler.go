package claim

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/ipamutil"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
)

// Reconcile binds or releases one claim; a deferred patchClaim writes what is left to write.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	claim := &ipamv1.IPAddressClaim{}
	if err := r.Client.Get(ctx, req.NamespacedName, claim); err != nil {
		if apierrors.IsNotFound(err) {
			r.refusals.Delete(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if ref := claim.Spec.PoolRef; ref.APIGroup != ipamv1alpha1.GroupVersion.Group || !slices.Contains(poolKinds, ref.Kind) {
		return ctrl.Result{}, nil // another provider's claim, enqueued by its Cluster: not touched
	}
	if paused, err := r.clusterPaused(ctx, claim); err != nil || paused {
		return ctrl.Result{}, err
	}
	h := &Handler{Reconciler: r, claim: claim, written: claim.DeepCopy()}
	defer func() {
		if err := h.patchClaim(ctx); err != nil {
			reterr = kerrors.NewAggregate([]error{reterr, err})
		}
	}()
	deleting := !claim.DeletionTimestamp.IsZero()
	if !deleting {
		r.InFlight.SawAlive(claim.UID) // deleted later, only this process releases it
	}
	if deleting && !controllerutil.ContainsFinalizer(claim, ipamutil.ReleaseAddressFinalizer) {
		return ctrl.Result{}, nil // never registered anything: nothing to release
	}
	pool, err := h.fetchPool(ctx)
	switch {
	case errors.Is(err, errPoolNotCached):
		// Nothing is written until the pool is cached; its watch event (or the requeue) brings it back.
		return ctrl.Result{RequeueAfter: time.Second}, nil
	case apierrors.IsNotFound(err) && deleting:
		return r.reconcileDelete(ctx, h) // release works from the records alone
	case apierrors.IsNotFound(err):
		return ctrl.Result{}, nil // the pool's watch brings the claim back
	case err != nil:
		return ctrl.Result{}, errors.Wrap(err, "failed to fetch pool")
	case annotations.HasPaused(pool):
		// A paused pool holds its claims' deletes too; its unpause brings them back.
		ctrl.LoggerFrom(ctx).V(2).Info("The claim's pool is paused, skipping reconciliation", "pool", pool.GetName())
		return ctrl.Result{}, nil
	case deleting:
		return r.reconcileDelete(ctx, h)
	}
	return r.reconcileNormal(ctx, h, pool)
}

// reconcileNormal binds a live claim (allocate, or bound if its IPAddress exists); the
// IPAddress is created or patched only after that succeeded.
func (r *Reconciler) reconcileNormal(ctx context.Context, h *Handler, pool ipamv1alpha1.Pool) (ctrl.Result, error) {
	claim := h.claim
	// ipamutil's IPAddress: named after the claim, owned by it (controller) and the pool.
	address := ipamutil.NewIPAddress(claim, pool)
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(&address), &address)
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, errors.Wrap(err, "failed to fetch address")
	}
	exists := err == nil
	if !exists && r.namespaceEnding(ctx, claim.Namespace) {
		// Nothing is registered for a claim its namespace is taking away (nor can its
		// IPAddress be created there); its deletion releases what its record names.
		ctrl.LoggerFrom(ctx).V(2).Info("The claim's namespace is being deleted, skipping allocation")
		return ctrl.Result{}, nil
	}
	before := address.DeepCopy()
	o := h.bound
	if !exists {
		o = h.allocate
	}
	if res, err := h.report(ctx, o(ctx, &address)); err != nil || !res.IsZero() {
		return res, err
	}
	if err := controllerutil.SetOwnerReference(pool, &address, r.Client.Scheme()); err != nil {
		return ctrl.Result{}, errors.Wrap(err, "failed to ensure owner references on address")
	}
	if err := controllerutil.SetControllerReference(claim, &address, r.Client.Scheme()); err != nil {
		return ctrl.Result{}, errors.Wrap(err, "failed to ensure owner references on address")
	}
	if v, ok := claim.Labels[clusterv1.ClusterNameLabel]; ok {
		if address.Labels == nil {
			address.Labels = map[string]string{}
		}
		address.Labels[clusterv1.ClusterNameLabel] = v
	}
	// No ProtectAddress finalizer: the claim's record and the IPAM-API hold the address, so a
	// lost IPAddress is made again with the same one (subnet picks count the claim's record).
	// A delete costs one request fewer, and no IPAddress outlives an uninstalled provider.
	res := ctrl.Result{}
	switch {
	case !exists:
		if err := r.Client.Create(ctx, &address); apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			// Registered as the namespace's deletion began: the claim's deletion, which
			// follows, releases it from the claim's record.
			conditions.Set(claim, metav1.Condition{Type: ipamv1.IPAddressClaimReadyCondition, Status: metav1.ConditionFalse,
				Reason: ipamv1.IPAddressClaimReadyAllocationFailedReason, Message: fmt.Sprintf("namespace %s is being deleted: "+
					"the IPAddress cannot be created, and the address is released when the claim goes", claim.Namespace)})
			return ctrl.Result{}, nil
		} else if err != nil {
			return ctrl.Result{}, errors.Wrap(err, "failed to create address")
		}
		ctrl.LoggerFrom(ctx).V(2).Info("IPAddress created", "address", address.Spec.Address)
		// Other claims' subnet picks count the address from now on, not once it is cached.
		h.subnets.observe(&address, false)
		// Waited for in the cache after the status patch (see patchClaim).
		h.created = &address
		if h.boundHasWork(&address) {
			// bound carries the change at once.
			res.RequeueAfter = time.Millisecond
		}
	case !apiequality.Semantic.DeepEqual(before, &address):
		// Semantic DeepEqual counts nil and empty maps equal: a no-op reconcile writes nothing.
		if err := r.Client.Patch(ctx, &address, client.MergeFrom(before)); err != nil {
			return ctrl.Result{}, errors.Wrap(err, "failed to patch address")
		}
	}
	claim.Status.AddressRef = ipamv1.IPAddressReference{Name: address.Name}
	return res, nil
}

// reconcileDelete releases the address, then lets the IPAddress and the claim go.
func (r *Reconciler) reconcileDelete(ctx context.Context, h *Handler) (ctrl.Result, error) {
	claim := h.claim
	if res, err := h.report(ctx, h.release(ctx)); err != nil || !res.IsZero() {
		return res, err
	}
	address := &ipamv1.IPAddress{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(claim), address); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, errors.Wrap(err, "failed to fetch address")
	}
	if controllerutil.ContainsFinalizer(address, ipamutil.ProtectAddressFinalizer) {
		// This version adds none, but v0.1 did: it must not keep the IPAddress.
		p := client.MergeFrom(address.DeepCopy())
		controllerutil.RemoveFinalizer(address, ipamutil.ProtectAddressFinalizer)
		if err := r.Client.Patch(ctx, address, p); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, errors.Wrap(err, "failed to remove address finalizer")
		}
	}
	// Deleted by name, whatever the cache shows: a lagging cache may not show an IPAddress
	// that exists, and the claim would go without it.
	gone := &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Namespace: claim.Namespace, Name: claim.Name}}
	if err := r.Client.Delete(ctx, gone); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, errors.Wrap(err, "failed to delete address")
	}
	controllerutil.RemoveFinalizer(claim, ipamutil.ReleaseAddressFinalizer)
	return ctrl.Result{}, nil
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

// namespaceEnding reports whether the namespace is being deleted, as the cache shows it (one
// the cache does not show yet is not: reading it for the claim's identity fails, and retries).
func (r *Reconciler) namespaceEnding(ctx context.Context, name string) bool {
	ns := &corev1.Namespace{}
	return r.Client.Get(ctx, client.ObjectKey{Name: name}, ns) == nil && !ns.DeletionTimestamp.IsZero()
}
