package service

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
