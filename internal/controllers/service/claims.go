package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/ipamutil"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/lbservice"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// reconcileFamily keeps one bound claim for a family, making a new claim before
// breaking the old one when the requested address, the zone or the pool changes. It
// returns the address to publish for the family; spec.Addresses[fam] is cleared when it
// names the address of a claim that no longer fits (an address of the old zone).
func (r *Reconciler) reconcileFamily(ctx context.Context, svc *corev1.Service, spec *lbservice.Spec, fam ipamapi.Family,
	claims []ipamv1.IPAddressClaim) (string, error) {
	want := spec.Addresses[fam]
	addrs, err := r.boundAddresses(ctx, claims)
	if err != nil {
		return "", err
	}
	var current, bound *ipamv1.IPAddressClaim
	for i := range claims {
		c := &claims[i]
		if !c.DeletionTimestamp.IsZero() {
			continue
		}
		addr := addrs.of(c)
		if addr != "" && (bound == nil || c.CreationTimestamp.Before(&bound.CreationTimestamp)) {
			bound = c
		}
		fits, err := r.claimFits(ctx, c, spec, addrs)
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
		case want == "" && (current == nil || addr != "" && addrs.of(current) == ""):
			current = c
		case want != "" && (addr == want || requestedOf(c) == want):
			current = c
		}
	}

	if current == nil {
		pool, err := r.poolFor(ctx, svc, spec, fam)
		if err != nil || pool == "" {
			return addrs.of(bound), err
		}
		c, err := r.createClaim(ctx, svc, spec, fam, want, pool, claims)
		if err != nil {
			return addrs.of(bound), err
		}
		current = c
	} else if err := r.updateClaim(ctx, current, spec); err != nil {
		return "", err
	}

	if addrs.of(current) == "" {
		r.reportClaim(svc, current)
		// Make before break: the old address stays published until the new one is bound.
		// The old claims are marked as superseded by the new one: with the same IPAM-API
		// identity (another pool of the same IPAM-API, zone and family), the new claim
		// takes their registration over instead of waiting for them to go.
		if err := r.supersede(ctx, claims, current); err != nil {
			return "", err
		}
		return addrs.of(bound), nil
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
	return addrs.of(current), nil
}

// supersede marks the Service's other claims of the family as superseded by current.
func (r *Reconciler) supersede(ctx context.Context, claims []ipamv1.IPAddressClaim, current *ipamv1.IPAddressClaim) error {
	for i := range claims {
		c := &claims[i]
		if c.UID == current.UID || !c.DeletionTimestamp.IsZero() || c.Annotations[ipamv1alpha1.SupersededByAnnotation] == current.Name {
			continue
		}
		before := c.DeepCopy()
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations[ipamv1alpha1.SupersededByAnnotation] = current.Name
		if err := r.Client.Patch(ctx, c, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
			return errors.Wrapf(err, "marking IPAddressClaim %s as superseded by %s", c.Name, current.Name)
		}
	}
	return nil
}

// claimFits reports whether a claim's pool still serves the Service's zone and the
// pools the Service names.
func (r *Reconciler) claimFits(ctx context.Context, c *ipamv1.IPAddressClaim, spec *lbservice.Spec, addrs boundAddrs) (bool, error) {
	name := c.Spec.PoolRef.Name
	if len(spec.Pools) > 0 && !slices.Contains(spec.Pools, name) {
		return false, nil
	}
	pool := &ipamv1alpha1.GlobalVitistackIPPool{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, pool); err != nil {
		if apierrors.IsNotFound(err) {
			return addrs.of(c) != "", nil // a bound claim keeps working without its pool
		}
		return false, errors.Wrap(err, "reading the claim's GlobalVitistackIPPool")
	}
	return pool.Spec.Zone == spec.Zone, nil
}

// poolFor picks the GlobalVitistackIPPool for a family: one named by the pool
// annotation, else the one with the Service's zone and family (the first by name if
// several).
func (r *Reconciler) poolFor(ctx context.Context, svc *corev1.Service, spec *lbservice.Spec, fam ipamapi.Family) (string, error) {
	pools := &ipamv1alpha1.GlobalVitistackIPPoolList{}
	if err := r.Client.List(ctx, pools); err != nil {
		return "", errors.Wrap(err, "listing GlobalVitistackIPPools")
	}
	var names []string
	for _, p := range pools.Items {
		if p.Spec.Zone != spec.Zone || registrar.APIFamily(p.Spec.IPFamily) != fam || !p.DeletionTimestamp.IsZero() {
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
		r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, ipamv1alpha1.EventNoPoolReason, actionAllocate, "%s", msg)
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
		ipamv1alpha1.AllowLocalSharedIPAnnotation:  spec.SharingKey,
		ipamv1alpha1.SecretAnnotation:              spec.Secret,
		ipamv1alpha1.RetentionPeriodDaysAnnotation: strconv.Itoa(spec.RetentionPeriodDays),
		ipamv1alpha1.DenyExternalCleanupAnnotation: strconv.FormatBool(spec.DenyExternalCleanup),
	}
}

func (r *Reconciler) createClaim(ctx context.Context, svc *corev1.Service, spec *lbservice.Spec, fam ipamapi.Family,
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
			// ipamutil's claim loop adds it first otherwise: a write, and a reconcile, fewer.
			Finalizers: []string{ipamutil.ReleaseAddressFinalizer},
		},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{
			APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: ipamv1alpha1.GlobalVitistackIPPoolKind, Name: pool,
		}},
	}
	if f := r.WatchFilterValue; f != "" {
		claim.Labels[clusterv1.WatchLabel] = f // or ipamutil would not reconcile it
	}
	if err := controllerutil.SetControllerReference(svc, claim, r.Client.Scheme()); err != nil {
		return nil, errors.Wrap(err, "owning the claim")
	}
	if err := r.Client.Create(ctx, claim); err != nil {
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
func (r *Reconciler) updateClaim(ctx context.Context, claim *ipamv1.IPAddressClaim, spec *lbservice.Spec) error {
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
	return errors.Wrap(r.Client.Patch(ctx, claim, client.MergeFrom(before)), "updating the IPAddressClaim's annotations")
}
