package claim

import (
	"context"
	"fmt"
	"time"

	"github.com/pkg/errors"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/note"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

const (
	// protectionRecheck brings a claim back whose Secret or CA bundle changed under it
	// while it was being protected (the CA bundle protector protects a bundle a moment
	// after its pool appears).
	protectionRecheck = 2 * time.Second
	// maxErrorInMessage bounds the part of a condition's message that another component
	// wrote (an admission webhook's refusal, say): a condition's message may have
	// 32,768 characters at most.
	maxErrorInMessage = 1024
)

// protect makes the Secret that reg names ready for registrations once the claim's record
// names it (registrar.Secrets.Protect), and checks that it still has the value sec read.
// A Secret that went, or changed, meanwhile brings the claim back soon, and its next read
// says why; one that cannot be protected (a policy refuses its finalizer, say) is
// notProtected.
func (h *Handler) protect(ctx context.Context, ref record.ObjectRef, sec *registrar.Secret) *outcome {
	again, err := h.Secrets.Protect(ctx, ref)
	var nf *registrar.SecretNotFoundError
	var inv *registrar.SecretInvalidError
	switch {
	case errors.As(err, &nf) || errors.As(err, &inv) || apierrors.IsConflict(err) ||
		err == nil && (!again.Usable(false) || again.Value != sec.Value):
		return stop(transient(errors.Errorf("Secret %s/%s changed while it was being protected; reading it again",
			ref.Namespace, ref.Name)).retryIn(protectionRecheck))
	case err != nil:
		return stop(h.notProtected(ref, err))
	}
	return nil
}

// notProtected is the outcome of a claim whose Secret cannot be given its finalizer and
// fingerprint: nothing is sent under it. The claim says why in its Ready condition and one
// event (the error has the Secret's values cut out), keeps that message while it goes on
// failing (an error that changes writes nothing more), and tries again with back-off.
func (h *Handler) notProtected(ref record.ObjectRef, err error) outcome {
	msg := fmt.Sprintf("cannot protect Secret %s/%s (finalizer %s) before anything is registered under it: %s", ref.Namespace, ref.Name,
		ipamv1alpha1.SecretInUseFinalizer, note.Truncate(err.Error(), maxErrorInMessage))
	if c := conditions.Get(h.claim, ipamv1.IPAddressClaimReadyCondition); c != nil &&
		c.Status == metav1.ConditionFalse && c.Reason == ipamv1alpha1.ClaimReadySecretNotProtectedReason {
		msg = c.Message
	}
	return failed(ipamv1alpha1.ClaimReadySecretNotProtectedReason, msg)
}
