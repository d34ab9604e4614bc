package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
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
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=services/finalizers,verbs=update
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims,verbs=create;delete

// ServiceReconciler gives Services of type LoadBalancer their addresses through
// IPAddressClaims, one per family, against the GlobalVitistackIPPool of the Service's
// zone and family, and hands them to MetalLB. It succeeds the IPAM-operator: the same
// annotations and the same IPAM-API identity, but no side effects in admission.
type ServiceReconciler struct {
	// Adapter gives the manager's client and configuration.
	Adapter *ProviderAdapter
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
func (r *ServiceReconciler) wrote(svc *corev1.Service, typ capicontroller.GroupVersionKindType, written client.Object) {
	r.controller.DeferNextReconcileUntilCacheUpToDate(svc, typ, written.GetResourceVersion())
}

// SetupWithManager registers the controller.
func (r *ServiceReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	// Cluster API's builder: capi_reconcile_* metrics, and at most one reconcile of a
	// Service per second, so a burst of claim updates becomes one Service patch.
	c, err := capicontroller.NewControllerManagedBy(mgr, ctrl.LoggerFrom(ctx)).
		Named("service").
		For(&corev1.Service{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			svc, ok := o.(*corev1.Service)
			return ok && (svc.Spec.Type == corev1.ServiceTypeLoadBalancer || controllerutil.ContainsFinalizer(svc, ipamv1alpha1.ServiceFinalizer))
		}))).
		Owns(&ipamv1.IPAddressClaim{}).
		Watches(&ipamv1alpha1.GlobalVitistackIPPool{}, handler.EnqueueRequestsFromMapFunc(r.servicesWithoutAddresses),
			predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return true },
				UpdateFunc:  func(e event.UpdateEvent) bool { return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() },
				DeleteFunc:  func(event.DeleteEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
			}).
		Build(ctx, r)
	r.controller = c
	return err
}

// servicesWithoutAddresses re-queues the served Services that lack an address, when a
// pool appears or changes.
func (r *ServiceReconciler) servicesWithoutAddresses(ctx context.Context, _ client.Object) []reconcile.Request {
	list := &corev1.ServiceList{}
	if err := r.Adapter.Client.List(ctx, list); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		svc := &list.Items[i]
		if r.serves(svc) && svc.Annotations[lbservice.MetalLBLoadBalancerIPsAnnotation] == "" {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(svc)})
		}
	}
	return reqs
}

// serves reports whether the Service controller serves svc.
func (r *ServiceReconciler) serves(svc *corev1.Service) bool {
	return lbservice.Served(svc, r.LoadBalancerClass, r.ExcludedNamespaces)
}

// Reconcile brings a Service's claims and annotations in line with its annotations.
func (r *ServiceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	svc := &corev1.Service{}
	if err := r.Adapter.Client.Get(ctx, req.NamespacedName, svc); err != nil {
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
		if err := r.Adapter.Client.Patch(ctx, svc, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, errors.Wrap(err, "adding the finalizer and default annotations to the Service")
		}
		r.wrote(svc, serviceType, svc)
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
	for fam, cs := range claims {
		if !slices.Contains(spec.Families, fam) {
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
func (r *ServiceReconciler) defaultAnnotations(svc *corev1.Service) error {
	key := ""
	if _, ok := svc.Annotations[ipamv1alpha1.AllowLocalSharedIPAnnotation]; !ok {
		var err error
		if key, err = RandomString(32); err != nil {
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

// reconcileFamily keeps one bound claim for a family, making a new claim before
// breaking the old one when the requested address, the zone or the pool changes. It
// returns the address to publish for the family; spec.Addresses[fam] is cleared when it
// names the address of a claim that no longer fits (an address of the old zone).
func (r *ServiceReconciler) reconcileFamily(ctx context.Context, svc *corev1.Service, spec *lbservice.Spec, fam ipamapi.Family,
	claims []ipamv1.IPAddressClaim) (string, error) {
	want := spec.Addresses[fam]
	var current, bound *ipamv1.IPAddressClaim
	for i := range claims {
		c := &claims[i]
		if !c.DeletionTimestamp.IsZero() {
			continue
		}
		addr := boundAddressOf(c)
		if addr != "" && (bound == nil || c.CreationTimestamp.Before(&bound.CreationTimestamp)) {
			bound = c
		}
		fits, err := r.claimFits(ctx, c, spec)
		if err != nil {
			return "", err
		}
		if !fits {
			if want != "" && (addr == want || requestedOf(c) == want) {
				want = "" // the address of the old zone or pool: ask for a new one
				delete(spec.Addresses, fam)
			}
			continue
		}
		switch {
		case want == "" && (current == nil || addr != "" && boundAddressOf(current) == ""):
			current = c
		case want != "" && (addr == want || requestedOf(c) == want):
			current = c
		}
	}

	if current == nil {
		pool, err := r.poolFor(ctx, svc, spec, fam)
		if err != nil || pool == "" {
			return boundAddressOf(bound), err
		}
		c, err := r.createClaim(ctx, svc, spec, fam, want, pool, claims)
		if err != nil {
			return boundAddressOf(bound), err
		}
		current = c
	} else if err := r.updateClaim(ctx, current, spec); err != nil {
		return "", err
	}

	if boundAddressOf(current) == "" {
		r.reportClaim(svc, current)
		// Make before break: the old address stays published until the new one is bound.
		return boundAddressOf(bound), nil
	}
	var stale []ipamv1.IPAddressClaim
	for _, c := range claims {
		if c.UID != current.UID && c.DeletionTimestamp.IsZero() {
			stale = append(stale, c)
		}
	}
	if err := r.deleteClaims(ctx, stale); err != nil {
		return "", err
	}
	r.reportRotation(svc, current)
	return boundAddressOf(current), nil
}

// claimFits reports whether a claim's pool still serves the Service's zone and the
// pools the Service names.
func (r *ServiceReconciler) claimFits(ctx context.Context, c *ipamv1.IPAddressClaim, spec *lbservice.Spec) (bool, error) {
	name := c.Spec.PoolRef.Name
	if len(spec.Pools) > 0 && !slices.Contains(spec.Pools, name) {
		return false, nil
	}
	pool := &ipamv1alpha1.GlobalVitistackIPPool{}
	if err := r.Adapter.Client.Get(ctx, client.ObjectKey{Name: name}, pool); err != nil {
		if apierrors.IsNotFound(err) {
			return boundAddressOf(c) != "", nil // a bound claim keeps working without its pool
		}
		return false, errors.Wrap(err, "reading the claim's GlobalVitistackIPPool")
	}
	return pool.Spec.Zone == spec.Zone, nil
}

// poolFor picks the GlobalVitistackIPPool for a family: one named by the pool
// annotation, else the one with the Service's zone and family (the first by name if
// several).
func (r *ServiceReconciler) poolFor(ctx context.Context, svc *corev1.Service, spec *lbservice.Spec, fam ipamapi.Family) (string, error) {
	pools := &ipamv1alpha1.GlobalVitistackIPPoolList{}
	if err := r.Adapter.Client.List(ctx, pools); err != nil {
		return "", errors.Wrap(err, "listing GlobalVitistackIPPools")
	}
	var names []string
	for _, p := range pools.Items {
		if p.Spec.Zone != spec.Zone || apiFamily(p.Spec.IPFamily) != fam || !p.DeletionTimestamp.IsZero() {
			continue
		}
		if len(spec.Pools) == 0 || slices.Contains(spec.Pools, p.Name) {
			names = append(names, p.Name)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		msg := fmt.Sprintf("no GlobalVitistackIPPool for zone %s and family %s: create one with spec.zone %s and spec.ipFamily %s",
			spec.Zone, fam, spec.Zone, familyKind(fam))
		if len(spec.Pools) > 0 {
			msg = fmt.Sprintf("none of the pools in %s (%s) serves zone %s and family %s", ipamv1alpha1.PoolAnnotation,
				strings.Join(spec.Pools, ", "), spec.Zone, fam)
		}
		r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, "NoPool", actionAllocate, "%s", msg)
		return "", nil
	}
	return names[0], nil
}

func familyKind(f ipamapi.Family) string {
	if f == ipamapi.FamilyIPv6 {
		return string(ipamv1alpha1.IPv6)
	}
	return string(ipamv1alpha1.IPv4)
}

// claimAnnotations are what a Service's claim carries from the Service.
func claimAnnotations(serviceName string, spec *lbservice.Spec) map[string]string {
	return map[string]string{
		ipamv1alpha1.ServiceNameAnnotation:         serviceName,
		ipamv1alpha1.SecretAnnotation:              spec.Secret,
		ipamv1alpha1.RetentionPeriodDaysAnnotation: strconv.Itoa(spec.RetentionPeriodDays),
		ipamv1alpha1.DenyExternalCleanupAnnotation: strconv.FormatBool(spec.DenyExternalCleanup),
	}
}

func (r *ServiceReconciler) createClaim(ctx context.Context, svc *corev1.Service, spec *lbservice.Spec, fam ipamapi.Family,
	want, pool string, existing []ipamv1.IPAddressClaim) (*ipamv1.IPAddressClaim, error) {
	// The first claim of a family is <service>-<family>; one made to move the Service
	// (another address, zone or pool) gets a suffix from what it asks for.
	name := svc.Name + "-" + string(fam)
	if want != "" || slices.ContainsFunc(existing, func(c ipamv1.IPAddressClaim) bool { return c.Name == name }) {
		sum := sha256.Sum256([]byte(pool + "|" + want))
		name += "-" + hex.EncodeToString(sum[:4])
	}
	ann := claimAnnotations(svc.Name, spec)
	if want != "" {
		ann[ipamv1alpha1.AddressesAnnotation] = want
	}
	claim := &ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   svc.Namespace,
			Name:        name,
			Labels:      map[string]string{ipamv1alpha1.ServiceNameLabel: svc.Name, ipamv1alpha1.IPFamilyLabel: string(fam)},
			Annotations: ann,
		},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{
			APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: ipamv1alpha1.GlobalVitistackIPPoolKind, Name: pool,
		}},
	}
	if f := r.Adapter.Config.WatchFilterValue; f != "" {
		claim.Labels[clusterv1.WatchLabel] = f // or ipamutil would not reconcile it
	}
	if err := controllerutil.SetControllerReference(svc, claim, r.Adapter.Client.Scheme()); err != nil {
		return nil, errors.Wrap(err, "owning the claim")
	}
	if err := r.Adapter.Client.Create(ctx, claim); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// A claim of that name that is not this Service's (or still being deleted).
			return nil, errors.Wrapf(err, "creating IPAddressClaim %s/%s", claim.Namespace, claim.Name)
		}
		return nil, errors.Wrap(err, "creating the IPAddressClaim")
	}
	r.wrote(svc, claimType, claim)
	ctrl.LoggerFrom(ctx).V(2).Info("Created IPAddressClaim for Service", "IPAddressClaim", klogRef(claim), "family", fam)
	return claim, nil
}

// updateClaim carries changed Service annotations (secret, retention, cleanup) to the
// claim; the claim handler rotates the secret or refreshes the registration.
func (r *ServiceReconciler) updateClaim(ctx context.Context, claim *ipamv1.IPAddressClaim, spec *lbservice.Spec) error {
	before := claim.DeepCopy()
	want := claimAnnotations(claim.Labels[ipamv1alpha1.ServiceNameLabel], spec)
	changed := false
	for k, v := range want {
		if claim.Annotations[k] != v {
			claim.Annotations[k] = v
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return errors.Wrap(r.Adapter.Client.Patch(ctx, claim, client.MergeFrom(before)), "updating the IPAddressClaim's annotations")
}

// publish writes the addresses for users and MetalLB. status.loadBalancer is MetalLB's.
func (r *ServiceReconciler) publish(ctx context.Context, svc *corev1.Service, spec *lbservice.Spec, published map[ipamapi.Family]string) error {
	before := svc.DeepCopy()
	var ips, asked []string
	for _, fam := range spec.Families {
		if a, ok := spec.Addresses[fam]; ok {
			asked = append(asked, lbservice.Bare(a))
		} else if a, ok := published[fam]; ok {
			asked = append(asked, lbservice.Bare(a))
		}
		if a, ok := published[fam]; ok {
			ips = append(ips, lbservice.Bare(a))
		}
	}
	set := func(k, v string) {
		if v == "" {
			delete(svc.Annotations, k)
		} else {
			svc.Annotations[k] = v
		}
	}
	if len(asked) > 0 && !sameAddresses(svc.Annotations[ipamv1alpha1.AddressesAnnotation], asked) {
		set(ipamv1alpha1.AddressesAnnotation, strings.Join(asked, ","))
	}
	set(lbservice.MetalLBLoadBalancerIPsAnnotation, strings.Join(ips, ","))
	if len(ips) > 0 {
		set(lbservice.MetalLBAllowSharedIPAnnotation, spec.SharingKey)
	}
	if maps.Equal(before.Annotations, svc.Annotations) {
		return nil
	}
	if err := r.Adapter.Client.Patch(ctx, svc, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return errors.Wrap(err, "writing the addresses to the Service")
	}
	r.wrote(svc, serviceType, svc)
	if len(ips) > 0 && before.Annotations[lbservice.MetalLBLoadBalancerIPsAnnotation] != svc.Annotations[lbservice.MetalLBLoadBalancerIPsAnnotation] {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeNormal, ipamv1alpha1.ClaimReadyAllocatedReason, actionAllocate, "Addresses %s handed to MetalLB", strings.Join(ips, ","))
	}
	return nil
}

// sameAddresses reports whether an addresses annotation already says what is asked
// (in any order or form, bare or CIDR), so a user's or GitOps tool's value is kept.
func sameAddresses(value string, asked []string) bool {
	var have []string
	for _, part := range strings.Split(value, ",") {
		if a, err := ipamapi.ParseHost(part); err == nil {
			have = append(have, a.String())
		}
	}
	want := slices.Clone(asked)
	slices.Sort(have)
	slices.Sort(want)
	return slices.Equal(have, want)
}

// reconcileDelete releases everything when the Service goes or stops being served:
// its claims are deleted (each releases its address), then the finalizer goes.
func (r *ServiceReconciler) reconcileDelete(ctx context.Context, svc *corev1.Service) error {
	if !controllerutil.ContainsFinalizer(svc, ipamv1alpha1.ServiceFinalizer) {
		return nil
	}
	claims, err := r.claimsOf(ctx, svc)
	if err != nil {
		return err
	}
	remaining := 0
	for _, cs := range claims {
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
	return errors.Wrap(client.IgnoreNotFound(r.Adapter.Client.Patch(ctx, svc, client.MergeFrom(before))), "removing the Service's finalizer")
}

// claimsOf lists the Service's claims by family.
func (r *ServiceReconciler) claimsOf(ctx context.Context, svc *corev1.Service) (map[ipamapi.Family][]ipamv1.IPAddressClaim, error) {
	list := &ipamv1.IPAddressClaimList{}
	if err := r.Adapter.Client.List(ctx, list, client.InNamespace(svc.Namespace),
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

func (r *ServiceReconciler) deleteClaims(ctx context.Context, claims []ipamv1.IPAddressClaim) error {
	for i := range claims {
		if !claims[i].DeletionTimestamp.IsZero() {
			continue
		}
		if err := r.Adapter.Client.Delete(ctx, &claims[i]); client.IgnoreNotFound(err) != nil {
			return errors.Wrapf(err, "deleting IPAddressClaim %s", claims[i].Name)
		}
	}
	return nil
}

// reportClaim passes a claim's failure on to the Service, where users look.
func (r *ServiceReconciler) reportClaim(svc *corev1.Service, claim *ipamv1.IPAddressClaim) {
	c := meta.FindStatusCondition(claim.Status.Conditions, ipamv1.IPAddressClaimReadyCondition)
	if c != nil && c.Status == metav1.ConditionFalse {
		r.Recorder.Eventf(svc, claim, corev1.EventTypeWarning, c.Reason, actionAllocate, "IPAddressClaim %s: %s", claim.Name, c.Message)
	}
}

// reportRotation passes a refused secret rotation on to the Service.
func (r *ServiceReconciler) reportRotation(svc *corev1.Service, claim *ipamv1.IPAddressClaim) {
	c := meta.FindStatusCondition(claim.Status.Conditions, ipamv1alpha1.ClaimSecretRotatedCondition)
	if c != nil && c.Status == metav1.ConditionFalse {
		r.Recorder.Eventf(svc, claim, corev1.EventTypeWarning, c.Reason, actionRotate, "IPAddressClaim %s: %s", claim.Name, c.Message)
	}
}

// boundAddressOf is the claim's registered address, once its IPAddress exists.
func boundAddressOf(c *ipamv1.IPAddressClaim) string {
	if c == nil || c.Status.AddressRef.Name == "" {
		return ""
	}
	if rec, err := claimRecord(c.Annotations); err == nil && rec != nil && rec.Registered {
		return rec.Address
	}
	return ""
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
