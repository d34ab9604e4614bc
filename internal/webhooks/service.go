package webhooks

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/lbservice"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// The webhook's configuration is written by hand in config/services/service_webhook.yaml:
// controller-gen cannot express its matchConditions (only type LoadBalancer) and
// namespaceSelector. Its path, /validate--v1-service, is the one the builder gives
// corev1.Service.

// Limits of an IPAM-API secret value (the IPAM-API's own validation).
const (
	minSecretLength = 8
	maxSecretLength = 64
)

var serviceGroupKind = schema.GroupKind{Kind: "Service"}

// Service validates the ipam.vitistack.io annotations of the Services the Service
// controller serves (type LoadBalancer, the controller's class, not in an excluded
// namespace), so that a mistake is refused when it is made instead of showing up later
// as a Service without an address. It only reads: nothing is allocated or written in
// admission.
type Service struct {
	// Client reads GlobalVitistackIPPools through the manager's cache.
	Client client.Reader
	// APIReader reads Secrets, and pools again before a refusal, uncached.
	APIReader client.Reader
	// LoadBalancerClass, ExcludedNamespaces and DefaultZone are the Service
	// controller's settings: only the Services it serves are checked.
	LoadBalancerClass  string
	ExcludedNamespaces []string
	DefaultZone        string
}

var _ admission.Validator[*corev1.Service] = &Service{}

// SetupWithManager registers the webhook.
func (w *Service) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &corev1.Service{}).WithValidator(w).Complete()
}

// ValidateCreate checks the annotations of a new Service.
func (w *Service) ValidateCreate(ctx context.Context, svc *corev1.Service) (admission.Warnings, error) {
	if !w.serves(svc) {
		return nil, nil
	}
	return nil, w.validate(ctx, nil, svc)
}

// ValidateUpdate checks the annotations of the updated Service. An update that leaves
// what the annotations mean unchanged, or only removes ipam.vitistack.io annotations,
// is not judged again: it cannot make things worse, and refusing it would block the
// controller's own writes (finalizers, MetalLB annotations) once, say, a pool is gone.
// A Service being deleted is never held up.
func (w *Service) ValidateUpdate(ctx context.Context, oldSvc, svc *corev1.Service) (admission.Warnings, error) {
	if !w.serves(svc) || !svc.DeletionTimestamp.IsZero() {
		return nil, nil
	}
	if w.serves(oldSvc) && sameServiceSpec(oldSvc, svc) && onlyRemovesAnnotations(oldSvc, svc) {
		if slices.Equal(oldSvc.Spec.Ports, svc.Spec.Ports) {
			return nil, nil
		}
		// New ports: MetalLB withdraws a shared address from a Service whose ports now
		// overlap another's, so the sharing is judged again (nothing else is).
		return nil, w.validateSharing(ctx, svc)
	}
	return nil, w.validate(ctx, oldSvc, svc)
}

// validateSharing judges only what the Service shares with others (see checkSharing).
func (w *Service) validateSharing(ctx context.Context, svc *corev1.Service) error {
	spec, _ := lbservice.Parse(svc, w.DefaultZone)
	errs, err := w.checkSharing(ctx, svc, spec)
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(serviceGroupKind, svc.Name, errs)
}

// ValidateDelete allows every delete: releasing is the controller's job.
func (w *Service) ValidateDelete(context.Context, *corev1.Service) (admission.Warnings, error) {
	return nil, nil
}

// serves reports whether the Service controller serves svc.
func (w *Service) serves(svc *corev1.Service) bool {
	return lbservice.Served(svc, w.LoadBalancerClass, w.ExcludedNamespaces)
}

// sameServiceSpec tells whether the spec fields the annotations are checked against
// are unchanged.
func sameServiceSpec(a, b *corev1.Service) bool {
	return a.Spec.Type == b.Spec.Type &&
		ptrEqual(a.Spec.LoadBalancerClass, b.Spec.LoadBalancerClass) &&
		ptrEqual(a.Spec.IPFamilyPolicy, b.Spec.IPFamilyPolicy) &&
		slices.Equal(a.Spec.IPFamilies, b.Spec.IPFamilies)
}

func ptrEqual[T comparable](a, b *T) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// onlyRemovesAnnotations tells whether every ipam.vitistack.io annotation of b is in a
// with the same value.
func onlyRemovesAnnotations(a, b *corev1.Service) bool {
	for k, v := range b.Annotations {
		if !strings.HasPrefix(k, ipamAnnotationPrefix) {
			continue
		}
		if old, ok := a.Annotations[k]; !ok || old != v {
			return false
		}
	}
	return true
}

var ipamAnnotationPrefix = ipamv1alpha1.GroupVersion.Group + "/"

// validate returns nil, an Invalid error listing every problem of svc's annotations,
// or an InternalError when a lookup failed. An address of a family the Service no
// longer asks for is a problem only if the update wrote it (old: the Service before, nil
// on create): after a switch from dual stack, the addresses annotation still holds the
// address of the family dropped, and the controller removes it.
func (w *Service) validate(ctx context.Context, old, svc *corev1.Service) error {
	spec, errs := lbservice.Parse(svc, w.DefaultZone)
	if old == nil || old.Annotations[ipamv1alpha1.AddressesAnnotation] != svc.Annotations[ipamv1alpha1.AddressesAnnotation] {
		errs = append(errs, lbservice.DroppedErrors(svc, spec)...)
	}
	errs = append(errs, growsPreferring(old, svc, spec)...)

	poolErrs, err := w.checkPools(ctx, svc, spec)
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	errs = append(errs, poolErrs...)

	secretErrs, err := w.checkSecret(ctx, svc, spec)
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	errs = append(errs, secretErrs...)

	if old == nil || sharingAsked(old, svc) {
		shareErrs, err := w.checkSharing(ctx, svc, spec)
		if err != nil {
			return apierrors.NewInternalError(err)
		}
		errs = append(errs, shareErrs...)
	}

	if len(errs) == 0 {
		return nil
	}
	ctrl.LoggerFrom(ctx).V(4).Info("Refusing Service: invalid ipam.vitistack.io annotations",
		"Service", klog.KObj(svc), "problems", len(errs))
	return apierrors.NewInvalid(serviceGroupKind, svc.Name, errs)
}

// growsPreferring refuses a switch of a Service of one IP family to dual stack under
// spec.ipFamilyPolicy PreferDualStack: MetalLB's controller gives a PreferDualStack Service
// that has one address an address of the other family itself, from the same MetalLB pool
// and whatever its autoAssign says, before the provider hands the registered one over; the
// IPAM-API may hold that address for someone else. With RequireDualStack it waits.
func growsPreferring(old, svc *corev1.Service, spec *lbservice.Spec) field.ErrorList {
	if old == nil || len(spec.Families) != 2 || svc.Spec.IPFamilyPolicy == nil || *svc.Spec.IPFamilyPolicy != corev1.IPFamilyPolicyPreferDualStack {
		return nil
	}
	// Only a Service that had one IP family can have one address MetalLB would add to (a
	// Service of two families already, asking for one, has none: MetalLB refuses it).
	before, _ := lbservice.Parse(old, "")
	if len(before.Families) != 1 || len(old.Spec.IPFamilies) > 1 {
		return nil
	}
	return field.ErrorList{field.Invalid(field.NewPath("spec", "ipFamilyPolicy"), string(corev1.IPFamilyPolicyPreferDualStack),
		"a switch to dual stack needs RequireDualStack: with PreferDualStack, MetalLB gives the Service an address of the new family "+
			"itself, which the IPAM-API may hold for someone else, before the provider hands over the one it registered")}
}

// uncached returns APIReader, else Client.
func (w *Service) uncached() client.Reader {
	if w.APIReader != nil {
		return w.APIReader
	}
	return w.Client
}

// checkPools checks that GlobalVitistackIPPools serve the zone and families asked for.
// It judges from the cache and, before refusing, once more from the API server, so a
// pool applied together with the Service is not missed.
func (w *Service) checkPools(ctx context.Context, svc *corev1.Service, spec *lbservice.Spec) (field.ErrorList, error) {
	if spec.Zone == "" {
		return nil, nil // Parse reported it.
	}
	readers := []client.Reader{w.Client, w.uncached()}
	var errs field.ErrorList
	for _, r := range readers {
		pools := &ipamv1alpha1.GlobalVitistackIPPoolList{}
		if err := r.List(ctx, pools); err != nil {
			return nil, errors.Wrap(err, "listing GlobalVitistackIPPools")
		}
		if errs = poolErrors(svc, spec, pools.Items); len(errs) == 0 {
			return nil, nil
		}
	}
	return errs, nil
}

// poolErrors judges spec against pools.
func poolErrors(svc *corev1.Service, spec *lbservice.Spec, pools []ipamv1alpha1.GlobalVitistackIPPool) field.ErrorList {
	path := field.NewPath("metadata", "annotations")
	zones := map[string]bool{}
	byName := map[string]*ipamv1alpha1.GlobalVitistackIPPool{}
	for i := range pools {
		zones[pools[i].Spec.Zone] = true
		byName[pools[i].Name] = &pools[i]
	}

	if !zones[spec.Zone] {
		fix := fmt.Sprintf("set %s to a zone a GlobalVitistackIPPool serves, or create a GlobalVitistackIPPool with spec.zone=%s",
			ipamv1alpha1.ZoneAnnotation, spec.Zone)
		known := "no GlobalVitistackIPPool exists yet"
		if len(zones) > 0 {
			known = "known zones: " + strings.Join(slices.Sorted(maps.Keys(zones)), ", ")
		}
		return field.ErrorList{field.Invalid(path.Key(ipamv1alpha1.ZoneAnnotation), spec.Zone,
			fmt.Sprintf("unknown zone: no GlobalVitistackIPPool serves zone %s (%s); %s", spec.Zone, known, fix))}
	}

	var errs field.ErrorList
	if len(spec.Pools) == 0 {
		familyValue := annotation(svc, ipamv1alpha1.IPFamilyAnnotation, lbservice.FamilyIPv4)
		for _, fam := range spec.Families {
			if !slices.ContainsFunc(pools, func(p ipamv1alpha1.GlobalVitistackIPPool) bool { return serves(&p, spec.Zone, fam) }) {
				errs = append(errs, field.Invalid(path.Key(ipamv1alpha1.IPFamilyAnnotation), familyValue,
					fmt.Sprintf("zone %s has no GlobalVitistackIPPool for %s: create a GlobalVitistackIPPool with spec.zone=%s and spec.ipFamily=%s, or ask for another family",
						spec.Zone, fam, spec.Zone, poolFamily(fam))))
			}
		}
		return errs
	}

	poolPath := path.Key(ipamv1alpha1.PoolAnnotation)
	poolValue := annotation(svc, ipamv1alpha1.PoolAnnotation, "")
	var named []string
	for _, name := range spec.Pools {
		p, ok := byName[name]
		if !ok {
			errs = append(errs, field.Invalid(poolPath, poolValue,
				fmt.Sprintf("GlobalVitistackIPPool %s does not exist: create it, or remove it from %s", name, ipamv1alpha1.PoolAnnotation)))
			continue
		}
		named = append(named, fmt.Sprintf("%s (zone %s, %s)", name, p.Spec.Zone, p.Spec.IPFamily))
	}
	if len(errs) > 0 {
		return errs
	}
	for _, fam := range spec.Families {
		if !slices.ContainsFunc(spec.Pools, func(name string) bool { return serves(byName[name], spec.Zone, fam) }) {
			errs = append(errs, field.Invalid(poolPath, poolValue,
				fmt.Sprintf("none of the named pools serves zone %s with family %s (named: %s): add a GlobalVitistackIPPool with spec.zone=%s and spec.ipFamily=%s to %s",
					spec.Zone, fam, strings.Join(named, ", "), spec.Zone, poolFamily(fam), ipamv1alpha1.PoolAnnotation)))
		}
	}
	return errs
}

func serves(p *ipamv1alpha1.GlobalVitistackIPPool, zone string, fam ipamapi.Family) bool {
	return p.Spec.Zone == zone && p.Spec.IPFamily == poolFamily(fam)
}

func poolFamily(fam ipamapi.Family) ipamv1alpha1.IPFamily {
	if fam == ipamapi.FamilyIPv6 {
		return ipamv1alpha1.IPv6
	}
	return ipamv1alpha1.IPv4
}

// annotation returns the trimmed value of key, or def when it is not set.
func annotation(svc *corev1.Service, key, def string) string {
	if v, ok := svc.Annotations[key]; ok {
		return strings.TrimSpace(v)
	}
	return def
}

// checkSharing refuses a Service that asks for the address of another Service it
// shares a key with (allow-local-shared-ip), on a port both use: MetalLB shares an
// address only between Services whose ports do not overlap, and would leave this one
// without it while the provider had handed it on. It sees the other Service's address
// once the other asked for it or had it published.
func (w *Service) checkSharing(ctx context.Context, svc *corev1.Service, spec *lbservice.Spec) (field.ErrorList, error) {
	if spec.SharingKey == "" || len(spec.Addresses) == 0 {
		return nil, nil
	}
	services := &corev1.ServiceList{} // from the API server: one applied a moment ago counts
	if err := w.uncached().List(ctx, services); err != nil {
		return nil, errors.Wrap(err, "listing Services")
	}
	var errs field.ErrorList
	p := field.NewPath("metadata", "annotations").Key(ipamv1alpha1.AllowLocalSharedIPAnnotation)
	for i := range services.Items {
		other := &services.Items[i]
		if other.Namespace == svc.Namespace && other.Name == svc.Name || !w.serves(other) || !other.DeletionTimestamp.IsZero() ||
			strings.TrimSpace(other.Annotations[ipamv1alpha1.AllowLocalSharedIPAnnotation]) != spec.SharingKey {
			continue
		}
		theirs, _ := lbservice.Parse(other, w.DefaultZone)
		for _, fam := range []ipamapi.Family{ipamapi.FamilyIPv4, ipamapi.FamilyIPv6} {
			a, ok := spec.Addresses[fam]
			if !ok || theirs.Addresses[fam] != a {
				continue
			}
			if port := overlappingPort(svc.Spec.Ports, other.Spec.Ports); port != "" {
				errs = append(errs, field.Invalid(p, spec.SharingKey, fmt.Sprintf("Service %s/%s shares this key and the address %s, and also "+
					"uses %s: MetalLB shares an address only between Services whose ports do not overlap; use another port, address or "+
					"share key", other.Namespace, other.Name, lbservice.Bare(a), port)))
			}
		}
	}
	return errs, nil
}

// sharingAsked reports whether an update changes what the Service asks to share: its
// ports, its share key, or its addresses to other than what the controller publishes
// (the controller's own write of both is not judged again).
func sharingAsked(old, svc *corev1.Service) bool {
	a, b := old.Annotations, svc.Annotations
	return !slices.Equal(old.Spec.Ports, svc.Spec.Ports) ||
		a[ipamv1alpha1.AllowLocalSharedIPAnnotation] != b[ipamv1alpha1.AllowLocalSharedIPAnnotation] ||
		a[ipamv1alpha1.AddressesAnnotation] != b[ipamv1alpha1.AddressesAnnotation] &&
			b[ipamv1alpha1.AddressesAnnotation] != b[lbservice.MetalLBLoadBalancerIPsAnnotation]
}

// overlappingPort is a protocol/port both lists use ("" if none).
func overlappingPort(a, b []corev1.ServicePort) string {
	proto := func(p corev1.ServicePort) corev1.Protocol {
		if p.Protocol == "" {
			return corev1.ProtocolTCP
		}
		return p.Protocol
	}
	for _, x := range a {
		for _, y := range b {
			if proto(x) == proto(y) && x.Port == y.Port {
				return fmt.Sprintf("%s/%d", proto(x), x.Port)
			}
		}
	}
	return ""
}

// checkSecret checks that a custom secret exists in the Service's namespace and holds
// a value the IPAM-API accepts. The value is never read into a message.
func (w *Service) checkSecret(ctx context.Context, svc *corev1.Service, spec *lbservice.Spec) (field.ErrorList, error) {
	name := spec.Secret
	if name == ipamv1alpha1.DefaultSecretName {
		return nil, nil
	}
	p := field.NewPath("metadata", "annotations").Key(ipamv1alpha1.SecretAnnotation)
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(p, name, fmt.Sprintf(
			"must be %q or the name of a Secret in namespace %s: %s", ipamv1alpha1.DefaultSecretName, svc.Namespace, strings.Join(msgs, "; ")))}, nil
	}
	key := record.DefaultSecretKey
	howTo := fmt.Sprintf("create an Opaque Secret %s in namespace %s with key %q holding %d to %d characters, or set %s to %q",
		name, svc.Namespace, key, minSecretLength, maxSecretLength, ipamv1alpha1.SecretAnnotation, ipamv1alpha1.DefaultSecretName)
	sec := &corev1.Secret{}
	if err := w.uncached().Get(ctx, types.NamespacedName{Namespace: svc.Namespace, Name: name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return field.ErrorList{field.Invalid(p, name, fmt.Sprintf("Secret %s/%s does not exist: %s", svc.Namespace, name, howTo))}, nil
		}
		return nil, errors.Wrapf(err, "reading Secret %s/%s", svc.Namespace, name)
	}
	v, ok := sec.Data[key]
	if !ok {
		return field.ErrorList{field.Invalid(p, name, fmt.Sprintf("Secret %s/%s has no key %q: put the IPAM-API secret (%d to %d characters) under key %q",
			svc.Namespace, name, key, minSecretLength, maxSecretLength, key))}, nil
	}
	// Counted as the controller counts it (bytes); the value itself is never shown.
	if n := utf8.RuneCount(v); n < minSecretLength || n > maxSecretLength {
		return field.ErrorList{field.Invalid(p, name, fmt.Sprintf("the value under key %q of Secret %s/%s must be %d to %d characters long for the IPAM-API",
			key, svc.Namespace, name, minSecretLength, maxSecretLength))}, nil
	}
	return nil, nil
}
