package pool

import (
	"context"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	capicontroller "sigs.k8s.io/cluster-api/util/controller"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/cluster-api/util/predicates"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// +kubebuilder:rbac:groups=ipam.vitistack.io,resources=vitistackippools/status;globalvitistackippools/status,verbs=patch

// Reconciler keeps a pool's status true.
type Reconciler struct {
	// Registrar gives the secrets, clients and configuration the claims use, so the
	// pool's Ready condition checks exactly what its claims will meet.
	*registrar.Registrar
	// Kind is VitistackIPPool or GlobalVitistackIPPool.
	Kind string
	// Recorder emits events on pools.
	Recorder events.EventRecorder

	mu     sync.Mutex
	probed map[types.NamespacedName]probe
	// cache counts the pools' IPAddresses from its index (nil: with a List).
	cache cache.Cache
	// controller holds a pool's next reconcile until the cache has seen the status this
	// one wrote (Cluster API's stale-cache protection).
	controller capicontroller.Controller
}

// probe is the last readiness check of a pool.
type probe struct {
	uid        types.UID
	generation int64
	at         time.Time
	next       time.Duration
	result     check
	// subnetChecked: the pool's subnet was checked against its zone at this generation,
	// at subnetAt, and subnetOutside is what was found (nil: inside). A check registers
	// an address for a moment, so a subnet found inside is not checked again until the
	// pool changes, and one found outside every pool probe interval (the IPAM-API's
	// zones may grow).
	subnetChecked bool
	subnetAt      time.Time
	subnetOutside *check
}

func (r *Reconciler) newPool() ipamv1alpha1.Pool {
	if r.Kind == ipamv1alpha1.GlobalVitistackIPPoolKind {
		return &ipamv1alpha1.GlobalVitistackIPPool{}
	}
	return &ipamv1alpha1.VitistackIPPool{}
}

// SetupWithManager registers the reconciler for its kind.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	r.probed = map[types.NamespacedName]probe{}
	r.cache = mgr.GetCache()
	// An address that comes or goes changes the pool's count: the pool is reconciled a
	// second later, so a burst of claims costs about one status patch a second.
	addressCameOrWent := handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.coalesce(q, e.Object)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.coalesce(q, e.Object)
		},
	}
	// Cluster API's builder: capi_reconcile_* metrics, a reconcile timeout, and
	// stale-cache protection.
	c, err := capicontroller.NewControllerManagedBy(mgr, ctrl.LoggerFrom(ctx)).
		Named(r.Kind).
		For(r.newPool()).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2}).
		WithEventFilter(predicates.ResourceNotPausedAndHasFilterLabel(mgr.GetScheme(), ctrl.LoggerFrom(ctx), r.Config.WatchFilterValue)).
		Watches(&ipamv1.IPAddress{}, addressCameOrWent).
		// A claim that finds the subnet outside the zone (or stops doing so) changes Ready.
		Watches(&ipamv1.IPAddressClaim{}, handler.EnqueueRequestsFromMapFunc(r.claimToPool), predicate.Funcs{
			CreateFunc:  func(event.CreateEvent) bool { return false },
			DeleteFunc:  func(e event.DeleteEvent) bool { return outsideZone(e.Object) },
			UpdateFunc:  func(e event.UpdateEvent) bool { return outsideZone(e.ObjectOld) != outsideZone(e.ObjectNew) },
			GenericFunc: func(event.GenericEvent) bool { return false },
		}).
		Build(ctx, r)
	r.controller = c
	return err
}

func outsideZone(o client.Object) bool {
	c, ok := o.(*ipamv1.IPAddressClaim)
	if !ok {
		return false
	}
	cond := conditions.Get(c, ipamv1.IPAddressClaimReadyCondition)
	return cond != nil && cond.Reason == ipamv1alpha1.ClaimReadySubnetOutsideZoneReason
}

func (r *Reconciler) poolKey(ref ipamv1.IPPoolReference, namespace string) []reconcile.Request {
	if ref.APIGroup != ipamv1alpha1.GroupVersion.Group || ref.Kind != r.Kind {
		return nil
	}
	key := types.NamespacedName{Name: ref.Name}
	if r.Kind == ipamv1alpha1.VitistackIPPoolKind {
		key.Namespace = namespace
	}
	return []reconcile.Request{{NamespacedName: key}}
}

// statusDelay is how long a pool waits after an address of it came or went before its
// status is computed: the events of a burst fold into one reconcile (the queue keeps
// the earliest time of an item that is already waiting).
const statusDelay = time.Second

func (r *Reconciler) coalesce(q workqueue.TypedRateLimitingInterface[reconcile.Request], o client.Object) {
	a, ok := o.(*ipamv1.IPAddress)
	if !ok {
		return
	}
	for _, req := range r.poolKey(a.Spec.PoolRef, a.GetNamespace()) {
		q.AddAfter(req, statusDelay)
	}
}

func (r *Reconciler) claimToPool(_ context.Context, o client.Object) []reconcile.Request {
	return r.poolKey(o.(*ipamv1.IPAddressClaim).Spec.PoolRef, o.GetNamespace())
}

// Reconcile computes the pool's status and patches it when it changed.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	pool := r.newPool()
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if annotations.HasPaused(pool) {
		return ctrl.Result{}, nil
	}
	helper, err := patch.NewHelper(pool, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	facts, err := r.gather(ctx, pool)
	if err != nil {
		return ctrl.Result{}, err
	}
	wait, fail, err := r.finishSubnetProbe(ctx, pool)
	switch {
	case err != nil:
		return ctrl.Result{}, err
	case fail == nil && wait > 0:
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	var p probe
	if fail != nil {
		// Shown on the pool and tried again in a minute, not after the controller's back-off
		// (up to 1,000 s). The pool is not checked meanwhile: its subnet check would
		// register under the same identity.
		p = probe{at: r.Config.Ticks().Now(), next: time.Minute, result: *fail}
	} else {
		p = r.readiness(ctx, req.NamespacedName, pool)
	}
	r.compute(pool, facts, p.result)
	if err := helper.Patch(ctx, pool, patch.WithOwnedConditions{Conditions: []string{ipamv1alpha1.PoolReadyCondition, ipamv1alpha1.PoolExhaustedCondition}}); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if pool.GetResourceVersion() != "" {
		r.controller.DeferNextReconcileUntilCacheUpToDate(pool, capicontroller.StructuredObject(ipamv1alpha1.GroupVersion, r.Kind), pool.GetResourceVersion())
	}
	if !pool.GetDeletionTimestamp().IsZero() && fail == nil {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{RequeueAfter: max(p.next-r.Config.Ticks().Since(p.at), time.Second)}, nil
}

// subnetCheckSoon is when a subnet check put off for its CA bundle's or Secret's
// protection (a moment after the pool appears) is tried again.
const subnetCheckSoon = 2 * time.Second

// readiness returns the pool's last readiness check, checking again when the pool
// changed or the last check is due.
func (r *Reconciler) readiness(ctx context.Context, key types.NamespacedName, pool ipamv1alpha1.Pool) probe {
	r.mu.Lock()
	last, ok := r.probed[key]
	r.mu.Unlock()
	if ok && last.uid == pool.GetUID() && last.generation == pool.GetGeneration() && r.Config.Ticks().Since(last.at) < last.next {
		return last
	}
	interval := r.Config.PoolProbeInterval
	if interval <= 0 {
		interval = 5 * time.Minute
	}
	res, t := r.check(ctx, pool)
	checked, soon, at, outside := false, false, time.Time{}, (*check)(nil)
	if ok && last.uid == pool.GetUID() && last.generation == pool.GetGeneration() &&
		(last.subnetOutside == nil || r.Config.Ticks().Since(last.subnetAt) < interval) {
		checked, at, outside = last.subnetChecked, last.subnetAt, last.subnetOutside
	}
	if res.reason == ipamv1alpha1.PoolReadyReason && pool.PoolSpec().Subnet != "" {
		// Ready at this generation already: checked by this process or an earlier one (a
		// restart checks nothing again).
		checked = checked || (pool.PoolStatus().ObservedGeneration == pool.GetGeneration() &&
			meta.IsStatusConditionTrue(pool.PoolStatus().Conditions, ipamv1alpha1.PoolReadyCondition))
		if !checked {
			outside, checked, soon = r.checkSubnet(ctx, pool, t)
			at = r.Config.Ticks().Now()
		}
		if outside != nil {
			res = *outside
		}
	}
	next := interval
	switch {
	case soon:
		next = min(interval, subnetCheckSoon) // the subnet check waits for a protection, a moment away
	case res.reason != ipamv1alpha1.PoolReadyReason:
		next = min(interval, time.Minute) // a broken pool is checked again sooner; a fix to the pool triggers at once
	}
	p := probe{uid: pool.GetUID(), generation: pool.GetGeneration(), at: r.Config.Ticks().Now(), next: next, result: res, subnetChecked: checked, subnetAt: at, subnetOutside: outside}
	r.mu.Lock()
	r.probed[key] = p
	r.mu.Unlock()
	return p
}

func (r *Reconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.probed, key)
}
