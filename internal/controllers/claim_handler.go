package controllers

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// ClaimHandler allocates and releases the address of one IPAddressClaim through the
// IPAM-API. It implements ipamutil.ClaimHandler; ipamutil calls FetchPool first, then
// EnsureAddress on every reconcile of a live claim (inside CreateOrPatch of its
// IPAddress) or ReleaseAddress on a deleted one, and patches the claim afterwards.
type ClaimHandler struct {
	*ProviderAdapter
	claim *ipamv1.IPAddressClaim
	pool  ipamv1alpha1.Pool
}

// FetchPool implements ipamutil.ClaimHandler.
func (h *ClaimHandler) FetchPool(ctx context.Context) (client.Object, *ctrl.Result, error) {
	ref := h.claim.Spec.PoolRef
	var pool ipamv1alpha1.Pool
	key := types.NamespacedName{Name: ref.Name}
	switch ref.Kind {
	case ipamv1alpha1.VitistackIPPoolKind:
		pool, key.Namespace = &ipamv1alpha1.VitistackIPPool{}, h.claim.Namespace
	case ipamv1alpha1.GlobalVitistackIPPoolKind:
		pool = &ipamv1alpha1.GlobalVitistackIPPool{}
	default:
		return nil, nil, reconcile.TerminalError(errors.Errorf("pool kind %q is not served by this provider", ref.Kind))
	}
	if err := h.Client.Get(ctx, key, pool); err != nil {
		if !h.claim.DeletionTimestamp.IsZero() {
			// Release works from the records alone; ipamutil releases only after NotFound.
			return nil, nil, apierrors.NewNotFound(ipamv1alpha1.GroupVersion.WithResource(strings.ToLower(ref.Kind)+"s").GroupResource(), ref.Name)
		}
		if apierrors.IsNotFound(err) {
			h.setReady(metav1.ConditionFalse, ipamv1.IPAddressClaimReadyPoolNotReadyReason,
				fmt.Sprintf("%s %q not found: create it, or point spec.poolRef at an existing pool", ref.Kind, ref.Name))
		}
		return nil, nil, err
	}
	pool.GetObjectKind().SetGroupVersionKind(ipamv1alpha1.GroupVersion.WithKind(ref.Kind))
	h.pool = pool
	return pool, nil, nil
}

// EnsureAddress implements ipamutil.ClaimHandler. ipamutil calls it inside
// CreateOrPatch of the claim's IPAddress on every reconcile of a live claim.
func (h *ClaimHandler) EnsureAddress(ctx context.Context, address *ipamv1.IPAddress) (*ctrl.Result, error) {
	if address.Spec.Address != "" {
		return nil, h.bound(ctx, address)
	}

	reg, err := claimRecord(h.claim.Annotations)
	if err != nil {
		return nil, h.fail(ipamv1.IPAddressClaimReadyAllocationFailedReason, err.Error()+"; remove the annotation to start over", "", reconcile.TerminalError(err))
	}
	if reg == nil {
		// Nothing sent yet: the claim's annotations, its pool and the flags decide.
		if reg, err = h.desiredRegistration(ctx); err != nil {
			return nil, h.failWith(err)
		}
	}
	if h.pool.PoolSpec().Subnet != "" && !reg.Registered {
		return nil, h.allocateInSubnet(ctx, address, reg)
	}
	// A registered record without an IPAddress (it was lost, or the claim was restored
	// or moved without it) is sent again with its address, never without.
	if err := h.checkIdentityFree(ctx, reg); err != nil {
		return nil, err
	}
	// Two requests without an address in flight at once would each allocate one (with
	// an address they name the same one, so only those are held back).
	if until, waiting := h.mayStillBeInFlight(h.claim.UID, reg.Attempt); waiting && reg.Address == "" {
		msg := fmt.Sprintf("an earlier registration request may still be in flight in the IPAM-API; the next is sent after %s",
			until.UTC().Format(time.RFC3339))
		h.setReady(metav1.ConditionFalse, ipamv1.IPAddressClaimReadyAllocationFailedReason, msg)
		h.wakeAt(h.claim, until)
		return nil, errors.New(msg)
	}
	api, secret, err := h.connect(ctx, reg, true)
	if err != nil {
		return nil, err
	}

	// Record what is about to be sent, and when, before sending it: a restart at any
	// point afterwards finds it, waits out a request that may still be in flight, and
	// sends the same registration again (the IPAM-API answers with the same address)
	// or releases it when the claim is deleted.
	reg.Attempt = time.Now().UTC()
	if err := h.writeRecord(ctx, reg); err != nil {
		return nil, err
	}
	res, err := api.Register(ctx, reg.request(secret))
	if answered(err) {
		h.sawAnswer(h.claim.UID, reg.Attempt)
	}
	if err != nil {
		if !reg.Registered && provesNothingHeld(err) {
			// Nothing is held under this identity: forget the record, so that a fixed
			// annotation, pool or secret is used next time, and deleting the claim has
			// nothing to release.
			if cerr := h.clearRecord(ctx); cerr != nil {
				return nil, cerr
			}
			h.unreserve(reg.key(), h.claim.UID)
		}
		return nil, h.registerFailed(reg, err)
	}

	return nil, h.registered(ctx, address, reg, res)
}

// registered completes the claim's record and the IPAddress from a successful answer.
func (h *ClaimHandler) registered(ctx context.Context, address *ipamv1.IPAddress, reg *registration, res *ipamapi.Response) error {
	host, err := ipamapi.ParseHost(res.Address)
	if err != nil || ipamapi.FamilyOf(host) != reg.Family {
		err := errors.Errorf("the IPAM-API answered with %q, which is not an %s address", res.Address, reg.Family)
		return h.fail(ipamv1.IPAddressClaimReadyAllocationFailedReason, err.Error(), "", err)
	}
	reg.Address, _ = ipamapi.CanonicalCIDR(res.Address)
	reg.Registered, reg.Declined = true, false
	reg.setOn(h.claim) // saved by ipamutil's patch of the claim, even if the IPAddress create fails
	h.fillAddress(address, reg, host)
	ctrl.LoggerFrom(ctx).V(2).Info("Registered address in the IPAM-API", "address", address.Spec.Address,
		"zone", reg.Zone, "updated", res.Updated())
	return nil
}

// bound handles a claim whose IPAddress exists. The IPAM-API is asked again only to
// carry a changed secret, retention or cleanup setting to the recorded registration,
// always with its address.
func (h *ClaimHandler) bound(ctx context.Context, address *ipamv1.IPAddress) error {
	if !metav1.IsControlledBy(address, h.claim) || !address.DeletionTimestamp.IsZero() {
		err := errors.Errorf("IPAddress %s/%s exists but does not belong to this claim (or is being deleted); "+
			"it is waited for", address.Namespace, address.Name)
		return h.fail(ipamv1.IPAddressClaimReadyAllocationFailedReason, err.Error(), "", err)
	}
	rec, err := recordedOn(address.Labels, address.Annotations)
	if err != nil {
		return h.fail(ipamv1.IPAddressClaimReadyAllocationFailedReason, err.Error(), "", reconcile.TerminalError(err))
	}
	if rec != nil {
		cur, _ := claimRecord(h.claim.Annotations)
		if cur != nil {
			rec.RotationRefused = cur.RotationRefused
		}
		if err := h.refresh(ctx, address, rec); err != nil {
			return err
		}
		// Keep the claim's record in step with the IPAddress's, which is authoritative.
		if cur == nil || !cur.Registered || cur.Address != rec.Address || cur.Secret.String() != rec.Secret.String() ||
			cur.RetentionPeriodDays != rec.RetentionPeriodDays || cur.DenyExternalCleanup != rec.DenyExternalCleanup ||
			cur.RotationRefused != rec.RotationRefused {
			rec.Attempt = time.Time{}
			rec.setOn(h.claim)
		}
		h.unreserve(rec.key(), h.claim.UID)
	}
	h.forgetPicks()
	if !meta.IsStatusConditionTrue(h.claim.Status.Conditions, ipamv1.IPAddressClaimReadyCondition) {
		h.Recorder.Eventf(h.claim, nil, corev1.EventTypeNormal, ipamv1alpha1.ClaimReadyAllocatedReason, actionAllocate,
			"Allocated %s from zone %s (%s)", address.Spec.Address, address.Labels[ipamv1alpha1.ZoneLabel], address.Labels[ipamv1alpha1.IPFamilyLabel])
	}
	h.setReady(metav1.ConditionTrue, ipamv1alpha1.ClaimReadyAllocatedReason, fmt.Sprintf("Allocated %s", address.Spec.Address))
	return nil
}

// refresh carries a changed secret (a rotation, new_secret), retention or cleanup
// setting of a bound claim to the IPAM-API, with the recorded identity and address.
func (h *ClaimHandler) refresh(ctx context.Context, address *ipamv1.IPAddress, rec *registration) error {
	// Only the claim's own annotations are carried to a bound address: a changed pool
	// or flag never touches what is registered.
	want := *rec
	if err := h.applyOverrides(&want); err != nil {
		return nil // a bad annotation does not touch a bound address; it is reported when it matters
	}
	if want.Secret.String() == rec.Secret.String() && rec.RotationRefused != "" {
		// The user went back to the secret that owns the address: the refusal is moot.
		rec.RotationRefused = ""
		meta.RemoveStatusCondition(&h.claim.Status.Conditions, ipamv1alpha1.ClaimSecretRotatedCondition)
	}
	rotate := want.Secret.String() != rec.Secret.String() && want.Secret.String() != rec.RotationRefused
	if !rotate && want.RetentionPeriodDays == rec.RetentionPeriodDays && want.DenyExternalCleanup == rec.DenyExternalCleanup {
		return nil
	}
	api, oldSecret, err := h.connect(ctx, rec, false)
	if err != nil {
		return err
	}
	req := rec.request(oldSecret)
	req.RetentionPeriodDays, req.DenyExternalCleanup = want.RetentionPeriodDays, want.DenyExternalCleanup
	if rotate {
		if req.NewSecret, err = h.Secrets.Value(ctx, want.Secret, true, false); err != nil {
			return h.failRotation(err.Error())
		}
	}
	if _, err := api.Register(ctx, req); err != nil {
		if ipamapi.ClassOf(err) == ipamapi.ClassRotationRefused {
			rec.RotationRefused = want.Secret.String()
			return h.failRotation(fmt.Sprintf("the IPAM-API refused to give %s the secret %s (%v): the address is shared "+
				"by several services or held by another, so it keeps the secret %s", rec.Address, want.Secret, err, rec.Secret))
		}
		return err
	}
	old := rec.Secret
	rec.RetentionPeriodDays, rec.DenyExternalCleanup = want.RetentionPeriodDays, want.DenyExternalCleanup
	if rotate {
		// The new Secret now owns the address: keep it until the address is released.
		if _, err := h.Secrets.Value(ctx, want.Secret, false, true); err != nil {
			return err
		}
		rec.Secret, rec.RotationRefused = want.Secret, ""
		meta.SetStatusCondition(&h.claim.Status.Conditions, metav1.Condition{
			Type: ipamv1alpha1.ClaimSecretRotatedCondition, Status: metav1.ConditionTrue, Reason: ipamv1alpha1.ClaimSecretRotatedReason,
			Message: fmt.Sprintf("%s is owned by the secret %s", rec.Address, rec.Secret), ObservedGeneration: h.claim.Generation,
		})
		h.Recorder.Eventf(h.claim, nil, corev1.EventTypeNormal, "SecretRotated", actionRotate, "%s is now owned by the secret %s (was %s)", rec.Address, rec.Secret, old)
	}
	rec.writeTo(address.Labels, address.Annotations) // patched onto the IPAddress by ipamutil
	if rotate {
		return h.unprotectUnused(ctx, old)
	}
	return nil
}

// failRotation reports a refused or impossible rotation; the address stays as it is.
func (h *ClaimHandler) failRotation(msg string) error {
	meta.SetStatusCondition(&h.claim.Status.Conditions, metav1.Condition{
		Type: ipamv1alpha1.ClaimSecretRotatedCondition, Status: metav1.ConditionFalse, Reason: ipamv1alpha1.ClaimSecretRotationRefusedReason,
		Message: msg, ObservedGeneration: h.claim.Generation,
	})
	h.Recorder.Eventf(h.claim, nil, corev1.EventTypeWarning, ipamv1alpha1.ClaimSecretRotationRefusedReason, actionRotate, "%s", msg)
	return nil
}

// ReleaseAddress implements ipamutil.ClaimHandler. It releases what is recorded: on
// the IPAddress, else on the claim.
func (h *ClaimHandler) ReleaseAddress(ctx context.Context) (*ctrl.Result, error) {
	if h.claim.DeletionTimestamp.IsZero() {
		return nil, nil
	}
	log := ctrl.LoggerFrom(ctx)
	reg, err := h.recordedRegistration(ctx)
	if err != nil {
		return nil, h.releaseFailed(err)
	}
	if reg == nil {
		return nil, nil
	}
	if _, moving := h.claim.Annotations[clusterctlv1.DeleteForMoveAnnotation]; moving {
		log.V(2).Info("Claim deleted by clusterctl move, keeping its address registered")
		h.unreserve(reg.key(), h.claim.UID)
		return nil, nil
	}
	api, secret, err := h.connect(ctx, reg, false)
	if err != nil {
		return nil, h.releaseFailed(err)
	}

	if !reg.Registered {
		// The registration was sent but its answer never arrived. The user never saw
		// the address, so it is released without retention, once the request has
		// certainly ended (a release before it lands would find nothing, and it would
		// then register the address for good).
		reg.RetentionPeriodDays = 0
		if until, waiting := h.mayStillBeInFlight(h.claim.UID, reg.Attempt); waiting {
			h.wakeAt(h.claim, until)
			return nil, h.releaseFailed(errors.Errorf("an earlier registration request may still be in flight; releasing after %s",
				until.UTC().Format(time.RFC3339)))
		}
		if reg.Address == "" {
			// Send it again to learn the address (the IPAM-API returns the held one).
			res, err := api.Register(ctx, reg.request(secret))
			switch {
			case err != nil && provesNothingHeld(err):
				return nil, h.released(ctx, reg, "nothing was held")
			case err != nil:
				return nil, h.releaseFailed(err)
			}
			reg.Address = res.Address
		}
	}

	if _, err := api.Release(ctx, reg.request(secret)); err != nil {
		notHeld := ipamapi.IsNotHeld(err) || (!reg.Registered && ipamapi.ClassOf(err) == ipamapi.ClassValidation)
		if !notHeld {
			return nil, h.releaseFailed(err)
		}
		return nil, h.released(ctx, reg, "it was not held (any more)")
	}
	return nil, h.released(ctx, reg, fmt.Sprintf("retention %d days", reg.RetentionPeriodDays))
}

// released finishes a release: the record goes, and the Secret loses its finalizer
// when no other claim needs it.
func (h *ClaimHandler) released(ctx context.Context, reg *registration, how string) error {
	delete(h.claim.Annotations, ipamv1alpha1.RegistrationAnnotation)
	h.unreserve(reg.key(), h.claim.UID)
	h.forgetPicks()
	ctrl.LoggerFrom(ctx).V(2).Info("Released address in the IPAM-API", "address", reg.Address, "how", how)
	h.Recorder.Eventf(h.claim, nil, corev1.EventTypeNormal, "Released", actionRelease, "Released %s in zone %s (%s)", reg.Address, reg.Zone, how)

	return h.unprotectUnused(ctx, reg.Secret)
}

// unprotectUnused drops the secret-in-use finalizer when no other claim uses the Secret.
func (h *ClaimHandler) unprotectUnused(ctx context.Context, ref objectRef) error {
	others := &ipamv1.IPAddressClaimList{}
	if err := h.Client.List(ctx, others, client.MatchingFields{ClaimSecretIndex: secretKey(ref).String()}); err != nil {
		return errors.Wrap(err, "listing the claims that use the Secret")
	}
	for _, c := range others.Items {
		if c.UID != h.claim.UID {
			return nil
		}
	}
	return h.Secrets.Unprotect(ctx, ref)
}

// recordedRegistration finds what was registered for the claim: the IPAddress's
// record, else the claim's record, else nothing.
func (h *ClaimHandler) recordedRegistration(ctx context.Context) (*registration, error) {
	addr := &ipamv1.IPAddress{}
	err := h.Client.Get(ctx, client.ObjectKeyFromObject(h.claim), addr)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, errors.Wrap(err, "reading the claim's IPAddress")
	}
	if err == nil && metav1.IsControlledBy(addr, h.claim) {
		reg, err := recordedOn(addr.Labels, addr.Annotations)
		if err != nil || reg != nil {
			return reg, err
		}
	}
	return claimRecord(h.claim.Annotations)
}

// desiredRegistration computes the registration for an unbound claim from its
// annotations, its pool and the manager's configuration.
func (h *ClaimHandler) desiredRegistration(ctx context.Context) (*registration, error) {
	spec := h.pool.PoolSpec()
	ann := h.claim.Annotations
	reg := &registration{
		Endpoint:            h.Config.DefaultEndpoint,
		Zone:                spec.Zone,
		Family:              apiFamily(spec.IPFamily),
		DenyExternalCleanup: spec.DenyExternalCleanup,
		RetentionPeriodDays: int(ptr.Deref(spec.RetentionPeriodDays, 0)),
	}
	if spec.Endpoint != "" {
		reg.Endpoint = spec.Endpoint
	}
	reg.Endpoint = ipamapi.NormalizeEndpoint(reg.Endpoint)
	if reg.Endpoint == "" {
		return nil, &claimError{reason: ipamv1.IPAddressClaimReadyPoolNotReadyReason, terminal: true,
			msg: "no IPAM-API endpoint: set spec.endpoint on the pool or --ipam-api-url on the manager"}
	}
	if spec.CABundleRef != nil {
		reg.CABundle = objectRef{Kind: spec.CABundleRef.Kind, Namespace: spec.CABundleRef.Namespace,
			Name: spec.CABundleRef.Name, Key: spec.CABundleRef.Key}
		if h.pool.GetNamespace() != "" {
			reg.CABundle.Namespace = h.pool.GetNamespace()
		}
	}

	invalid := func(key, format string, args ...any) error {
		return &claimError{reason: ipamv1.IPAddressClaimReadyAllocationFailedReason, event: ipamv1alpha1.ClaimReadyInvalidAnnotationReason,
			terminal: true, msg: fmt.Sprintf("annotation %s: ", key) + fmt.Sprintf(format, args...)}
	}

	// The address the user asked for, if any: the entry of the pool's family.
	if v := strings.TrimSpace(ann[ipamv1alpha1.AddressesAnnotation]); v != "" {
		for _, s := range strings.Split(v, ",") {
			a, err := ipamapi.ParseHost(s)
			if err != nil {
				return nil, invalid(ipamv1alpha1.AddressesAnnotation, "%v; give bare addresses or host CIDRs, comma-separated", err)
			}
			if ipamapi.FamilyOf(a) == reg.Family {
				if reg.Address != "" {
					return nil, invalid(ipamv1alpha1.AddressesAnnotation, "more than one %s address in %q; give one per family", reg.Family, v)
				}
				reg.Address = netip.PrefixFrom(a, a.BitLen()).String()
			}
		}
		if reg.Address == "" {
			return nil, invalid(ipamv1alpha1.AddressesAnnotation, "%q has no %s address for pool %s", v, reg.Family, h.pool.GetName())
		}
	}
	// The secret: the claim's annotation, else the pool's secretRef, else the default.
	reg.Secret = objectRef{Namespace: h.Config.DefaultSecret.Namespace, Name: h.Config.DefaultSecret.Name, Key: DefaultSecretKey}
	if spec.SecretRef != nil {
		reg.Secret = objectRef{Namespace: spec.SecretRef.Namespace, Name: spec.SecretRef.Name, Key: spec.SecretRef.Key}
		if h.pool.GetNamespace() != "" {
			reg.Secret.Namespace = h.pool.GetNamespace()
		}
		if reg.Secret.Key == "" {
			reg.Secret.Key = DefaultSecretKey
		}
	}
	if err := h.applyOverrides(reg); err != nil {
		return nil, err
	}

	// The identity.
	reg.Identity.ServiceName = h.claim.Name
	if v := strings.TrimSpace(ann[ipamv1alpha1.ServiceNameAnnotation]); v != "" {
		reg.Identity.ServiceName = v
	}
	if v := strings.TrimSpace(ann[ipamv1alpha1.NamespaceIDAnnotation]); v != "" {
		reg.Identity.NamespaceID = v
	} else {
		ns := &corev1.Namespace{}
		if err := h.Client.Get(ctx, types.NamespacedName{Name: h.claim.Namespace}, ns); err != nil {
			return nil, errors.Wrapf(err, "reading Namespace %s for the claim's namespace_id", h.claim.Namespace)
		}
		reg.Identity.NamespaceID = string(ns.UID)
	}
	switch v := strings.TrimSpace(ann[ipamv1alpha1.ClusterIDAnnotation]); {
	case v != "":
		reg.Identity.ClusterID = v
	case spec.ClusterID != "":
		reg.Identity.ClusterID = spec.ClusterID
	default:
		id, err := h.clusterID(ctx)
		if err != nil {
			return nil, err
		}
		reg.Identity.ClusterID = id
	}
	return reg, nil
}

// applyOverrides applies the claim's secret, retention and cleanup annotations, where
// present, to reg.
func (h *ClaimHandler) applyOverrides(reg *registration) error {
	ann := h.claim.Annotations
	invalid := func(key, format string, args ...any) error {
		return &claimError{reason: ipamv1.IPAddressClaimReadyAllocationFailedReason, event: ipamv1alpha1.ClaimReadyInvalidAnnotationReason,
			terminal: true, msg: fmt.Sprintf("annotation %s: ", key) + fmt.Sprintf(format, args...)}
	}
	if v, ok := ann[ipamv1alpha1.RetentionPeriodDaysAnnotation]; ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > 30 {
			return invalid(ipamv1alpha1.RetentionPeriodDaysAnnotation, "%q is not a whole number of days from 0 to 30", v)
		}
		reg.RetentionPeriodDays = n
	}
	if v, ok := ann[ipamv1alpha1.DenyExternalCleanupAnnotation]; ok {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return invalid(ipamv1alpha1.DenyExternalCleanupAnnotation, "%q is not \"true\" or \"false\"", v)
		}
		reg.DenyExternalCleanup = b
	}
	switch v := strings.TrimSpace(ann[ipamv1alpha1.SecretAnnotation]); v {
	case "":
	case ipamv1alpha1.DefaultSecretName:
		reg.Secret = objectRef{Namespace: h.Config.DefaultSecret.Namespace, Name: h.Config.DefaultSecret.Name, Key: DefaultSecretKey}
	default:
		reg.Secret = objectRef{Namespace: h.claim.Namespace, Name: v, Key: DefaultSecretKey}
	}
	return nil
}

// checkIdentityFree refuses an identity that another claim already holds: the IPAM-API
// would answer both with the same address, and releasing one would free the other's.
func (h *ClaimHandler) checkIdentityFree(ctx context.Context, reg *registration) error {
	key := reg.key()
	other := ""
	addrs := &ipamv1.IPAddressList{}
	if err := h.Client.List(ctx, addrs, client.MatchingFields{AddressRegistrationIndex: key}); err != nil {
		return errors.Wrap(err, "listing IPAddresses by registration")
	}
	for _, a := range addrs.Items {
		if !metav1.IsControlledBy(&a, h.claim) && holdersConflict(reg.Address, a.Annotations[ipamv1alpha1.RegisteredAddressAnnotation]) {
			other = "IPAddress " + a.Namespace + "/" + a.Name
		}
	}
	claims := &ipamv1.IPAddressClaimList{}
	if err := h.Client.List(ctx, claims, client.MatchingFields{ClaimRegistrationIndex: key}); err != nil {
		return errors.Wrap(err, "listing IPAddressClaims by registration")
	}
	for _, c := range claims.Items {
		if rec, _ := claimRecord(c.Annotations); c.UID != h.claim.UID && rec != nil && holdersConflict(reg.Address, rec.Address) {
			other = "IPAddressClaim " + c.Namespace + "/" + c.Name
		}
	}
	if other == "" {
		if holder, ok := h.reserve(ctx, key, reg.Address, h.claim); !ok {
			other = "IPAddressClaim " + holder
		}
	}
	if other == "" {
		return nil
	}
	msg := fmt.Sprintf("the IPAM-API identity (service_name %q, namespace_id %q, cluster_id %q) is already used by %s; "+
		"give this claim a unique %s annotation", reg.Identity.ServiceName, reg.Identity.NamespaceID, reg.Identity.ClusterID,
		other, ipamv1alpha1.ServiceNameAnnotation)
	if owner := metav1.GetControllerOf(h.claim); owner != nil && owner.Kind == "Service" {
		msg = fmt.Sprintf("another claim of Service %s (%s) holds its IPAM-API identity with no address yet, or with the same "+
			"address; waiting until it is bound or released", owner.Name, other)
	}
	// Not terminal: the other holder may be pending, moving or going away; retried with back-off.
	return h.failWith(&claimError{reason: ipamv1.IPAddressClaimReadyAllocationFailedReason, event: "IdentityInUse", msg: msg})
}

// writeRecord saves the claim's record at once (not with ipamutil's patch at the end).
func (h *ClaimHandler) writeRecord(ctx context.Context, reg *registration) error {
	// Patch a copy: ipamutil patches h.claim at the end of the reconcile, and a changed
	// resourceVersion in it would make that patch conflict.
	claim := h.claim.DeepCopy()
	patch := client.MergeFrom(h.claim.DeepCopy())
	reg.setOn(claim)
	if err := h.Client.Patch(ctx, claim, patch); err != nil {
		return errors.Wrap(err, "recording the registration on the claim")
	}
	h.claim.Annotations = claim.Annotations
	return nil
}

// unknownOutcome reports whether a request may have been carried out although no
// answer arrived.
func unknownOutcome(err error) bool {
	var e *ipamapi.Error
	return errors.As(err, &e) && e.Unknown
}

// provesNothingHeld reports whether a failed registration proves that the identity
// holds nothing under the secret, zone and family: had it held an address, the
// IPAM-API would have answered with it.
func provesNothingHeld(err error) bool {
	switch ipamapi.ClassOf(err) {
	case ipamapi.ClassValidation, ipamapi.ClassExhausted, ipamapi.ClassWrongSecret, ipamapi.ClassNotInZone:
		return true
	}
	return false
}

// connect resolves the client and the secret for a registration. Failures become the
// claim's condition.
func (h *ClaimHandler) connect(ctx context.Context, reg *registration, creating bool) (ipamapi.Client, ipamapi.Secret, error) {
	ca, err := h.Secrets.CABundle(ctx, reg.CABundle)
	if err != nil {
		return nil, "", h.fail(ipamv1.IPAddressClaimReadyPoolNotReadyReason, err.Error()+"; fix the pool's caBundleRef", "", err)
	}
	api, err := h.Clients.For(reg.Endpoint, ca)
	if err != nil {
		return nil, "", h.fail(ipamv1.IPAddressClaimReadyPoolNotReadyReason, err.Error(), "", reconcile.TerminalError(err))
	}
	secret, err := h.Secrets.Value(ctx, reg.Secret, creating, creating)
	if err != nil {
		var nf *errSecretNotFound
		var inv *errSecretInvalid
		switch {
		case errors.As(err, &nf):
			err = errors.Errorf("%s: create it (type Opaque, key %q), or change the %s annotation or the pool's secretRef",
				nf.Error(), nf.ref.Key, ipamv1alpha1.SecretAnnotation)
		case errors.As(err, &inv):
			err = errors.New(inv.Error())
		}
		if creating {
			return nil, "", h.fail(ipamv1.IPAddressClaimReadyAllocationFailedReason, err.Error(), ipamv1alpha1.ClaimReadySecretNotFoundReason, err)
		}
		return nil, "", err
	}
	return api, secret, nil
}

// registerFailed turns a failed registration into the claim's condition and an event,
// and decides how it is retried.
func (h *ClaimHandler) registerFailed(reg *registration, err error) error {
	reason := ipamv1.IPAddressClaimReadyAllocationFailedReason
	event := ""
	msg := err.Error()
	switch ipamapi.ClassOf(err) {
	case ipamapi.ClassExhausted:
		reason = ipamv1.IPAddressClaimReadyPoolExhaustedReason
		msg = fmt.Sprintf("zone %s has no free %s address left: %s; the claim is retried with back-off", reg.Zone, reg.Family, msg)
	case ipamapi.ClassValidation:
		reason = ipamv1.IPAddressClaimReadyPoolNotReadyReason
		msg = fmt.Sprintf("the IPAM-API refused the request for zone %s, family %s: %s; fix the pool or the claim's annotations", reg.Zone, reg.Family, msg)
	case ipamapi.ClassUnexpectedResponse:
		reason = ipamv1.IPAddressClaimReadyPoolNotReadyReason
		msg = fmt.Sprintf("%s is not answering as the IPAM-API: %s", reg.Endpoint, msg)
	case ipamapi.ClassWrongSecret:
		event = ipamv1alpha1.ClaimReadyAddressTakenReason
		msg = fmt.Sprintf("address %s is held under another secret in zone %s: request another address, or use the secret that owns it", reg.Address, reg.Zone)
	case ipamapi.ClassNotInZone:
		event = "AddressNotInZone"
		msg = fmt.Sprintf("address %s does not belong to zone %s: request an address of the zone", reg.Address, reg.Zone)
	case ipamapi.ClassTransient:
		event = ipamv1alpha1.ClaimReadyIPAMAPIUnreachableReason
		msg = fmt.Sprintf("the IPAM-API at %s could not be reached: %s; retrying with back-off", reg.Endpoint, msg)
	}
	return h.fail(reason, msg, event, err)
}

// claimError is a failure with what the claim's condition and event should say.
type claimError struct {
	reason, event, msg string
	// terminal errors wait for a change of the claim or pool instead of a retry.
	terminal bool
}

func (e *claimError) Error() string { return e.msg }

// failWith turns err into the claim's condition and event when it is a claimError.
func (h *ClaimHandler) failWith(err error) error {
	var ce *claimError
	if !errors.As(err, &ce) {
		return err
	}
	var ret error = ce
	if ce.terminal {
		ret = reconcile.TerminalError(ce)
	}
	return h.fail(ce.reason, ce.msg, ce.event, ret)
}

// fail sets the claim's Ready condition to False, emits a Warning event and returns
// the error to hand to ipamutil (nil err: a new error with msg).
func (h *ClaimHandler) fail(reason, msg, eventReason string, err error) error {
	h.setReady(metav1.ConditionFalse, reason, msg)
	if eventReason == "" {
		eventReason = reason
	}
	h.Recorder.Eventf(h.claim, nil, corev1.EventTypeWarning, eventReason, actionAllocate, "%s", msg)
	if err == nil {
		err = errors.New(msg)
	}
	return err
}

func (h *ClaimHandler) releaseFailed(err error) error {
	msg := "releasing the address failed, retrying with back-off: " + err.Error()
	var nf *errSecretNotFound
	if errors.As(err, &nf) {
		msg = fmt.Sprintf("cannot release the address: %s. Recreate the Secret with the value that owns the address; "+
			"removing the claim's %s finalizer instead abandons the address in the IPAM-API", nf.Error(), "ipam.cluster.x-k8s.io/ReleaseAddress")
	}
	h.setReady(metav1.ConditionFalse, ipamv1alpha1.ClaimReadyReleaseFailedReason, msg)
	h.Recorder.Eventf(h.claim, nil, corev1.EventTypeWarning, ipamv1alpha1.ClaimReadyReleaseFailedReason, actionRelease, "%s", msg)
	return err
}

func (h *ClaimHandler) setReady(status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&h.claim.Status.Conditions, metav1.Condition{
		Type:               ipamv1.IPAddressClaimReadyCondition,
		Status:             status,
		Reason:             reason,
		Message:            msg,
		ObservedGeneration: h.claim.Generation,
	})
}

// fillAddress writes the allocated address and the registration record into the
// IPAddress that ipamutil creates.
func (h *ClaimHandler) fillAddress(address *ipamv1.IPAddress, reg *registration, host netip.Addr) {
	spec := h.pool.PoolSpec()
	address.Spec.Address = host.String()
	address.Spec.Prefix = ptr.To(int32(host.BitLen()))
	if p, err := netip.ParsePrefix(spec.Subnet); err == nil {
		address.Spec.Prefix = ptr.To(int32(p.Bits()))
	}
	if spec.Prefix != nil {
		address.Spec.Prefix = ptr.To(*spec.Prefix)
	}
	address.Spec.Gateway = spec.Gateway
	if address.Labels == nil {
		address.Labels = map[string]string{}
	}
	if address.Annotations == nil {
		address.Annotations = map[string]string{}
	}
	address.Labels[ipamv1alpha1.PoolNameLabel] = h.pool.GetName()
	address.Labels[ipamv1alpha1.PoolKindLabel] = h.claim.Spec.PoolRef.Kind
	reg.writeTo(address.Labels, address.Annotations)
}

func apiFamily(f ipamv1alpha1.IPFamily) ipamapi.Family {
	if f == ipamv1alpha1.IPv6 {
		return ipamapi.FamilyIPv6
	}
	return ipamapi.FamilyIPv4
}

// answered reports whether a request's outcome is known: it got an answer, or it was
// never sent. Only then may the next request for the identity go out at once.
func answered(err error) bool {
	var e *ipamapi.Error
	if err == nil || !errors.As(err, &e) {
		return true
	}
	return !e.Unknown && !e.NotSent
}

// clearRecord removes the claim's record at once (ipamutil's patch at the end of the
// reconcile would not send the removal of a record it never saw).
func (h *ClaimHandler) clearRecord(ctx context.Context) error {
	if _, ok := h.claim.Annotations[ipamv1alpha1.RegistrationAnnotation]; !ok {
		return nil
	}
	claim := h.claim.DeepCopy()
	patch := client.MergeFrom(h.claim.DeepCopy())
	delete(claim.Annotations, ipamv1alpha1.RegistrationAnnotation)
	if err := h.Client.Patch(ctx, claim, patch); err != nil {
		return errors.Wrap(err, "removing the registration record from the claim")
	}
	h.claim.Annotations = claim.Annotations
	return nil
}
