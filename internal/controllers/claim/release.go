package claim

import (
	"context"
	"fmt"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// release releases what is recorded for a deleted claim, settling a recorded rotation first.
// A Secret whose value changed since registration holds the release: "not held" under the new
// value would abandon the address under the old one.
func (h *Handler) release(ctx context.Context) outcome {
	reg, onAddress, err := h.recorded(ctx)
	if err != nil {
		return releaseFailed(err.Error())
	}
	if reg == nil {
		h.forget()
		return outcome{}
	}
	if reg.Phase != record.PhaseRegistered && reg.Attempt.IsZero() {
		// Nothing was sent under this pending record (or that is settled): nothing is held.
		return h.released(ctx, reg, "Dropped a registration record that was never sent: nothing to release")
	}
	// A claim once bound whose IPAddress went first (as in a namespace's deletion) is released
	// as registered, with retention. A routed-mode record may name no address: sending it
	// again learns it below.
	h.answeredIfBound(reg)
	if _, moving := h.claim.Annotations[clusterctlv1.DeleteForMoveAnnotation]; moving {
		ctrl.LoggerFrom(ctx).V(2).Info("Claim deleted by clusterctl move, keeping its address registered")
		h.forget()
		return outcome{}
	}
	// Nothing goes out, not even a rotation's settling (a registration), while a release an
	// earlier process may have sent, its answer lost, can still be carried out: carried out
	// after the claim is gone, it would free the address of a claim of the same identity
	// made since.
	if left := h.InFlight.MayStillBeReleasing(h.claim.UID); left > 0 {
		return releaseWaits(fmt.Sprintf("a release an earlier manager may have sent may still be carried out in the IPAM-API; "+
			"releasing after %s", h.after(left)), left)
	}
	if cur, _ := record.OnClaim(h.claim.Annotations); cur != nil && reg.Phase == record.PhaseRegistered {
		if err := h.settleRotation(ctx, reg, cur.RotatingTo, true); err != nil {
			return releaseFailed(err.Error())
		}
	}
	// The claim's retention annotation wins: the IPAddress may not show a change made just now.
	if want := *reg; h.overrides(&want) == nil && reg.Phase == record.PhaseRegistered {
		reg.RetentionPeriodDays = want.RetentionPeriodDays
	}
	api, err := h.API(ctx, reg)
	if err != nil {
		return releaseFailed(err.Error())
	}
	sec, err := h.Secrets.Get(ctx, reg.Secret, false)
	var nf *registrar.SecretNotFoundError
	switch {
	case errors.As(err, &nf):
		return releaseFailed(fmt.Sprintf("cannot release the address: %s. Recreate the Secret with the value that owns the address; "+
			"removing the claim's %s finalizer instead abandons the address in the IPAM-API", nf.Error(), "ipam.cluster.x-k8s.io/ReleaseAddress"))
	case err != nil:
		return releaseFailed(err.Error())
	case sec.Changed():
		return releaseWaits(fmt.Sprintf("the value of Secret %s/%s key %s changed since %s was registered under it: restore it, "+
			"and the address is released; releasing with the new value would find nothing and abandon the address", sec.Ref.Namespace,
			sec.Ref.Name, sec.Ref.Key, orPending(reg.Address)), h.secretRecheck())
	case !sec.Usable(true):
		return releaseFailed(fmt.Sprintf("waiting for Secret %s/%s to be fingerprinted by the provider", sec.Ref.Namespace, sec.Ref.Name))
	}

	if reg.Phase != record.PhaseRegistered {
		// Sent, but never answered: the user never saw the address, so it goes without
		// retention.
		reg.RetentionPeriodDays = 0
	}
	// Once the request recorded has certainly ended (see InFlight.Wait): a pending one, one
	// sent to learn the address (below), or a bound claim's later request that its IPAddress
	// does not show answered (without the IPAddress, nothing shows which was).
	left := time.Duration(0)
	if onAddress {
		cur, _ := record.OnClaim(h.claim.Annotations)
		left = h.unanswered(cur, reg)
	}
	left = max(left, h.InFlight.Wait(h.claim.UID, reg, reg.Phase != record.PhaseRegistered || reg.Address == "" || !onAddress))
	if left > 0 {
		return releaseWaits(fmt.Sprintf("an earlier request for the address (a registration, or a release an earlier manager "+
			"sent) may still be carried out in the IPAM-API; releasing after %s", h.after(left)), left)
	}
	if reg.Address == "" {
		// Send it again to learn the address (the IPAM-API returns the held one), recorded
		// first like every registration: should its answer be lost too, the next process
		// waits it out from now, not from the first attempt.
		reg.Attempt = h.InFlight.AttemptTime()
		if err := h.writeRecord(ctx, reg); err != nil {
			return releaseFailed(err.Error())
		}
		res, err := h.InFlight.Register(ctx, api, h.claim.UID, reg, reg.Request(sec.Value))
		switch {
		case err != nil && provesNothingHeld(err):
			return h.released(ctx, reg, "Dropped a registration record: the IPAM-API proved that nothing was held under it")
		case err != nil:
			return releaseFailed(err.Error())
		}
		reg.Address = res.Address
	}

	if other, err := h.namedElsewhere(ctx, reg); err != nil {
		return releaseFailed(err.Error())
	} else if other != "" {
		return h.released(ctx, reg, "Left the registration to another live claim that names it: nothing to release", "claim", other)
	}
	others, err := h.mayStillBeInFlight(ctx, reg, false, true)
	if err != nil {
		return releaseFailed(err.Error())
	}
	if left := max(h.InFlight.Wait(h.claim.UID, reg, false), others); left > 0 {
		return releaseWaits(fmt.Sprintf("an earlier registration of %s may still be in flight in the IPAM-API; releasing after %s",
			orPending(reg.Address), h.after(left)), left)
	}
	if _, err := h.InFlight.Release(ctx, api, h.claim.UID, reg, reg.Request(sec.Value)); err != nil {
		// Under the owning value, "not held" means released already (or by the retention sweeper).
		// A refusal (400) proves nothing: the IPAM-API validates before it looks anything up.
		if !ipamapi.IsNotHeld(err) {
			return releaseFailed(err.Error())
		}
		return h.released(ctx, reg, "The IPAM-API did not hold the address (any more): nothing to release")
	}
	o := h.released(ctx, reg, "Released address in the IPAM-API", "retentionPeriodDays", reg.RetentionPeriodDays)
	switch {
	case reg.RetentionPeriodDays > 0 && h.pool != nil && h.pool.PoolSpec().Subnet != "":
		o = o.note(corev1.EventTypeNormal, ipamv1alpha1.EventReleasedReason, actionRelease, fmt.Sprintf("Released %s in zone %s; the IPAM-API keeps it "+
			"for this identity for %d days and allocates it to no one else. A subnet-mode pool does not give it back to a claim of the "+
			"same name: that claim takes the next free address of the subnet, and %s is free once the retention ends", reg.Address, reg.Zone,
			reg.RetentionPeriodDays, reg.Address))
	case reg.RetentionPeriodDays > 0:
		// The address is not free yet: say for how long the IPAM-API keeps it.
		o = o.note(corev1.EventTypeNormal, ipamv1alpha1.EventReleasedReason, actionRelease, fmt.Sprintf("Released %s in zone %s; the IPAM-API keeps it "+
			"for this identity for %d days: a claim with the same identity gets it back, and the IPAM-API allocates it to no one "+
			"else (a claim that asks for it by name under the same secret can still join it)", reg.Address, reg.Zone, reg.RetentionPeriodDays))
	}
	return o
}

func orPending(a string) string {
	if a == "" {
		return "the pending registration"
	}
	return a
}

func releaseFailed(msg string) outcome {
	return failed(ipamv1alpha1.ClaimReadyReleaseFailedReason, "releasing the address failed, retrying with back-off: "+msg).releasing()
}

// releaseWaits is a release waiting for something whose end is known: no back-off.
func releaseWaits(msg string, d time.Duration) outcome {
	return failed(ipamv1alpha1.ClaimReadyReleaseFailedReason, "releasing the address waits: "+msg).releasing().retryIn(d)
}

// released finishes a release, logging msg: the record goes, and the Reconciler removes the
// finalizer in the same patch. No event (the claim is gone a moment later), unless the caller
// adds one: retention keeps the address.
func (h *Handler) released(ctx context.Context, reg *record.Registration, msg string, kv ...any) outcome {
	record.Remove(h.claim)
	h.forget()
	ctrl.LoggerFrom(ctx).V(2).Info(msg, append([]any{"address", reg.Address}, kv...)...)
	return outcome{}
}

// recorded is what was registered for the claim: the IPAddress's record (onAddress), else the
// claim's.
func (h *Handler) recorded(ctx context.Context) (reg *record.Registration, onAddress bool, err error) {
	addr := &ipamv1.IPAddress{}
	err = h.Client.Get(ctx, client.ObjectKeyFromObject(h.claim), addr)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, false, errors.Wrap(err, "reading the claim's IPAddress")
	}
	if err == nil && metav1.IsControlledBy(addr, h.claim) {
		reg, err := record.OnAddress(addr.Labels, addr.Annotations)
		if err != nil || reg != nil {
			return reg, true, err
		}
	}
	reg, err = record.OnClaim(h.claim.Annotations)
	return reg, false, err
}
