package service

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/lbservice"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// publish writes the addresses for users and MetalLB. status.loadBalancer is MetalLB's.
func (r *Reconciler) publish(ctx context.Context, svc *corev1.Service, spec *lbservice.Spec, published map[ipamapi.Family]string) error {
	before := svc.DeepCopy()
	announced := byFamily(svc.Annotations[lbservice.MetalLBLoadBalancerIPsAnnotation])
	var ips, asked []string
	for _, fam := range spec.Families {
		if a, ok := spec.Addresses[fam]; ok {
			asked = append(asked, lbservice.Bare(a))
		} else if a, ok := published[fam]; ok {
			asked = append(asked, lbservice.Bare(a))
		}
		if a, ok := published[fam]; ok {
			ips = append(ips, lbservice.Bare(a))
		} else if a, ok := spec.Addresses[fam]; ok && announced[fam] != "" && announced[fam] == byFamily(a)[fam] {
			// MetalLB announces the very address the Service asks for (a Service taken
			// over from the IPAM-operator): it stays while the claim binds, so the
			// announcement has no gap.
			ips = append(ips, announced[fam])
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
	if err := r.Client.Patch(ctx, svc, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return errors.Wrap(err, "writing the addresses to the Service")
	}
	r.wrote(svc, serviceType, svc)
	if len(ips) > 0 && before.Annotations[lbservice.MetalLBLoadBalancerIPsAnnotation] != svc.Annotations[lbservice.MetalLBLoadBalancerIPsAnnotation] {
		r.Recorder.Eventf(svc, nil, corev1.EventTypeNormal, ipamv1alpha1.ClaimReadyAllocatedReason, actionAllocate, "Addresses %s handed to MetalLB", strings.Join(ips, ","))
	}
	return nil
}

// checkAnnounced warns when MetalLB announces, for a family the Service asks for and
// has not been handed an address of yet, an address the Service did not ask for:
// MetalLB picked it itself, from a pool with autoAssign on, and the IPAM-API may have
// given it to someone else. MetalLB moves to the provider's address once it is handed
// over; until then the event names MetalLB's pool.
func (r *Reconciler) checkAnnounced(svc *corev1.Service, spec *lbservice.Spec) {
	handed := byFamily(svc.Annotations[lbservice.MetalLBLoadBalancerIPsAnnotation])
	for _, in := range svc.Status.LoadBalancer.Ingress {
		a, err := netip.ParseAddr(in.IP)
		if err != nil {
			continue
		}
		fam := ipamapi.FamilyOf(a)
		if !slices.Contains(spec.Families, fam) || handed[fam] != "" || spec.Addresses[fam] == netip.PrefixFrom(a, a.BitLen()).String() {
			continue
		}
		why := "MetalLB's IPAddressPool %q assigns addresses itself, and the IPAM-API may have given %s to someone else. " +
			"Set autoAssign: false on that pool"
		if len(handed) == 1 && svc.Spec.IPFamilyPolicy != nil && *svc.Spec.IPFamilyPolicy == corev1.IPFamilyPolicyPreferDualStack {
			// MetalLB adds the second family of a PreferDualStack Service itself, autoAssign or not.
			why = "MetalLB took it from IPAddressPool %q for this PreferDualStack Service itself, whatever the pool's autoAssign " +
				"says, and the IPAM-API may have given %s to someone else. Use spec.ipFamilyPolicy RequireDualStack"
		}
		r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, ipamv1alpha1.EventMetalLBAssignedReason, actionAllocate,
			"MetalLB announces %s, which this provider has not handed it: "+why+"; MetalLB moves to the registered address once the claim is bound",
			a, svc.Annotations[lbservice.MetalLBAllocatedFromPoolAnnotation], a)
	}
}

// MetalLB's controller says that it refuses the addresses a Service asks for (none of its
// IPAddressPools covers them, or not from one pool, or they are of another family than
// the Service's) with a core/v1 Warning event of this reason, from this component,
// "Failed to allocate IP for \"ns/name\": …" with the addresses quoted; it clears the
// Service's status.loadBalancer and announces nothing.
const (
	MetalLBAllocationFailedReason = "AllocationFailed"
	MetalLBController             = "metallb-controller"
)

// fromMetalLB reports whether e is MetalLB's controller refusing a Service addresses.
func fromMetalLB(e *corev1.Event) bool {
	ref := e.InvolvedObject
	return e.Reason == MetalLBAllocationFailedReason && e.Source.Component == MetalLBController &&
		ref.Kind == "Service" && ref.APIVersion == corev1.SchemeGroupVersion.String()
}

// serviceOfRefusal maps MetalLB's refusal event to the Service it is about.
func serviceOfRefusal(_ context.Context, o client.Object) []reconcile.Request {
	e, ok := o.(*corev1.Event)
	if !ok || !fromMetalLB(e) {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: e.InvolvedObject.Namespace, Name: e.InvolvedObject.Name}}}
}

// checkRefused relays MetalLB's refusal of the addresses this provider handed it: when
// they are one of each family the Service asks for and status.loadBalancer.ingress
// lacks one of them, MetalLB's newest AllocationFailed event on the Service, if it names
// every one of them, is passed on as the Warning MetalLBRefused (the recorder folds
// repeats into one). While a Service switches families, MetalLB refuses what it was
// handed before (the one address of a Service switched to two) until the provider hands
// it the new set a moment later: neither that refusal nor its event, which names only
// some of the new set, is relayed.
func (r *Reconciler) checkRefused(ctx context.Context, svc *corev1.Service, spec *lbservice.Spec) error {
	value := svc.Annotations[lbservice.MetalLBLoadBalancerIPsAnnotation]
	byFam := byFamily(value)
	if len(byFam) != len(spec.Families) || slices.ContainsFunc(spec.Families, func(f ipamapi.Family) bool { return byFam[f] == "" }) {
		return nil
	}
	handed := slices.Collect(maps.Values(byFam))
	announced := map[string]bool{}
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(in.IP); err == nil {
			announced[a.String()] = true
		}
	}
	if !slices.ContainsFunc(handed, func(a string) bool { return !announced[a] }) {
		return nil
	}
	list := &corev1.EventList{} // the cache holds only MetalLB's AllocationFailed events
	if err := r.Client.List(ctx, list, client.InNamespace(svc.Namespace)); err != nil {
		return errors.Wrap(err, "listing MetalLB's AllocationFailed events")
	}
	var newest *corev1.Event
	for i := range list.Items {
		if e := &list.Items[i]; e.InvolvedObject.UID == svc.UID && fromMetalLB(e) && (newest == nil || !lastSeen(e).Before(lastSeen(newest))) {
			newest = e
		}
	}
	// MetalLB quotes the addresses (%q of its list), in their canonical form.
	if newest == nil || slices.ContainsFunc(handed, func(a string) bool { return !strings.Contains(newest.Message, strconv.Quote(a)) }) {
		return nil
	}
	r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, ipamv1alpha1.EventMetalLBRefusedReason, actionAllocate,
		"MetalLB refuses the addresses this provider handed it (%s): %s; check that a MetalLB IPAddressPool covers them "+
			"(a dual-stack Service's pair from one pool)", value, newest.Message)
	return nil
}

// lastSeen is when an event last happened.
func lastSeen(e *corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
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

// byFamily is the addresses of a comma-separated list (bare or CIDR), by family, in
// their canonical form; what does not parse is left out.
func byFamily(list string) map[ipamapi.Family]string {
	out := map[ipamapi.Family]string{}
	for _, part := range strings.Split(list, ",") {
		if a, err := ipamapi.ParseHost(strings.TrimSpace(part)); err == nil {
			out[ipamapi.FamilyOf(a)] = a.String()
		}
	}
	return out
}
