package controllers

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/ipamutil"
	ipampredicates "sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/predicates"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
)

// +kubebuilder:rbac:groups=ipam.vitistack.io,resources=vitistackippools;globalvitistackippools,verbs=get;list;watch
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims/finalizers,verbs=update
// +kubebuilder:rbac:groups=ipam.vitistack.io,resources=vitistackippools/finalizers;globalvitistackippools/finalizers,verbs=update
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddresses,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",resources=secrets;configmaps,verbs=get
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create;patch;update
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// The actions of the events the controllers record (events.k8s.io/v1 wants one): what
// the controller was doing when it happened.
const (
	actionAllocate = "Allocate"
	actionRotate   = "RotateSecret"
	actionRelease  = "Release"
	actionProbe    = "ProbeZone"
)

// ProviderAdapter plugs the Vitistack pools into ipamutil.ClaimReconciler.
type ProviderAdapter struct {
	// Client is the manager's (cached) client.
	Client client.Client
	// Recorder emits events on claims.
	Recorder events.EventRecorder
	// Secrets reads secrets and CA bundles and creates the default secret.
	Secrets *Secrets
	// Clients gives the IPAM-API client of an endpoint.
	Clients ClientFactory
	// Config is the manager's configuration.
	Config Config
	// Reader reads uncached (the kube-system Namespace).
	Reader client.Reader

	clusterIDOnce sync.Mutex
	kubeSystemUID string

	mu sync.Mutex
	// reserved maps a holder key to the claim that registers it in this process, so two
	// claims never use one identity even before the cache shows the other's record.
	reserved map[string][]reservation
	// answered holds, per claim, the attempt whose outcome this process has seen.
	answered map[types.UID]time.Time
	// wake re-queues a claim at a chosen time (ipamutil keeps no result on errors).
	wake chan event.GenericEvent
	// subnets is what this process knows about subnet-mode candidates.
	subnets subnetState
}

// wakeAt re-queues the claim at t, besides the back-off of the error it returns now.
func (a *ProviderAdapter) wakeAt(claim client.Object, t time.Time) {
	obj := claim.DeepCopyObject().(client.Object)
	time.AfterFunc(time.Until(t)+10*time.Millisecond, func() {
		select {
		case a.wake <- event.GenericEvent{Object: obj}:
		default: // full: the error's back-off re-queues it anyway
		}
	})
}

type reservation struct {
	uid     types.UID
	name    types.NamespacedName
	address string
}

// holdersConflict reports whether two registrations of one identity may not coexist:
// without an address the IPAM-API would answer both with the same one, and with the
// same address a release of one would free the other's. Different explicit addresses
// (a Service moving to a new address, make before break) may coexist.
func holdersConflict(a, b string) bool { return a == "" || b == "" || a == b }

// reserve claims key (with the claim's address, if any) for a claim. It fails, naming
// the other claim, when a claim that still exists holds a conflicting reservation.
func (a *ProviderAdapter) reserve(ctx context.Context, key, address string, claim client.Object) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.reserved == nil {
		a.reserved = map[string][]reservation{}
	}
	kept := a.reserved[key][:0]
	conflict := ""
	for _, other := range a.reserved[key] {
		if other.uid == claim.GetUID() {
			continue
		}
		c := &ipamv1.IPAddressClaim{}
		err := a.Client.Get(ctx, other.name, c)
		if err != nil && apierrors.IsNotFound(err) || err == nil && c.UID != other.uid {
			continue // gone: forget it
		}
		kept = append(kept, other)
		if holdersConflict(address, other.address) {
			conflict = other.name.String()
		}
	}
	if conflict == "" {
		kept = append(kept, reservation{uid: claim.GetUID(), name: client.ObjectKeyFromObject(claim), address: address})
	}
	a.reserved[key] = kept
	return conflict, conflict == ""
}

// unreserve forgets what this process knows about a claim.
func (a *ProviderAdapter) unreserve(key string, uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rest := slices.DeleteFunc(a.reserved[key], func(r reservation) bool { return r.uid == uid }); len(rest) > 0 {
		a.reserved[key] = rest
	} else {
		delete(a.reserved, key)
	}
	delete(a.answered, uid)
}

// sawAnswer records that the outcome of a claim's attempt is known.
func (a *ProviderAdapter) sawAnswer(uid types.UID, attempt time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.answered == nil {
		a.answered = map[types.UID]time.Time{}
	}
	a.answered[uid] = attempt
}

// mayStillBeInFlight reports until when an earlier attempt of the claim, whose outcome
// this process has not seen (it timed out, or another process or an earlier run of this
// one sent it), may still be carried out by the IPAM-API.
func (a *ProviderAdapter) mayStillBeInFlight(uid types.UID, attempt time.Time) (time.Time, bool) {
	if attempt.IsZero() {
		return time.Time{}, false
	}
	a.mu.Lock()
	seen, ok := a.answered[uid]
	a.mu.Unlock()
	if ok && seen.Equal(attempt) {
		return time.Time{}, false
	}
	until := attempt.Add(a.quarantine())
	return until, time.Now().Before(until)
}

// quarantine is how long a registration without an answer may still complete.
func (a *ProviderAdapter) quarantine() time.Duration {
	t := a.Config.RequestTimeout
	if t <= 0 {
		t = 10 * time.Second
	}
	return 2 * t
}

var _ ipamutil.ProviderAdapter = &ProviderAdapter{}

// reconciliationTimeout bounds one reconcile of a claim, as Cluster API's builder
// bounds the pool and Service reconciles.
const reconciliationTimeout = time.Minute

var poolKinds = []string{ipamv1alpha1.VitistackIPPoolKind, ipamv1alpha1.GlobalVitistackIPPoolKind}

// SetupWithManager implements ipamutil.ProviderAdapter: it adds this provider's
// claims, their IPAddresses and the pools to ipamutil's controller.
func (a *ProviderAdapter) SetupWithManager(_ context.Context, b *ctrl.Builder) error {
	var claimKinds, addressKinds []predicate.Predicate
	for _, kind := range poolKinds {
		gk := metav1.GroupKind{Group: ipamv1alpha1.GroupVersion.Group, Kind: kind}
		claimKinds = append(claimKinds, ipampredicates.ClaimReferencesPoolKind(gk))
		addressKinds = append(addressKinds, ipampredicates.AddressReferencesPoolKind(gk))
	}
	a.wake = make(chan event.GenericEvent, 1024)
	a.subnets.recheck = a.Config.SubnetRecheckInterval
	if a.subnets.recheck <= 0 {
		a.subnets.recheck = time.Minute
	}
	workers := a.Config.MaxConcurrentReconciles
	if workers < 1 {
		workers = 1
	}
	b.For(&ipamv1.IPAddressClaim{}, builder.WithPredicates(predicate.Or(claimKinds...), claimChanged())).
		WithOptions(controller.Options{
			// Different claims are different identities, which the IPAM-API allocates
			// safely in parallel; controller-runtime never reconciles one claim twice at once.
			MaxConcurrentReconciles: workers,
			// Back off up to 5 minutes, so waiting claims never hammer the IPAM-API.
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](250*time.Millisecond, 5*time.Minute),
			// A backstop for a reconcile that hangs: every IPAM-API call has its own,
			// shorter deadline, and a reconcile cut anywhere is finished by the next one.
			ReconciliationTimeout: reconciliationTimeout,
		}).
		Owns(&ipamv1.IPAddress{}, builder.WithPredicates(predicate.Or(addressKinds...))).
		WatchesRawSource(source.Channel(a.wake, &handler.EnqueueRequestForObject{})).
		// An address that goes frees room in its pool (subnet mode): waiting claims try again.
		Watches(&ipamv1.IPAddress{}, handler.EnqueueRequestsFromMapFunc(a.claimsWaitingOnAddress),
			builder.WithPredicates(predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return false },
				UpdateFunc:  func(event.UpdateEvent) bool { return false },
				DeleteFunc:  func(event.DeleteEvent) bool { return true },
				GenericFunc: func(event.GenericEvent) bool { return false },
			})).
		Watches(&ipamv1alpha1.VitistackIPPool{}, handler.EnqueueRequestsFromMapFunc(a.waitingClaims(ipamv1alpha1.VitistackIPPoolKind)),
			builder.WithPredicates(poolBecameUsable())).
		Watches(&ipamv1alpha1.GlobalVitistackIPPool{}, handler.EnqueueRequestsFromMapFunc(a.waitingClaims(ipamv1alpha1.GlobalVitistackIPPoolKind)),
			builder.WithPredicates(poolBecameUsable()))
	return nil
}

// ClaimHandlerFor implements ipamutil.ProviderAdapter.
func (a *ProviderAdapter) ClaimHandlerFor(_ client.Client, claim *ipamv1.IPAddressClaim) ipamutil.ClaimHandler {
	return &ClaimHandler{ProviderAdapter: a, claim: claim}
}

// waitingClaims maps a pool to its claims that have no address yet.
func (a *ProviderAdapter) waitingClaims(kind string) handler.MapFunc {
	return func(ctx context.Context, pool client.Object) []reconcile.Request {
		claims := &ipamv1.IPAddressClaimList{}
		opts := []client.ListOption{client.MatchingFields{ClaimPoolRefIndex: PoolRefValue(kind, pool.GetName())}}
		if pool.GetNamespace() != "" {
			opts = append(opts, client.InNamespace(pool.GetNamespace()))
		}
		if err := a.Client.List(ctx, claims, opts...); err != nil {
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

// claimChanged drops updates that change only a claim's status (its conditions, which
// this provider writes itself), so a failing claim is retried with back-off, not at once.
func claimChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			return o.GetGeneration() != n.GetGeneration() ||
				!maps.Equal(userAnnotations(o), userAnnotations(n)) ||
				!maps.Equal(o.GetLabels(), n.GetLabels()) ||
				!slices.Equal(o.GetFinalizers(), n.GetFinalizers()) ||
				!o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp())
		},
	}
}

// userAnnotations are a claim's annotations without the registration record, which
// the handler writes itself on every attempt.
func userAnnotations(o client.Object) map[string]string {
	m := maps.Clone(o.GetAnnotations())
	delete(m, ipamv1alpha1.RegistrationAnnotation)
	return m
}

// claimsWaitingOnAddress maps a deleted IPAddress to the waiting claims of its pool.
func (a *ProviderAdapter) claimsWaitingOnAddress(ctx context.Context, o client.Object) []reconcile.Request {
	addr, ok := o.(*ipamv1.IPAddress)
	if !ok || addr.Spec.PoolRef.APIGroup != ipamv1alpha1.GroupVersion.Group {
		return nil
	}
	pool := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: addr.Spec.PoolRef.Name}}
	if addr.Spec.PoolRef.Kind == ipamv1alpha1.VitistackIPPoolKind {
		pool.Namespace = addr.Namespace
	}
	return a.waitingClaims(addr.Spec.PoolRef.Kind)(ctx, pool)
}

// poolBecameUsable passes pool events after which waiting claims may succeed: a new
// pool, a changed spec, an unpause, or a Ready condition that turned True. Status-only
// changes such as the count of addresses in use do not pass, so a burst of allocations
// does not re-queue every waiting claim again and again.
func poolBecameUsable() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return true },
		UpdateFunc: func(e event.UpdateEvent) bool {
			if e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() {
				return true
			}
			if annotations.HasPaused(e.ObjectOld) && !annotations.HasPaused(e.ObjectNew) {
				return true
			}
			was, is := poolReady(e.ObjectOld), poolReady(e.ObjectNew)
			return !was && is
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return true },
	}
}

func poolReady(o client.Object) bool {
	p, ok := o.(ipamv1alpha1.Pool)
	return ok && meta.IsStatusConditionTrue(p.PoolStatus().Conditions, ipamv1alpha1.PoolReadyCondition)
}

// clusterID is the cluster_id when neither claim nor pool nor flag gives one: the UID
// of the kube-system Namespace, as the IPAM-operator used.
func (a *ProviderAdapter) clusterID(ctx context.Context) (string, error) {
	if a.Config.ClusterID != "" {
		return a.Config.ClusterID, nil
	}
	a.clusterIDOnce.Lock()
	defer a.clusterIDOnce.Unlock()
	if a.kubeSystemUID == "" {
		ns := &corev1.Namespace{}
		if err := a.Reader.Get(ctx, types.NamespacedName{Name: metav1.NamespaceSystem}, ns); err != nil {
			return "", errors.Wrap(err, "reading the kube-system Namespace for the cluster_id")
		}
		a.kubeSystemUID = string(ns.UID)
	}
	return a.kubeSystemUID, nil
}
