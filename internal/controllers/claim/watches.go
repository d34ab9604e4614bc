package claim

import (
	"context"
	"github.com/go-logr/logr"
	"github.com/pkg/errors"
	"k8s.io/klog/v2"
	"maps"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/ipamutil"
	ipampredicates "sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/predicates"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// +kubebuilder:rbac:groups=ipam.vitistack.io,resources=vitistackippools;globalvitistackippools,verbs=get;list;watch
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims/status,verbs=patch
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims/finalizers,verbs=update
// +kubebuilder:rbac:groups=ipam.vitistack.io,resources=vitistackippools/finalizers;globalvitistackippools/finalizers,verbs=update
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddresses,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets;configmaps,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconciler reconciles the IPAddressClaims of this provider's pools; it holds what the
// claims of one process share.
type Reconciler struct {
	*registrar.Registrar
	// Recorder emits events on claims.
	Recorder events.EventRecorder

	// subnets is what this process knows about subnet-mode candidates.
	subnets subnetState
	// refusals is, by claim (types.NamespacedName), the digest of the inputs of the claim's
	// last refusal (see inputs; a string), held in this process only: it never leaves it
	// (the Secret's value is among the inputs), and costs no write. Dropped when a request
	// of the claim goes out, or the claim is gone.
	refusals sync.Map
	// log is the manager's logger (logFor).
	log logr.Logger
	// waits is, by reconcile.Request, how long the wait a claim's last reconcile ended in
	// lasts (a time.Duration), for the rate limiter (waitLimiter).
	waits sync.Map
	// released is the claims (by UID) this process released: until the cache shows one
	// gone, a reconcile of it sends nothing again.
	releasedHere sync.Map
}

// The back-off of a claim that fails: 250 ms, doubling up to backoffMax.
const (
	backoffBase = 250 * time.Millisecond
	// backoffMax: failing claims do not hammer the IPAM-API (1,000 failing claims send
	// at most about 17 requests a second), and after an outage, or a stretch of failed
	// answers, every claim goes on within a minute.
	backoffMax = time.Minute
)

// reconciliationTimeout bounds one reconcile of a claim, as Cluster API's builder
// bounds the pool and Service reconciles.
const reconciliationTimeout = time.Minute

var poolKinds = []string{ipamv1alpha1.VitistackIPPoolKind, ipamv1alpha1.GlobalVitistackIPPoolKind}

// SetupWithManager sets up ipamutil's claim controller with this provider as its adapter.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	r.subnets.recheck, r.subnets.clock = r.Config.SubnetRecheckInterval, r.Config.Ticks()
	r.log = mgr.GetLogger()
	return r.loop().SetupWithManager(ctx, mgr)
}

// SetupWithManager adds this provider's part to ipamutil's claim controller, which filters
// paused objects and brings back the claims of a Cluster that is unpaused: this provider's
// claims, their IPAddresses, the pools, and the claims the Secret protector wakes; the
// workers, the back-off and the logs.
func (a adapter) SetupWithManager(_ context.Context, b *ctrl.Builder) error {
	r := a.Reconciler
	var claimKinds, addressKinds []predicate.Predicate
	for _, kind := range poolKinds {
		gk := metav1.GroupKind{Group: ipamv1alpha1.GroupVersion.Group, Kind: kind}
		claimKinds = append(claimKinds, ipampredicates.ClaimReferencesPoolKind(gk))
		addressKinds = append(addressKinds, ipampredicates.AddressReferencesPoolKind(gk))
	}
	workers := max(r.Config.MaxConcurrentReconciles, 1)
	notCreated := predicate.Funcs{CreateFunc: func(event.CreateEvent) bool { return false }}
	addressCameOrWent := predicate.Funcs{ // a nil func passes
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	b.For(&ipamv1.IPAddressClaim{}, builder.WithPredicates(predicate.Or(claimKinds...), claimChanged())).
		WithOptions(controller.Options{
			// Different claims are different identities, which the IPAM-API allocates
			// safely in parallel; controller-runtime never reconciles one claim twice at once.
			MaxConcurrentReconciles: workers,
			RateLimiter: waitLimiter{
				TypedRateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](backoffBase, backoffMax),
				waits:            &r.waits,
			},
			// A backstop for a reconcile that hangs: every IPAM-API call has its own,
			// shorter deadline, and a reconcile cut anywhere is finished by the next one.
			ReconciliationTimeout: reconciliationTimeout,
			LogConstructor:        r.logFor,
		}).
		// A claim's IPAddress that changes or goes brings the claim back, to restore it. One
		// that is created does not: the loop made it, in the reconcile that then bound the
		// claim (and a manager that starts reconciles every claim anyway), so a second
		// reconcile would only find the claim bound.
		Owns(&ipamv1.IPAddress{}, builder.WithPredicates(predicate.Or(addressKinds...), notCreated)).
		// The claims the Secret protector wakes: it found their Secret's value changed,
		// or back as it was.
		WatchesRawSource(r.Wake.Source()).
		// Which addresses the subnet-mode pools use, for picking candidates; an IPAddress in
		// the cache ends its claim's reservations, a claim gone from it its memory here.
		Watches(&ipamv1.IPAddress{}, r.subnets.occupancy(r.cached)).
		Watches(&ipamv1.IPAddressClaim{}, r.subnets.occupancy(r.cached)).
		// An address that comes or goes changes who shares it: the sharers' status follows.
		Watches(&ipamv1.IPAddress{}, handler.EnqueueRequestsFromMapFunc(r.sharers), builder.WithPredicates(addressCameOrWent)).
		Watches(&ipamv1alpha1.VitistackIPPool{}, handler.EnqueueRequestsFromMapFunc(r.claimsOfPool(ipamv1alpha1.VitistackIPPoolKind)),
			builder.WithPredicates(poolBecameUsable())).
		Watches(&ipamv1alpha1.GlobalVitistackIPPool{}, handler.EnqueueRequestsFromMapFunc(r.claimsOfPool(ipamv1alpha1.GlobalVitistackIPPoolKind)),
			builder.WithPredicates(poolBecameUsable())).
		// A subnet-mode pool whose count of addresses in use fell has room again, and so
		// may the other pools of its zone: their claims that found none go on.
		Watches(&ipamv1alpha1.VitistackIPPool{}, handler.EnqueueRequestsFromMapFunc(r.claimsWaitingForRoom), builder.WithPredicates(roomFreed())).
		Watches(&ipamv1alpha1.GlobalVitistackIPPool{}, handler.EnqueueRequestsFromMapFunc(r.claimsWaitingForRoom), builder.WithPredicates(roomFreed()))
	return nil
}

// cached is told of each IPAddress and claim the cache shows or no longer shows: an
// IPAddress in it ends its claim's reservations (other claims see it now), and a claim gone
// from it ends what this process remembers of it.
func (r *Reconciler) cached(o client.Object, gone bool) {
	switch o.(type) {
	case *ipamv1.IPAddress:
		if owner := metav1.GetControllerOf(o); owner != nil && !gone {
			r.InFlight.Forget(owner.UID)
		}
	case *ipamv1.IPAddressClaim:
		if gone {
			r.releasedHere.Delete(o.GetUID())
			r.refusals.Delete(client.ObjectKeyFromObject(o))
			r.waits.Delete(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o)})
		}
	}
}

// waitLimiter is the claim controller's rate limiter: a claim whose reconcile ended in a
// known wait (waiting) comes back when the wait ends, and its back-off starts over; any
// other failure backs off.
type waitLimiter struct {
	workqueue.TypedRateLimiter[reconcile.Request]
	waits *sync.Map
}

func (l waitLimiter) When(req reconcile.Request) time.Duration {
	if d, ok := l.waits.LoadAndDelete(req); ok {
		l.Forget(req)
		return d.(time.Duration)
	}
	return l.TypedRateLimiter.When(req)
}

// logFor is the claim controller's logger for a request: controller-runtime's, whose
// "Reconciler error" for a known wait (waiting) is the V(1) line "Waiting" instead.
func (r *Reconciler) logFor(req *reconcile.Request) logr.Logger {
	log := r.log.WithValues("controller", "ipaddressclaim", "controllerGroup", ipamv1.GroupVersion.Group, "controllerKind", "IPAddressClaim")
	if req != nil {
		log = log.WithValues("IPAddressClaim", klog.KRef(req.Namespace, req.Name), "namespace", req.Namespace, "name", req.Name)
	}
	if log.GetSink() == nil {
		return log
	}
	return log.WithSink(quietWaits{log.GetSink()})
}

// quietWaits logs a known wait that ends a reconcile as the wait it is.
type quietWaits struct{ logr.LogSink }

func (s quietWaits) Error(err error, msg string, kv ...any) {
	var w *waiting
	if !errors.As(err, &w) {
		s.LogSink.Error(err, msg, kv...)
		return
	}
	if s.Enabled(1) {
		s.Info(1, "Waiting", append(kv, "reason", w.Error())...)
	}
}

func (s quietWaits) WithValues(kv ...any) logr.LogSink {
	return quietWaits{s.LogSink.WithValues(kv...)}
}
func (s quietWaits) WithName(name string) logr.LogSink { return quietWaits{s.LogSink.WithName(name)} }

// claimsWaitingForRoom maps a subnet-mode pool to the live, unbound claims that found
// no room in the subnet-mode pools of its zone (the index holds no others).
func (r *Reconciler) claimsWaitingForRoom(ctx context.Context, o client.Object) []reconcile.Request {
	pool, ok := o.(ipamv1alpha1.Pool)
	if !ok {
		return nil
	}
	zone := pool.PoolSpec().Zone
	pools, err := index.ListPools(ctx, r.Client, client.UnsafeDisableDeepCopy)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing the pools of a zone failed")
		return nil
	}
	var reqs []reconcile.Request
	for _, p := range pools {
		if p.PoolSpec().Subnet == "" || p.PoolSpec().Zone != zone {
			continue
		}
		kind := ipamv1alpha1.VitistackIPPoolKind
		if p.GetNamespace() == "" {
			kind = ipamv1alpha1.GlobalVitistackIPPoolKind
		}
		claims := &ipamv1.IPAddressClaimList{}
		if err := r.Client.List(ctx, claims, client.MatchingFields{index.ClaimWaiting: index.PoolRefValue(kind, p.GetName())}, client.UnsafeDisableDeepCopy); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Listing the claims waiting for room failed")
			return nil
		}
		for _, c := range claims.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&c)})
		}
	}
	return reqs
}

// roomFreed passes the updates of a subnet-mode pool whose status counts fewer
// addresses in use than before (the pool controller writes the count about once a
// second, whatever the burst).
func roomFreed() predicate.Predicate {
	inUse := func(o client.Object) int32 {
		p, ok := o.(ipamv1alpha1.Pool)
		if !ok || p.PoolStatus().AddressesInUse == nil {
			return 0
		}
		return *p.PoolStatus().AddressesInUse
	}
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			p, ok := e.ObjectNew.(ipamv1alpha1.Pool)
			return ok && p.PoolSpec().Subnet != "" && inUse(e.ObjectNew) < inUse(e.ObjectOld)
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// claimsOfPool maps a pool to its claims that have no address yet, and to its deleting
// claims (an unpaused pool lets them be released).
func (r *Reconciler) claimsOfPool(kind string) handler.MapFunc {
	return func(ctx context.Context, pool client.Object) []reconcile.Request {
		claims := &ipamv1.IPAddressClaimList{}
		opts := []client.ListOption{client.MatchingFields{index.ClaimPoolRef: index.PoolRefValue(kind, pool.GetName())}}
		if pool.GetNamespace() != "" {
			opts = append(opts, client.InNamespace(pool.GetNamespace()))
		}
		if err := r.Client.List(ctx, claims, opts...); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Listing the claims of a pool failed")
			return nil
		}
		var reqs []reconcile.Request
		for _, c := range claims.Items {
			if c.Status.AddressRef.Name == "" || !c.DeletionTimestamp.IsZero() {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&c)})
			}
		}
		return reqs
	}
}

// sharers maps an IPAddress that came or went to the claims of all IPAddresses with the
// same address in the same zone, when there are others: their AddressShared condition
// changes.
func (r *Reconciler) sharers(ctx context.Context, o client.Object) []reconcile.Request {
	rec, err := record.OnAddress(o.GetLabels(), o.GetAnnotations())
	if err != nil || rec == nil {
		return nil
	}
	list := &ipamv1.IPAddressList{}
	if err := index.ListByHost(ctx, r.Client, list, rec.HostKey()); err != nil {
		return nil
	}
	if len(list.Items) == 0 || len(list.Items) == 1 && list.Items[0].UID == o.GetUID() {
		return nil // no one else: nothing is shared
	}
	// The others, and (for an IPAddress that came) the address's own claim: the reconcile
	// that created it did not see it shared yet.
	reqs := []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(o)}}
	for _, other := range list.Items {
		if other.UID != o.GetUID() {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&other)}) // an IPAddress has its claim's name
		}
	}
	return reqs
}

// claimChanged drops updates that change only a claim's status (its conditions, which
// this provider writes itself), the provider's own annotations, or finalizers other than
// the release finalizer coming or going, so a failing claim is retried with back-off, not
// at once. ipamutil's loop adds the release finalizer and ends the reconcile: the update
// brings the claim back; so does the addressRef it writes once it created the IPAddress
// (the claim is Ready from then on).
func claimChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			return o.GetGeneration() != n.GetGeneration() ||
				addressRef(o) == "" && addressRef(n) != "" ||
				!maps.Equal(userAnnotations(o), userAnnotations(n)) ||
				!maps.Equal(o.GetLabels(), n.GetLabels()) ||
				controllerutil.ContainsFinalizer(o, ipamutil.ReleaseAddressFinalizer) != controllerutil.ContainsFinalizer(n, ipamutil.ReleaseAddressFinalizer) ||
				!o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp())
		},
	}
}

// addressRef is the name of the IPAddress a claim names as its own ("": none, or not a claim).
func addressRef(o client.Object) string {
	if c, ok := o.(*ipamv1.IPAddressClaim); ok {
		return c.Status.AddressRef.Name
	}
	return ""
}

// userAnnotations are a claim's annotations without those the provider writes itself.
func userAnnotations(o client.Object) map[string]string {
	m := maps.Clone(o.GetAnnotations())
	delete(m, ipamv1alpha1.RegistrationAnnotation)
	return m
}

// poolBecameUsable passes pool events after which waiting claims may succeed: a new
// pool, a changed spec, an unpause, or a Ready condition that turned True. Status-only
// changes such as the count of addresses in use do not pass, so a burst of allocations
// does not re-queue every waiting claim again and again.
func poolBecameUsable() predicate.Predicate {
	return predicate.Funcs{ // a nil func passes
		UpdateFunc: func(e event.UpdateEvent) bool {
			if e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() {
				return true
			}
			if annotations.HasPaused(e.ObjectOld) && !annotations.HasPaused(e.ObjectNew) {
				return true
			}
			return !poolReady(e.ObjectOld) && poolReady(e.ObjectNew)
		},
		DeleteFunc: func(event.DeleteEvent) bool { return false },
	}
}

func poolReady(o client.Object) bool {
	p, ok := o.(ipamv1alpha1.Pool)
	return ok && meta.IsStatusConditionTrue(p.PoolStatus().Conditions, ipamv1alpha1.PoolReadyCondition)
}
