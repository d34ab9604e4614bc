package claim

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/pkg/errors"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/ipamutil"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// allocate registers an address for a claim without an IPAddress. What is about to be
// sent is recorded on the claim before it is sent, so a restart at any point finds it,
// waits out a request that may still be in flight, and sends the same registration
// again (the IPAM-API answers with the same address) or releases it on deletion.
func (h *Handler) allocate(ctx context.Context, address *ipamv1.IPAddress) outcome {
	reg, bad := h.claimRecord()
	if bad != nil {
		return *bad
	}
	if reg == nil {
		var err error
		if reg, err = h.desired(ctx); err != nil {
			return asOutcome(err)
		}
	}
	if h.pool.PoolSpec().Subnet != "" && !reg.Registered {
		return h.allocateInSubnet(ctx, address, reg)
	}
	if reg.Address == "" && !reg.Registered {
		addr, err := h.takeOver(ctx, reg)
		if err != nil {
			return transient(err)
		}
		reg.Address = addr
	}
	// A registered record without an IPAddress (it was lost, or the claim was restored
	// or moved without it) is sent again with its address, never without.
	if o := h.checkIdentityFree(ctx, reg); o != nil {
		return *o
	}
	if o := h.checkShare(ctx, reg); o != nil {
		return *o
	}
	// Two requests without an address in flight at once would each allocate one (with
	// an address they name the same one, so only those are held back). A claim that
	// was bound had its request answered.
	if reg.Address == "" {
		if left := h.mayStillBeInFlight(reg); left > 0 {
			return failed(ipamv1.IPAddressClaimReadyAllocationFailedReason,
				fmt.Sprintf("an earlier registration request may still be in flight in the IPAM-API; the next is sent after %s",
					h.after(left))).retryIn(left)
		}
	}
	api, sec, o := h.connect(ctx, reg)
	if o != nil {
		return *o
	}
	s, stop := h.send(ctx, api, sec, reg)
	if stop != nil {
		return *stop
	}
	if s.err != nil {
		return h.registerFailed(ctx, reg, sec, s.err, s.firstAttempt)
	}
	return h.registered(ctx, address, reg, s.res)
}

// connect resolves the IPAM-API client and the owning Secret of an unbound claim's
// registration. A refusal recorded for the same inputs stops here.
func (h *Handler) connect(ctx context.Context, reg *record.Registration) (ipamapi.Client, *registrar.Secret, *outcome) {
	api, err := h.API(ctx, reg)
	if err != nil {
		o := asOutcome(err)
		return nil, nil, &o
	}
	sec, err := h.Secrets.Get(ctx, reg.Secret, true)
	version := valueKey(reg.Secret, sec, err)
	if h.refusedBefore(reg, version) {
		o := h.waitForChange()
		return nil, nil, &o
	}
	var nf *registrar.SecretNotFoundError
	var inv *registrar.SecretInvalidError
	switch {
	case errors.As(err, &nf):
		msg := nf.Error()
		if nf.Hint == "" {
			msg = fmt.Sprintf("%s: create it (type Opaque, key %q), or change the %s annotation or the pool's secretRef",
				msg, nf.Ref.Key, ipamv1alpha1.SecretAnnotation)
		}
		o := h.refuse(ctx, failed(ipamv1alpha1.ClaimReadySecretNotFoundReason, msg), version, reg, false)
		return nil, nil, &o
	case errors.As(err, &inv):
		o := h.refuse(ctx, failed(ipamv1alpha1.ClaimReadySecretInvalidReason, inv.Error()), version, reg, false)
		return nil, nil, &o
	case err != nil:
		o := transient(err)
		return nil, nil, &o
	case sec.Deleting:
		o := h.refuse(ctx, failed(ipamv1.IPAddressClaimReadyAllocationFailedReason, fmt.Sprintf("Secret %s/%s is being deleted: "+
			"no address is registered under it any more; point the claim at another Secret", sec.Ref.Namespace, sec.Ref.Name)).
			withEvent(ipamv1alpha1.ClaimReadySecretNotFoundReason), version, reg, false)
		return nil, nil, &o
	case sec.Changed():
		o := h.refuse(ctx, secretChanged(sec), version, reg, false)
		return nil, nil, &o
	}
	return api, sec, nil
}

func secretChanged(sec *registrar.Secret) outcome {
	return failed(ipamv1alpha1.ClaimReadySecretValueChangedReason, fmt.Sprintf("the value of Secret %s/%s key %s changed after it was "+
		"fingerprinted (when a pool or a claim first named it), and addresses registered under the old value would no longer be known "+
		"by it: restore the previous value; to use another value, put it in a new Secret and point the pool or the claims at it (the "+
		"provider rotates registered addresses)", sec.Ref.Namespace, sec.Ref.Name, sec.Ref.Key))
}

// sent is what became of a registration request.
type sent struct {
	res *ipamapi.Response
	err error
	// firstAttempt is true when no earlier request was ever sent under the record (its
	// attempt time is set only when one is).
	firstAttempt bool
}

// send records the registration as pending and sends it; stop is set when it was not
// sent.
func (h *Handler) send(ctx context.Context, api ipamapi.Client, sec *registrar.Secret, reg *record.Registration) (s sent, stop *outcome) {
	s.firstAttempt = reg.Attempt.IsZero()
	if stop = h.writePending(ctx, reg, sec); stop != nil {
		return s, stop
	}
	s.res, s.err = h.InFlight.Register(ctx, api, h.claim.UID, reg, reg.Request(sec.Value))
	return s, nil
}

// writePending records the registration with a new attempt time, once the Secret it
// names is protected; before that, the record without one, which asks the Secret
// protector for the protection, and the claim waits for it (awaitProtection).
//
// A record's attempt time is set only when a request goes out under it: a record
// without one was never sent, so the first answer to it is known to be the first (a
// "no prefixes" then proves nothing is held), and a claim deleted meanwhile has
// nothing to release.
func (h *Handler) writePending(ctx context.Context, reg *record.Registration, sec *registrar.Secret) *outcome {
	ready, written := sec.Ready(), h.recordWritten(reg)
	if ready && (!written || !h.InFlight.MayResendUnder(h.claim.UID, reg, h.Config.RequestTimeout)) {
		// The request about to go out may not go under the recorded attempt time (which
		// would save a write): its outcome is unknown, or it is too old.
		reg.Attempt, written = h.InFlight.AttemptTime(), false
	}
	if !written {
		if err := h.writeRecord(ctx, reg, map[string]*string{ipamv1alpha1.RefusedInputsAnnotation: nil}); err != nil {
			o := transient(err)
			return &o
		}
	}
	if !ready {
		o := h.awaitProtection(sec)
		return &o
	}
	return nil
}

// recordWritten reports whether the claim already has this very record, with its
// finalizer and without a refusal: then nothing is written.
func (h *Handler) recordWritten(reg *record.Registration) bool {
	if _, refused := h.written.Annotations[ipamv1alpha1.RefusedInputsAnnotation]; refused ||
		!controllerutil.ContainsFinalizer(h.written, ipamutil.ReleaseAddressFinalizer) {
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
	reg.Address, _ = ipamapi.CanonicalCIDR(res.Address)
	reg.Registered, reg.Declined = true, false
	if res.Updated() {
		// The address was in the IPAM-API already: whoever else in the cluster holds it
		// must have consented. If not, the claim records what it holds (so it is released
		// as registered, and waits without asking the IPAM-API again) and waits.
		if o := h.heldForUs(ctx, reg); o != nil {
			reg.Candidate = false
			if err := h.writeRecord(ctx, reg, nil); err != nil {
				return transient(err)
			}
			return *o
		}
	}
	// The claim keeps its pending record: the IPAddress records the registration from
	// now on (a claim is bound with four writes). Should the IPAddress not be created,
	// the pending record is sent again, and the IPAM-API answers with the same address.
	h.fillAddress(address, reg, host)
	ctrl.LoggerFrom(ctx).V(2).Info("Registered address in the IPAM-API", "address", address.Spec.Address,
		"zone", reg.Zone, "updated", res.Updated())
	return allocated(address.Spec.Address)
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
	nothingHeld := provesNothingHeld(err) || firstAttempt && ipamapi.ClassOf(err) == ipamapi.ClassNoPrefixes
	refuse := func(o outcome) outcome { return h.refuse(ctx, o, valueKey(reg.Secret, sec, nil), reg, nothingHeld) }
	switch ipamapi.ClassOf(err) {
	case ipamapi.ClassExhausted:
		o := failed(ipamv1.IPAddressClaimReadyPoolExhaustedReason,
			fmt.Sprintf("zone %s has no free %s address left: %s; the claim is retried with back-off", reg.Zone, reg.Family, msg))
		return h.forgetIfNothingHeld(ctx, o, reg, nothingHeld)
	case ipamapi.ClassValidation:
		return refuse(failed(ipamv1.IPAddressClaimReadyPoolNotReadyReason,
			fmt.Sprintf("the IPAM-API refused the request for zone %s, family %s: %s; fix the pool or the claim's annotations", reg.Zone, reg.Family, msg)))
	case ipamapi.ClassNoPrefixes:
		if ipamv1alpha1.WorkedBefore(h.pool) {
			// The pool worked: the real IPAM-API loads its prefixes after a restart.
			return failed(ipamv1alpha1.ClaimReadyBackendFailingReason, fmt.Sprintf("the IPAM-API at %s has no prefixes for zone %s, family %s "+
				"although the pool worked before (it loads them after a restart): %s; retrying with back-off", reg.Endpoint, reg.Zone, reg.Family, msg))
		}
		return refuse(failed(ipamv1.IPAddressClaimReadyPoolNotReadyReason,
			fmt.Sprintf("the IPAM-API has no %s prefixes in zone %s: %s; fix the pool's spec.zone or spec.ipFamily", reg.Family, reg.Zone, msg)))
	case ipamapi.ClassBackendFailing:
		return failed(ipamv1alpha1.ClaimReadyBackendFailingReason, fmt.Sprintf("the IPAM-API at %s answers, but its own backend is failing: %s; "+
			"retrying with back-off", reg.Endpoint, msg))
	case ipamapi.ClassUnexpectedResponse:
		return failed(ipamv1.IPAddressClaimReadyPoolNotReadyReason, fmt.Sprintf("%s is not answering as the IPAM-API: %s", reg.Endpoint, msg))
	case ipamapi.ClassWrongSecret:
		return refuse(failed(ipamv1.IPAddressClaimReadyAllocationFailedReason,
			fmt.Sprintf("address %s is held under another secret in zone %s: request another address, or use the secret that owns it", reg.Address, reg.Zone)).
			withEvent(ipamv1alpha1.ClaimReadyAddressTakenReason))
	case ipamapi.ClassNotInZone:
		return refuse(failed(ipamv1.IPAddressClaimReadyAllocationFailedReason,
			fmt.Sprintf("address %s does not belong to zone %s: request an address of the zone", reg.Address, reg.Zone)).withEvent(ipamv1alpha1.EventAddressNotInZoneReason))
	case ipamapi.ClassTransient:
		return failed(ipamv1.IPAddressClaimReadyAllocationFailedReason,
			fmt.Sprintf("the IPAM-API at %s could not be reached: %s; retrying with back-off", reg.Endpoint, msg)).
			withEvent(ipamv1alpha1.ClaimReadyIPAMAPIUnreachableReason)
	}
	return failed(ipamv1.IPAddressClaimReadyAllocationFailedReason, msg)
}

// forgetIfNothingHeld drops the claim's record when the answer proves nothing is held,
// so a fixed annotation, pool or secret is used next time, and deleting the claim has
// nothing to release.
func (h *Handler) forgetIfNothingHeld(ctx context.Context, o outcome, reg *record.Registration, nothingHeld bool) outcome {
	if !nothingHeld || reg.Registered {
		return o
	}
	if err := h.writeRecord(ctx, nil, nil); err != nil {
		return transient(err)
	}
	h.forget()
	return o
}

// provesNothingHeld reports whether a failed registration proves that the identity
// holds nothing under the secret, zone and family: had it held an address, the
// IPAM-API would have answered with it.
func provesNothingHeld(err error) bool {
	switch ipamapi.ClassOf(err) {
	case ipamapi.ClassValidation, ipamapi.ClassExhausted, ipamapi.ClassWrongSecret, ipamapi.ClassNotInZone:
		return !unknownOutcome(err)
	}
	return false
}

// unknownOutcome reports whether a request may have been carried out although no
// answer arrived.
func unknownOutcome(err error) bool {
	var e *ipamapi.Error
	return errors.As(err, &e) && e.Unknown
}
