package service

import (
	"context"
	"maps"
	"slices"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	capicontroller "sigs.k8s.io/cluster-api/util/controller"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/lbservice"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=services/finalizers,verbs=update
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims,verbs=create;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=get;list;watch

// Reconciler gives Services of type LoadBalancer their addresses through
// IPAddressClaims, one per family, against the GlobalVitistackIPPool of the Service's
// zone and family, and hands them to MetalLB. It succeeds the IPAM-operator: the same
// annotations and the same IPAM-API identity, but no side effects in admission.
type Reconciler struct {
	// Client is the manager's (cached) client.
	Client client.Client
	// WatchFilterValue is put on the claims made, so that the claim controller serves them.
	WatchFilterValue string
	// Recorder emits events on Services.
	Recorder events.EventRecorder
	// LoadBalancerClass selects the Services served: empty means those without a class.
	LoadBalancerClass string
	// ExcludedNamespaces are never served.
	ExcludedNamespaces []string
	// DefaultZone is the zone of Services without the zone annotation.
	DefaultZone string

	// controller is the controller Cluster API's builder made: it holds a Service's
	// next reconcile until the cache has seen what this one wrote.
	controller capicontroller.Controller
}

var (
	serviceType = capicontroller.StructuredObject(corev1.SchemeGroupVersion, "Service")
	claimType   = capicontroller.StructuredObject(ipamv1.GroupVersion, "IPAddressClaim")
)

// wrote records a write made while reconciling svc, so that the Service's next
// reconcile waits for the cache to show it (Cluster API's stale-cache protection)
// instead of acting on, and conflicting with, an older copy.
func (r *Reconciler) wrote(svc *corev1.Service, typ capicontroller.GroupVersionKindType, written client.Object) {
	r.controller.DeferNextReconcileUntilCacheUpToDate(svc, typ, written.GetResourceVersion())
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	// Cluster API's builder: capi_reconcile_* metrics, and at most one reconcile of a
	// Service per second, so a burst of claim updates becomes one Service patch.
	c, err := capicontroller.NewControllerManagedBy(mgr, ctrl.LoggerFrom(ctx)).
		Named("service").
		For(&corev1.Service{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			svc, ok := o.(*corev1.Service)
			return ok && (svc.Spec.Type == corev1.ServiceTypeLoadBalancer || controllerutil.ContainsFinalizer(svc, ipamv1alpha1.ServiceFinalizer))
		}))).
		Owns(&ipamv1.IPAddressClaim{}).
		// A claim's status (addressRef, Ready) can reach this controller before its new
		// IPAddress reaches the cache (two watches): the IPAddress's arrival brings the
		// Service back, or it would wait with the claim taken for unbound.
		Watches(&ipamv1.IPAddress{}, handler.EnqueueRequestsFromMapFunc(r.serviceOfAddress),
			predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return true },
				UpdateFunc:  func(event.UpdateEvent) bool { return false },
				DeleteFunc:  func(event.DeleteEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
			}).
		Watches(&ipamv1alpha1.GlobalVitistackIPPool{}, handler.EnqueueRequestsFromMapFunc(r.servicesWaitingForAPool),
			predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return true },
				UpdateFunc:  func(e event.UpdateEvent) bool { return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() },
				DeleteFunc:  func(event.DeleteEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
			}).
		// MetalLB's refusal of what the provider handed it is an event, written apart
		// from its status update (either may come first): its arrival brings the
		// Service back, to relay it. The cache holds only MetalLB's AllocationFailed
		// events (manager.CacheOptions).
		Watches(&corev1.Event{}, handler.EnqueueRequestsFromMapFunc(serviceOfRefusal),
			predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return true },
				UpdateFunc:  func(event.UpdateEvent) bool { return true }, // a repeat (count, lastTimestamp)
				DeleteFunc:  func(event.DeleteEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
			}).
		Build(ctx, r)
	r.controller = c
	return err
}

// serviceOfAddress maps an IPAddress to the Service that controls the claim that
// controls it (none for other IPAddresses).
func (r *Reconciler) serviceOfAddress(ctx context.Context, o client.Object) []reconcile.Request {
	ref := metav1.GetControllerOf(o)
	if ref == nil || ref.Kind != "IPAddressClaim" || ref.APIVersion != ipamv1.GroupVersion.String() {
		return nil
	}
	claim := &ipamv1.IPAddressClaim{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: o.GetNamespace(), Name: ref.Name}, claim); err != nil {
		return nil
	}
	owner := metav1.GetControllerOf(claim)
	if owner == nil || owner.Kind != "Service" || owner.APIVersion != corev1.SchemeGroupVersion.String() {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: claim.Namespace, Name: owner.Name}}}
}

// servicesWaitingForAPool re-queues the served Services that may wait for a pool,
// when a pool appears or changes.
func (r *Reconciler) servicesWaitingForAPool(ctx context.Context, _ client.Object) []reconcile.Request {
	list := &corev1.ServiceList{}
	if err := r.Client.List(ctx, list); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if svc := &list.Items[i]; r.serves(svc) && r.waitsForAPool(ctx, svc) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(svc)})
		}
	}
	return reqs
}

// waitsForAPool reports whether a served Service may be waiting for a pool: a family it
// asks for has no claim yet (a Service taken over from the IPAM-operator has MetalLB's
// annotation before it has claims; a dual-stack one may have a claim for one family).
func (r *Reconciler) waitsForAPool(ctx context.Context, svc *corev1.Service) bool {
	spec, errs := lbservice.Parse(svc, r.DefaultZone)
	if len(errs) > 0 {
		return false // says so already; a pool changes nothing
	}
	claims, err := r.claimsOf(ctx, svc)
	if err != nil {
		return true
	}
	for _, fam := range spec.Families {
		if len(claims[fam]) == 0 {
			return true
		}
	}
	return false
}

// serves reports whether the Service controller serves svc.
func (r *Reconciler) serves(svc *corev1.Service) bool {
	return lbservice.Served(svc, r.LoadBalancerClass, r.ExcludedNamespaces)
}

// Reconcile brings a Service's claims and annotations in line with its annotations.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	svc := &corev1.Service{}
	if err := r.Client.Get(ctx, req.NamespacedName, svc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !svc.DeletionTimestamp.IsZero() || !r.serves(svc) {
		return ctrl.Result{}, r.reconcileDelete(ctx, svc)
	}

	// The finalizer and the IPAM-operator's defaults, in one patch of the Service, unless
	// the Service's annotations are bad (the webhook would refuse the patch anyway).
	before := svc.DeepCopy()
	controllerutil.AddFinalizer(svc, ipamv1alpha1.ServiceFinalizer)
	if err := r.defaultAnnotations(svc); err != nil {
		return ctrl.Result{}, err
	}
	spec, errs := lbservice.Parse(svc, r.DefaultZone)
	if len(errs) > 0 {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, ipamv1alpha1.ClaimReadyInvalidAnnotationReason, actionAllocate, "%s", errs.ToAggregate().Error())
		return ctrl.Result{}, nil // a change of the Service brings it back
	}
	if !equalMeta(before, svc) {
		if err := r.Client.Patch(ctx, svc, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, errors.Wrap(err, "adding the finalizer and default annotations to the Service")
		}
		r.wrote(svc, serviceType, svc)
	}
	r.checkAnnounced(svc, spec)
	if err := r.checkRefused(ctx, svc, spec); err != nil {
		return ctrl.Result{}, err
	}

	claims, err := r.claimsOf(ctx, svc)
	if err != nil {
		return ctrl.Result{}, err
	}
	published := map[ipamapi.Family]string{}
	for _, fam := range spec.Families {
		addr, err := r.reconcileFamily(ctx, svc, spec, fam, claims[fam])
		if err != nil {
			return ctrl.Result{}, err
		}
		if addr != "" {
			published[fam] = addr
		}
	}
	// Families no longer asked for lose their claims.
	for _, fam := range slices.Sorted(maps.Keys(claims)) { // in one order, run after run
		if cs := claims[fam]; !slices.Contains(spec.Families, fam) {
			if err := r.deleteClaims(ctx, cs); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	if err := r.publish(ctx, svc, spec, published); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// defaultAnnotations sets the IPAM-operator's defaults for missing annotations.
func (r *Reconciler) defaultAnnotations(svc *corev1.Service) error {
	key := ""
	if _, ok := svc.Annotations[ipamv1alpha1.AllowLocalSharedIPAnnotation]; !ok {
		var err error
		if key, err = registrar.RandomString(32); err != nil {
			return err
		}
	}
	if svc.Annotations == nil {
		svc.Annotations = map[string]string{}
	}
	for k, v := range lbservice.Defaults(r.DefaultZone, key) {
		if _, ok := svc.Annotations[k]; !ok {
			svc.Annotations[k] = v
		}
	}
	return nil
}

// reconcileDelete releases everything when the Service goes or stops being served:
// its claims are deleted (each releases its address), then the finalizer goes.
func (r *Reconciler) reconcileDelete(ctx context.Context, svc *corev1.Service) error {
	if !controllerutil.ContainsFinalizer(svc, ipamv1alpha1.ServiceFinalizer) {
		return nil
	}
	claims, err := r.claimsOf(ctx, svc)
	if err != nil {
		return err
	}
	remaining := 0
	for _, fam := range slices.Sorted(maps.Keys(claims)) {
		cs := claims[fam]
		remaining += len(cs)
		if err := r.deleteClaims(ctx, cs); err != nil {
			return err
		}
		for i := range cs {
			r.reportClaim(svc, &cs[i])
		}
	}
	if remaining > 0 {
		return nil // the claims' deletion brings the Service back
	}
	before := svc.DeepCopy()
	controllerutil.RemoveFinalizer(svc, ipamv1alpha1.ServiceFinalizer)
	if svc.DeletionTimestamp.IsZero() {
		// No longer served (type or class changed): MetalLB must not keep the addresses.
		delete(svc.Annotations, lbservice.MetalLBLoadBalancerIPsAnnotation)
		delete(svc.Annotations, lbservice.MetalLBAllowSharedIPAnnotation)
	}
	return errors.Wrap(client.IgnoreNotFound(r.Client.Patch(ctx, svc, client.MergeFrom(before))), "removing the Service's finalizer")
}

// claimsOf lists the Service's claims by family.
func (r *Reconciler) claimsOf(ctx context.Context, svc *corev1.Service) (map[ipamapi.Family][]ipamv1.IPAddressClaim, error) {
	list := &ipamv1.IPAddressClaimList{}
	if err := r.Client.List(ctx, list, client.InNamespace(svc.Namespace),
		client.MatchingLabels{ipamv1alpha1.ServiceNameLabel: svc.Name}); err != nil {
		return nil, errors.Wrap(err, "listing the Service's IPAddressClaims")
	}
	out := map[ipamapi.Family][]ipamv1.IPAddressClaim{}
	for _, c := range list.Items {
		if metav1.IsControlledBy(&c, svc) {
			fam := ipamapi.Family(c.Labels[ipamv1alpha1.IPFamilyLabel])
			out[fam] = append(out[fam], c)
		}
	}
	return out, nil
}

func (r *Reconciler) deleteClaims(ctx context.Context, claims []ipamv1.IPAddressClaim) error {
	for i := range claims {
		if !claims[i].DeletionTimestamp.IsZero() {
			continue
		}
		if err := r.Client.Delete(ctx, &claims[i]); client.IgnoreNotFound(err) != nil {
			return errors.Wrapf(err, "deleting IPAddressClaim %s", claims[i].Name)
		}
	}
	return nil
}

// reportClaim passes a claim's failure on to the Service, where users look.
func (r *Reconciler) reportClaim(svc *corev1.Service, claim *ipamv1.IPAddressClaim) {
	c := meta.FindStatusCondition(claim.Status.Conditions, ipamv1.IPAddressClaimReadyCondition)
	if c != nil && c.Status == metav1.ConditionFalse {
		r.Recorder.Eventf(svc, claim, corev1.EventTypeWarning, c.Reason, actionAllocate, "IPAddressClaim %s: %s", claim.Name, c.Message)
	}
}

// reportRotation passes a refused secret rotation on to the Service.
func (r *Reconciler) reportRotation(svc *corev1.Service, claim *ipamv1.IPAddressClaim) {
	c := meta.FindStatusCondition(claim.Status.Conditions, ipamv1alpha1.ClaimSecretRotatedCondition)
	if c != nil && c.Status == metav1.ConditionFalse {
		r.Recorder.Eventf(svc, claim, corev1.EventTypeWarning, c.Reason, actionRotate, "IPAddressClaim %s: %s", claim.Name, c.Message)
	}
}

// boundAddrs is the registered address of each bound claim of a Service, by UID.
type boundAddrs map[types.UID]string

// of is the claim's registered address, "" while it is not bound.
func (b boundAddrs) of(c *ipamv1.IPAddressClaim) string {
	if c == nil {
		return ""
	}
	return b[c.UID]
}

// boundAddresses reads each bound claim's address from the record on its IPAddress
// (the claim keeps only its pending record).
func (r *Reconciler) boundAddresses(ctx context.Context, claims []ipamv1.IPAddressClaim) (boundAddrs, error) {
	out := boundAddrs{}
	for i := range claims {
		c := &claims[i]
		if c.Status.AddressRef.Name == "" {
			continue
		}
		a := &ipamv1.IPAddress{}
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Status.AddressRef.Name}, a); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, errors.Wrap(err, "reading the IPAddress of the Service's claim")
		}
		if !metav1.IsControlledBy(a, c) {
			continue
		}
		if rec, err := record.OnAddress(a.Labels, a.Annotations); err == nil && rec != nil {
			out[c.UID] = rec.Address
		}
	}
	return out, nil
}

// requestedOf is the address a claim asked for.
func requestedOf(c *ipamv1.IPAddressClaim) string {
	if v := c.Annotations[ipamv1alpha1.AddressesAnnotation]; v != "" {
		if cidr, err := ipamapi.CanonicalCIDR(v); err == nil {
			return cidr
		}
	}
	return ""
}

func equalMeta(a, b *corev1.Service) bool {
	return maps.Equal(a.Annotations, b.Annotations) && slices.Equal(a.Finalizers, b.Finalizers)
}

func klogRef(o client.Object) string { return o.GetNamespace() + "/" + o.GetName() }
