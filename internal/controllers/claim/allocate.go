package claim

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/ipamutil"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/subnet"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// allocate registers an address for a claim without an IPAddress: the one it asks for, any
// the IPAM-API picks (routed mode), or, in subnet mode, a candidate the provider picks in
// order. It is a switch on the phase of the claim's record (record.Phase). What is about to
// be sent is recorded on the claim before it is sent, so a restart at any point finds it,
// waits out a request that may still be in flight, and sends the same registration again
// (the IPAM-API answers with the same address) or releases it on deletion. One reconcile
// sends one registration: a candidate held elsewhere is given back or skipped, and the
// claim comes back for the next (skip).
func (h *Handler) allocate(ctx context.Context, address *ipamv1.IPAddress) outcome {
	reg, err := record.OnClaim(h.claim.Annotations)
	if err != nil {
		return failed(ipamv1.IPAddressClaimReadyAllocationFailedReason, err.Error()+"; remove the annotation to start over").final()
	}
	if reg == nil {
		if reg, err = h.desired(ctx); err != nil {
			return asOutcome(err)
		}
	}
	h.answeredIfBound(reg)
	subnetMode := h.pool.PoolSpec().Subnet != ""
	var api ipamapi.Client
	var sec *registrar.Secret
	var o *outcome
	switch {
	case reg.Phase == record.PhaseDeclining:
		if api, sec, o = h.connect(ctx, reg); o != nil {
			return *o
		}
		return h.decline(ctx, api, sec, reg)
	case reg.Phase == record.PhaseRegistered:
		// Its IPAddress was lost, or the claim was restored or moved without it: sent again
		// with its address. Without one, a subnet's claim cannot know which it had.
		if subnetMode && reg.Address == "" {
			return lostAddress(reg, "its IPAddress was lost, and its record names no address").final()
		}
		if err := h.settleRotation(ctx, reg, reg.RotatingTo, false); err != nil {
			return transient(err)
		}
		reg.RotatingTo = record.ObjectRef{}
	case subnetMode:
		if api, sec, o = h.subnetCandidate(ctx, reg); o != nil {
			return *o
		}
	case reg.Address == "":
		addr, err := h.takeOver(ctx, reg)
		if err != nil {
			return transient(err)
		}
		reg.Address = addr
	}
	if o := h.checkIdentityFree(ctx, reg); o != nil {
		return *o
	}
	if o := h.checkShare(ctx, reg); o != nil {
		return *o
	}
	// Two requests of one identity without an address in flight at once would each
	// allocate one; in subnet mode, an address must not meet an earlier request of the
	// identity for another one either. A request for the same address may meet one, but
	// the claim's record then no longer shows the earlier one, and the claim's release,
	// once the later one is answered, would not wait for it: carried out after the
	// release, it would hold the address again for good. So an earlier request of the
	// claim is waited out whatever it asked for. Nor may any request meet one of another
	// claim with the same identity (a Service's claim before a move) that may still be
	// carried out.
	own := reg.Phase != record.PhaseRegistered
	if left, err := h.mayStillBeInFlight(ctx, reg, own, false); err != nil {
		return transient(err)
	} else if left > 0 {
		what := "request"
		if reg.Address != "" {
			what = "of " + reg.Address
		}
		return failed(ipamv1.IPAddressClaimReadyAllocationFailedReason, fmt.Sprintf("an earlier registration %s may still be in "+
			"flight in the IPAM-API; the next is sent after %s", what, h.after(left))).retryIn(left)
	}
	if api == nil {
		if api, sec, o = h.connect(ctx, reg); o != nil {
			return *o
		}
	}
	firstAttempt := reg.Attempt.IsZero() // the attempt time is set only when a request is sent
	if o := h.writePending(ctx, reg, sec); o != nil {
		return *o
	}
	res, err := h.InFlight.Register(ctx, api, h.claim.UID, reg, reg.Request(sec.Value))
	candidate := reg.Phase == record.PhaseCandidate
	switch {
	case err == nil && res.Updated() && candidate:
		// Held already, by another holder of the same secret or by this claim after a lost
		// answer; nothing tells which. Two nodes must never share an address: give it back (a
		// lost answer costs a candidate).
		return h.decline(ctx, api, sec, reg)
	case err == nil:
		return h.registered(ctx, address, reg, res)
	case h.everBound() && ipamapi.ClassOf(err) == ipamapi.ClassWrongSecret:
		return h.refuse(ctx, lostAddress(reg, fmt.Sprintf("its IPAddress was lost, and the IPAM-API no longer holds %s for it: it is "+
			"held under another secret now", reg.Address)), valueKey(reg.Secret, sec, nil), reg, false)
	case candidate && ipamapi.ClassOf(err) == ipamapi.ClassWrongSecret:
		return h.skip(ctx, reg)
	case candidate && ipamapi.ClassOf(err) == ipamapi.ClassNotInZone:
		// A pool error, shown on the pool too.
		spec := h.pool.PoolSpec()
		return h.refuse(ctx, failed(ipamv1alpha1.ClaimReadySubnetOutsideZoneReason, fmt.Sprintf("the IPAM-API says %s of subnet %s "+
			"is not in zone %s: the pool's subnet lies outside its zone; fix spec.subnet or spec.zone of %s %s", reg.Address, spec.Subnet,
			reg.Zone, h.claim.Spec.PoolRef.Kind, h.pool.GetName())), valueKey(reg.Secret, sec, nil), reg, true)
	}
	return h.registerFailed(ctx, reg, sec, err, firstAttempt)
}

// mayStillBeInFlight is how long a registration of reg's identity may still be carried out
// (0: none may), sent by this process or met on a record: this claim's own (if own), and that
// of every other unbound claim with the same identity whose record names a request for any
// address, or, releasing, for reg's address. The IPAM-API does not serialise the requests of
// one identity: one that allocates an address meeting another leaves the identity holding an
// address no record names, and one of the released address carried out after the release
// holds it again for good.
func (h *Handler) mayStillBeInFlight(ctx context.Context, reg *record.Registration, own, releasing bool) (time.Duration, error) {
	left := time.Duration(0)
	if own {
		left = h.InFlight.Wait(h.claim.UID, reg, true)
	}
	claims := &ipamv1.IPAddressClaimList{}
	if err := index.ListByRegistration(ctx, h.Client, claims, reg.Key()); err != nil {
		return 0, errors.Wrap(err, "listing IPAddressClaims by registration")
	}
	for _, c := range claims.Items {
		// Only a request that named no address can allocate one the identity then holds
		// unrecorded, or one of the released address hold it again; a claim once bound has
		// had the answer to it.
		if other, err := record.OnClaim(c.Annotations); c.UID != h.claim.UID && err == nil && other != nil && other.Key() == reg.Key() &&
			!other.Attempt.IsZero() && (other.Address == "" || releasing && other.Address == reg.Address) && c.Status.AddressRef.Name == "" {
			left = max(left, h.InFlight.Wait(c.UID, other, true))
		}
	}
	return left, nil
}

// answeredIfBound makes the record of a claim once bound Registered, whatever phase it was
// written in: the IPAddress took the record over when it was made from an answer.
func (h *Handler) answeredIfBound(reg *record.Registration) {
	if h.everBound() {
		reg.Phase = record.PhaseRegistered
	}
}

// everBound reports whether the claim was ever bound: addressRef is set only once its
// IPAddress was made from an answer, and never cleared.
func (h *Handler) everBound() bool { return h.claim.Status.AddressRef.Name != "" }

// subnetCandidate readies a subnet-mode registration that is not registered yet: the address
// the user asked for must be usable in the subnet; without an address the next one is picked,
// once the IPAM-API client and the Secret are resolved (returned; nil for an address the user
// asked for).
func (h *Handler) subnetCandidate(ctx context.Context, reg *record.Registration) (ipamapi.Client, *registrar.Secret, *outcome) {
	spec := h.pool.PoolSpec()
	plan, err := subnet.New(spec.Subnet, spec.Gateway, spec.ExcludedAddresses)
	if err != nil {
		return nil, nil, stop(failed(ipamv1.IPAddressClaimReadyPoolNotReadyReason, err.Error()+"; fix the pool's spec.subnet").final())
	}
	if reg.Address != "" && !reg.Picked() {
		// Asked for by the user: checked as in routed mode, then sent.
		if a, err := ipamapi.ParseHost(reg.Address); err != nil || !plan.Usable(a) {
			return nil, nil, stop(asOutcome(invalidAnnotation(ipamv1alpha1.AddressesAnnotation, "%s is not a usable address of subnet %s "+
				"(network, broadcast, gateway and excluded addresses are not)", reg.Address, spec.Subnet)))
		}
		return nil, nil, nil
	}
	api, sec, o := h.connect(ctx, reg)
	if o == nil && reg.Address == "" {
		o = h.pick(ctx, plan, reg)
	}
	return api, sec, o
}

// lostAddress is the outcome of a claim once bound that cannot have its address back: it
// takes no other, for its machine may use the one it had, and in subnet mode it would take
// a candidate held under the same secret by someone else as its own.
func lostAddress(reg *record.Registration, why string) outcome {
	return failed(ipamv1alpha1.ClaimReadyAddressTakenReason, fmt.Sprintf("%s (zone %s). The claim takes no other address, "+
		"as its machine may use the one it had: delete the claim (and its machine) to get a new one", why, reg.Zone))
}

// connect resolves the IPAM-API client and the owning Secret of an unbound claim's
// registration. A refusal recorded for the same inputs stops here.
func (h *Handler) connect(ctx context.Context, reg *record.Registration) (ipamapi.Client, *registrar.Secret, *outcome) {
	api, err := h.APIToRegister(ctx, reg)
	if errors.Is(err, registrar.ErrCABundleNotProtected) {
		// The CA bundle protector protects it a moment after its pool appears.
		return nil, nil, stop(transient(err).retryIn(protectionRecheck))
	}
	if err != nil {
		return nil, nil, stop(asOutcome(err))
	}
	sec, err := h.Secrets.Get(ctx, reg.Secret, true)
	version := valueKey(reg.Secret, sec, err)
	if h.refusedBefore(reg, version) {
		return nil, nil, stop(h.waitForChange())
	}
	var nf *registrar.SecretNotFoundError
	var inv *registrar.SecretInvalidError
	var refused outcome
	switch {
	case errors.As(err, &nf):
		msg := nf.Error()
		if nf.Hint == "" {
			msg = fmt.Sprintf("%s: create it (type Opaque, key %q), or change the %s annotation or the pool's secretRef",
				msg, nf.Ref.Key, ipamv1alpha1.SecretAnnotation)
		}
		refused = failed(ipamv1alpha1.ClaimReadySecretNotFoundReason, msg)
	case errors.As(err, &inv):
		refused = failed(ipamv1alpha1.ClaimReadySecretInvalidReason, inv.Error())
	case err != nil:
		return nil, nil, stop(transient(err))
	case sec.Deleting:
		refused = failed(ipamv1alpha1.ClaimReadySecretDeletingReason, fmt.Sprintf("Secret %s/%s is being deleted: no new address is "+
			"registered under it (those registered keep it until they are released); point the claim at another Secret, "+
			"or create the Secret again once it is gone", sec.Ref.Namespace, sec.Ref.Name))
	case sec.Changed():
		refused = secretChanged(sec)
	default:
		return api, sec, nil
	}
	return nil, nil, stop(h.refuse(ctx, refused, version, reg, false))
}

func secretChanged(sec *registrar.Secret) outcome {
	return failed(ipamv1alpha1.ClaimReadySecretValueChangedReason, fmt.Sprintf("the value of Secret %s/%s key %s changed after it was "+
		"fingerprinted (when a pool or a claim first named it), and addresses registered under the old value would no longer be known "+
		"by it: restore the previous value; to use another value, put it in a new Secret and point the pool or the claims at it (the "+
		"provider rotates registered addresses)", sec.Ref.Namespace, sec.Ref.Name, sec.Ref.Key))
}

// writePending records the registration with a new attempt time, under a Secret that is
// ready for it. A Secret the claim's record names for the first time, or one not ready
// (not yet protected, or being let go by the Secret protector), is protected once the
// record names it (protect): a record not ready to be sent is written first as it is,
// then again with its attempt time.
//
// A record's attempt time is set only when a request goes out under it: a record
// without one was never sent, so the first answer to it is known to be the first (a
// "no prefixes" then proves nothing is held), and a claim deleted meanwhile has
// nothing to release.
func (h *Handler) writePending(ctx context.Context, reg *record.Registration, sec *registrar.Secret) *outcome {
	// Each request goes out under an attempt time of its own, recorded first; a refusal
	// noted before is for other inputs.
	attempt := func() *outcome {
		reg.Attempt = h.InFlight.AttemptTime()
		h.refusals.Delete(h.claimKey())
		if err := h.writeRecord(ctx, reg); err != nil {
			return stop(transient(err))
		}
		return nil
	}
	prev, _ := record.OnClaim(h.written.Annotations)
	named := prev != nil && prev.Secret.Equal(reg.Secret)
	if sec.Usable(false) {
		if o := attempt(); o != nil || named {
			return o
		}
	} else if !h.recordWritten(reg) {
		if err := h.writeRecord(ctx, reg); err != nil {
			return stop(transient(err))
		}
	}
	// The Secret protector lets a Secret go only after a last, uncached look for records
	// (two-phase: see SecretLettingGoAnnotation): the record that names the Secret is
	// written before this last read (and write) of the Secret, so that either it sees the
	// protector letting the Secret go and takes it back, or the protector's look sees the
	// record.
	if o := h.protect(ctx, reg.Secret, sec); o != nil {
		return o
	}
	if !sec.Usable(false) {
		return attempt()
	}
	return nil
}

// recordWritten reports whether the claim already has this very record, with its
// finalizer: then nothing is written.
func (h *Handler) recordWritten(reg *record.Registration) bool {
	if !controllerutil.ContainsFinalizer(h.written, ipamutil.ReleaseAddressFinalizer) {
		return false
	}
	want := &ipamv1.IPAddressClaim{}
	reg.SetOn(want)
	return h.written.Annotations[ipamv1alpha1.RegistrationAnnotation] == want.Annotations[ipamv1alpha1.RegistrationAnnotation]
}

// registered completes the claim's record and the IPAddress from a successful answer:
// the claim is Ready in the same reconcile that creates its IPAddress.
func (h *Handler) registered(ctx context.Context, address *ipamv1.IPAddress, reg *record.Registration, res *ipamapi.Response) outcome {
	host, err := ipamapi.ParseHost(res.Address)
	if err != nil || ipamapi.FamilyOf(host) != reg.Family {
		return failed(ipamv1.IPAddressClaimReadyAllocationFailedReason,
			fmt.Sprintf("the IPAM-API answered with %q, which is not an %s address", res.Address, reg.Family))
	}
	asked := reg.Address
	reg.Address, _ = ipamapi.CanonicalCIDR(res.Address)
	reg.Phase = record.PhaseRegistered
	if res.Updated() {
		// The address was in the IPAM-API already: whoever else in the cluster holds it
		// must have consented. If not, the claim records what it holds (so it is released
		// as registered, and waits without asking the IPAM-API again) and waits.
		if o := h.heldForUs(ctx, reg); o != nil {
			if err := h.writeRecord(ctx, reg); err != nil {
				return transient(err)
			}
			return *o
		}
	}
	// The claim keeps its pending record: the IPAddress records the registration from
	// now on (a claim is bound with three writes). Should the IPAddress not be created,
	// the pending record is sent again, and the IPAM-API answers with the same address.
	h.fillAddress(address, reg, host)
	ctrl.LoggerFrom(ctx).V(2).Info("Registered address in the IPAM-API", "address", address.Spec.Address,
		"zone", reg.Zone, "updated", res.Updated())
	done := allocated(address.Spec.Address)
	if res.Updated() && asked == "" {
		// Asked for any address, given one the identity held already: say which and why.
		done = done.note(corev1.EventTypeNormal, ipamv1alpha1.EventAddressReturnedReason, actionAllocate, fmt.Sprintf("the IPAM-API "+
			"gave back %s, which it already held for this claim's IPAM-API identity (service %s): kept by a retention after an "+
			"earlier claim of the identity was released, or registered by an earlier request of this claim whose answer was lost",
			address.Spec.Address, reg.Identity.ServiceName))
	}
	return done
}

// fillAddress writes the allocated address and the registration record into the
// IPAddress that ipamutil creates.
func (h *Handler) fillAddress(address *ipamv1.IPAddress, reg *record.Registration, host netip.Addr) {
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
	reg.WriteTo(address.Labels, address.Annotations)
}

// registerFailed turns a failed registration into the claim's outcome. Answers only a
// user can fix are refused for good: recorded with a digest of their inputs, not sent
// again until the claim, its pool or its Secret changes.
func (h *Handler) registerFailed(ctx context.Context, reg *record.Registration, sec *registrar.Secret, err error, firstAttempt bool) outcome {
	msg := err.Error()
	// A refusal in validation (before any lookup) proves that nothing is held only when no
	// request was sent under the record before: an earlier one may have been carried out.
	nothingHeld := provesNothingHeld(err) || firstAttempt && (ipamapi.ClassOf(err) == ipamapi.ClassValidation || ipamapi.ClassOf(err) == ipamapi.ClassNoPrefixes)
	refuse := func(o outcome) outcome { return h.refuse(ctx, o, valueKey(reg.Secret, sec, nil), reg, nothingHeld) }
	if lacks, passes, ok := ipamapi.ZoneGone(err, reg.Zone, reg.Family); ok && ipamv1alpha1.WorkedBefore(h.pool) {
		return failed(ipamv1alpha1.ClaimReadyBackendFailingReason, fmt.Sprintf("the IPAM-API at %s %s although the pool worked before (%s): "+
			"%s; retrying with back-off", reg.Endpoint, lacks, passes, msg))
	}
	switch ipamapi.ClassOf(err) {
	case ipamapi.ClassExhausted:
		o := failed(ipamv1.IPAddressClaimReadyPoolExhaustedReason,
			fmt.Sprintf("zone %s has no free %s address left: %s; the claim is retried with back-off", reg.Zone, reg.Family, msg))
		if nothingHeld && reg.Phase != record.PhaseRegistered { // a fixed annotation, pool or secret is used next time
			if err := h.writeRecord(ctx, nil); err != nil {
				return transient(err)
			}
			h.forget()
		}
		return o
	case ipamapi.ClassValidation:
		return refuse(failed(ipamv1.IPAddressClaimReadyPoolNotReadyReason,
			fmt.Sprintf("the IPAM-API refused the request for zone %s, family %s: %s; fix the pool or the claim's annotations", reg.Zone, reg.Family, msg)))
	case ipamapi.ClassNoPrefixes:
		return refuse(failed(ipamv1.IPAddressClaimReadyPoolNotReadyReason,
			fmt.Sprintf("the IPAM-API has no %s prefixes in zone %s: %s; fix the pool's spec.zone or spec.ipFamily", reg.Family, reg.Zone, msg)))
	case ipamapi.ClassBackendFailing:
		return failed(ipamv1alpha1.ClaimReadyBackendFailingReason, fmt.Sprintf("the IPAM-API at %s answers, but its own backend is failing: %s; "+
			"retrying with back-off", reg.Endpoint, msg))
	case ipamapi.ClassUnexpectedResponse:
		return failed(ipamv1.IPAddressClaimReadyPoolNotReadyReason, fmt.Sprintf("%s is not answering as the IPAM-API: %s", reg.Endpoint, msg))
	case ipamapi.ClassWrongSecret:
		return refuse(failed(ipamv1alpha1.ClaimReadyAddressTakenReason,
			fmt.Sprintf("address %s is held under another secret in zone %s: request another address, or use the secret that owns it", reg.Address, reg.Zone)))
	case ipamapi.ClassNotInZone:
		return refuse(failed(ipamv1alpha1.ClaimReadyAddressNotInZoneReason,
			fmt.Sprintf("address %s does not belong to zone %s: request an address of the zone", reg.Address, reg.Zone)))
	case ipamapi.ClassTransient:
		if e := (*ipamapi.Error)(nil); errors.As(err, &e) && e.NotSent {
			// Held back here, not refused there: the IPAM-API may be fine.
			return failed(ipamv1.IPAddressClaimReadyAllocationFailedReason, fmt.Sprintf("%s; retrying with back-off", msg))
		}
		return failed(ipamv1alpha1.ClaimReadyIPAMAPIUnreachableReason,
			fmt.Sprintf("the IPAM-API at %s could not be reached: %s; retrying with back-off", reg.Endpoint, msg))
	}
	return failed(ipamv1.IPAddressClaimReadyAllocationFailedReason, msg)
}

// provesNothingHeld reports whether a failed registration proves that the identity
// holds nothing under the secret, zone and family: the IPAM-API looked it up and, had it
// held an address, would have answered with it. A validation refusal does not: the
// IPAM-API validates before it looks anything up (and reads the zones from NetBox on
// every request, so a retry can be refused where the first request was carried out).
func provesNothingHeld(err error) bool {
	switch ipamapi.ClassOf(err) {
	case ipamapi.ClassExhausted, ipamapi.ClassWrongSecret, ipamapi.ClassNotInZone:
		var e *ipamapi.Error
		return !errors.As(err, &e) || !e.Unknown
	}
	return false
}
