package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	capicontroller "sigs.k8s.io/cluster-api/util/controller"
	"sigs.k8s.io/cluster-api/util/predicates"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// +kubebuilder:rbac:groups=ipam.vitistack.io,resources=vitistackippools/status;globalvitistackippools/status,verbs=get;update;patch

// PoolReconciler keeps a pool's status true: whether its secret resolves and the
// IPAM-API accepts its zone and family (Ready), and how many addresses are in use.
type PoolReconciler struct {
	// Adapter gives the secrets, clients and configuration the claims use, so the pool's
	// Ready condition checks exactly what its claims will meet.
	Adapter *ProviderAdapter
	// Kind is VitistackIPPool or GlobalVitistackIPPool.
	Kind string
	// Recorder emits events on pools.
	Recorder events.EventRecorder

	mu         sync.Mutex
	lastProbed map[types.NamespacedName]probe
	// controller is the controller Cluster API's builder made: it holds a pool's next
	// reconcile until the cache has seen the status this one wrote.
	controller capicontroller.Controller
}

type probe struct {
	uid        types.UID
	at         time.Time
	generation int64
	next       time.Duration // when the pool is checked again
}

func (r *PoolReconciler) newPool() ipamv1alpha1.Pool {
	if r.Kind == ipamv1alpha1.GlobalVitistackIPPoolKind {
		return &ipamv1alpha1.GlobalVitistackIPPool{}
	}
	return &ipamv1alpha1.VitistackIPPool{}
}

// SetupWithManager registers the reconciler for its kind.
func (r *PoolReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	r.lastProbed = map[types.NamespacedName]probe{}
	// Cluster API's builder: capi_reconcile_* metrics, and at most one reconcile of a pool
	// per second, which coalesces the status patches of a burst of claims.
	c, err := capicontroller.NewControllerManagedBy(mgr, ctrl.LoggerFrom(ctx)).
		Named(r.Kind).
		For(r.newPool()).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2}).
		WithEventFilter(predicates.ResourceNotPausedAndHasFilterLabel(mgr.GetScheme(), ctrl.LoggerFrom(ctx), r.Adapter.Config.WatchFilterValue)).
		Watches(&ipamv1.IPAddress{}, handler.EnqueueRequestsFromMapFunc(r.addressToPool),
			predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return true },
				DeleteFunc:  func(event.DeleteEvent) bool { return true },
				UpdateFunc:  func(event.UpdateEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
			}).
		Build(ctx, r)
	r.controller = c
	return err
}

func (r *PoolReconciler) addressToPool(_ context.Context, o client.Object) []reconcile.Request {
	ref := o.(*ipamv1.IPAddress).Spec.PoolRef
	if ref.APIGroup != ipamv1alpha1.GroupVersion.Group || ref.Kind != r.Kind {
		return nil
	}
	key := types.NamespacedName{Name: ref.Name}
	if r.Kind == ipamv1alpha1.VitistackIPPoolKind {
		key.Namespace = o.GetNamespace()
	}
	return []reconcile.Request{{NamespacedName: key}}
}

// Reconcile computes the pool's status.
func (r *PoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	pool := r.newPool()
	if err := r.Adapter.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if annotations.HasPaused(pool) {
		return ctrl.Result{}, nil
	}
	before := pool.DeepCopyObject().(ipamv1alpha1.Pool)
	defer func() {
		switch err := r.Adapter.Client.Status().Patch(ctx, pool, client.MergeFrom(before)); {
		case err == nil:
			r.controller.DeferNextReconcileUntilCacheUpToDate(pool,
				capicontroller.StructuredObject(ipamv1alpha1.GroupVersion, r.Kind), pool.GetResourceVersion())
		case !apierrors.IsNotFound(err):
			reterr = kerrors.NewAggregate([]error{reterr, errors.Wrap(err, "patching pool status")})
		}
	}()

	status := pool.PoolStatus()
	inUse, err := r.addressesInUse(ctx, pool)
	if err != nil {
		return ctrl.Result{}, err
	}
	status.AddressesInUse = ptr.To(inUse)
	if c := r.Adapter.subnetStatus(pool, inUse); c != nil {
		meta.SetStatusCondition(&status.Conditions, *c)
	} else {
		meta.RemoveStatusCondition(&status.Conditions, ipamv1alpha1.PoolExhaustedCondition)
	}

	if !pool.GetDeletionTimestamp().IsZero() {
		r.setReady(pool, metav1.ConditionFalse, ipamv1alpha1.PoolReadyDeletingReason, "the pool is being deleted")
		return ctrl.Result{}, nil
	}

	interval := r.Adapter.Config.PoolProbeInterval
	if interval <= 0 {
		interval = 5 * time.Minute
	}
	if last, ok := r.last(req.NamespacedName); ok && last.uid == pool.GetUID() && last.generation == pool.GetGeneration() &&
		time.Since(last.at) < last.next && meta.FindStatusCondition(status.Conditions, ipamv1alpha1.PoolReadyCondition) != nil {
		return ctrl.Result{RequeueAfter: last.next - time.Since(last.at)}, nil
	}

	reason, msg := r.probe(ctx, pool)
	next := interval
	if reason == ipamv1alpha1.PoolReadyReason {
		r.setReady(pool, metav1.ConditionTrue, reason, msg)
	} else {
		r.setReady(pool, metav1.ConditionFalse, reason, msg)
		// Check a broken pool again sooner; a fix to the pool itself triggers at once.
		next = min(interval, time.Minute)
	}
	r.remember(req.NamespacedName, pool, next)
	return ctrl.Result{RequeueAfter: next}, nil
}

// probe asks the IPAM-API whether it accepts the pool's zone, family and secret. A
// release of an address nobody can hold (from a documentation range) changes nothing:
// 404 means every check passed, 400 carries the reason.
func (r *PoolReconciler) probe(ctx context.Context, pool ipamv1alpha1.Pool) (reason, message string) {
	h := &ClaimHandler{ProviderAdapter: r.Adapter, pool: pool, claim: probeClaim(pool)}
	reg, err := h.desiredRegistration(ctx)
	if err != nil {
		return ipamv1alpha1.PoolReadyIPAMAPIUnreachableReason, err.Error()
	}
	ca, err := r.Adapter.Secrets.CABundle(ctx, reg.CABundle)
	if err != nil {
		return ipamv1alpha1.PoolReadyCABundleNotFoundReason, err.Error() + "; fix spec.caBundleRef"
	}
	api, err := r.Adapter.Clients.For(reg.Endpoint, ca)
	if err != nil {
		return ipamv1alpha1.PoolReadyIPAMAPIUnreachableReason, err.Error()
	}
	secret, err := r.Adapter.Secrets.Value(ctx, reg.Secret, true, false)
	if err != nil {
		var inv *errSecretInvalid
		if errors.As(err, &inv) {
			return ipamv1alpha1.PoolReadySecretInvalidReason, err.Error()
		}
		return ipamv1alpha1.PoolReadySecretNotFoundReason, err.Error() + ": create it (type Opaque) or fix spec.secretRef"
	}
	reg.Address = "192.0.2.1/32" // TEST-NET-1, in no zone
	if reg.Family == ipamapi.FamilyIPv6 {
		reg.Address = "2001:db8::1/128" // documentation range, in no zone
	}
	reg.Identity.ServiceName = "vitistack-ipam-pool-probe"
	_, err = api.Release(ctx, reg.request(secret))
	switch ipamapi.ClassOf(err) {
	case ipamapi.ClassNotHeld:
		return ipamv1alpha1.PoolReadyReason, fmt.Sprintf("the IPAM-API at %s accepts zone %s, family %s", reg.Endpoint, reg.Zone, reg.Family)
	case ipamapi.ClassValidation:
		return ipamv1alpha1.PoolReadyZoneRejectedReason, fmt.Sprintf("the IPAM-API at %s refuses zone %s, family %s: %v; fix spec.zone or spec.ipFamily",
			reg.Endpoint, reg.Zone, reg.Family, err)
	case "":
		if err == nil {
			// Not expected from a real server; the address is in no zone.
			return ipamv1alpha1.PoolReadyReason, fmt.Sprintf("the IPAM-API at %s accepts zone %s, family %s", reg.Endpoint, reg.Zone, reg.Family)
		}
		return ipamv1alpha1.PoolReadyIPAMAPIUnreachableReason, err.Error()
	default:
		return ipamv1alpha1.PoolReadyIPAMAPIUnreachableReason, fmt.Sprintf("%v; check the endpoint URL (spec.endpoint or --ipam-api-url)", err)
	}
}

// probeClaim stands in for a claim when the pool's registration is computed for a probe.
func probeClaim(pool ipamv1alpha1.Pool) *ipamv1.IPAddressClaim {
	ns := pool.GetNamespace()
	if ns == "" {
		ns = metav1.NamespaceSystem
	}
	return &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns}}
}

func (r *PoolReconciler) addressesInUse(ctx context.Context, pool ipamv1alpha1.Pool) (int32, error) {
	list := &ipamv1.IPAddressList{}
	opts := []client.ListOption{client.MatchingFields{AddressPoolRefIndex: PoolRefValue(r.Kind, pool.GetName())}}
	if pool.GetNamespace() != "" {
		opts = append(opts, client.InNamespace(pool.GetNamespace()))
	}
	if err := r.Adapter.Client.List(ctx, list, opts...); err != nil {
		return 0, errors.Wrap(err, "listing the pool's IPAddresses")
	}
	return int32(len(list.Items)), nil
}

func (r *PoolReconciler) setReady(pool ipamv1alpha1.Pool, status metav1.ConditionStatus, reason, msg string) {
	st := pool.PoolStatus()
	old := meta.FindStatusCondition(st.Conditions, ipamv1alpha1.PoolReadyCondition)
	if status == metav1.ConditionFalse && (old == nil || old.Reason != reason) && r.Recorder != nil {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, reason, actionProbe, "%s", msg)
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: ipamv1alpha1.PoolReadyCondition, Status: status, Reason: reason, Message: msg,
		ObservedGeneration: pool.GetGeneration(),
	})
	st.ObservedGeneration = pool.GetGeneration()
}

func (r *PoolReconciler) last(key types.NamespacedName) (probe, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.lastProbed[key]
	return p, ok
}

func (r *PoolReconciler) remember(key types.NamespacedName, pool client.Object, next time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastProbed[key] = probe{uid: pool.GetUID(), at: time.Now(), generation: pool.GetGeneration(), next: next}
}

func (r *PoolReconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.lastProbed, key)
}
