package claim

import (
	"fmt"
	"time"

	"github.com/pkg/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/note"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

const (
	// protectionQuiet is how old a claim waiting for its Secret's protection is before
	// it says so in its Ready condition, once the protector has failed: a burst under a
	// new Secret writes no condition and no event.
	protectionQuiet = 8 * time.Second
	// protectionRecheck brings a waiting claim back should the protector's wake not come.
	protectionRecheck = 2 * time.Second
	// maxErrorInMessage bounds the part of a condition's message that another component
	// wrote (an admission webhook's refusal, say): a condition's message may have
	// 32,768 characters at most.
	maxErrorInMessage = 1024
)

// awaitProtection is the wait of a claim whose Secret the protector has not yet given its
// finalizer and the fingerprint of its value: nothing is sent under it before. The protector
// wakes the claim; the claim also asks it again every protectionRecheck, or, while it fails,
// after half the claim's age (at most backoffMax). A claim older than protectionQuiet then says
// SecretNotProtected with the protector's first error (one status patch, one event).
func (h *Handler) awaitProtection(sec *registrar.Secret) outcome {
	secret := sec.Ref.ObjectKey()
	h.Secrets.Protected.AskFor(secret)
	why := fmt.Sprintf("waiting for Secret %s/%s to be protected (finalizer %s) before anything is registered under it",
		sec.Ref.Namespace, sec.Ref.Name, ipamv1alpha1.SecretInUseFinalizer)
	o := transient(errors.New(why)).retryIn(protectionRecheck)
	failure := h.Secrets.Protected.Failure(secret)
	if failure == nil {
		return o
	}
	age := time.Duration(0)
	if created := h.claim.CreationTimestamp; !created.IsZero() {
		age = max(h.InFlight.Now().Sub(created.Time), 0)
	}
	o = o.retryIn(min(max(protectionRecheck, age/2), backoffMax))
	if age < protectionQuiet {
		return o
	}
	msg := why + "; the Secret protector failed: " + note.Truncate(failure.Error(), maxErrorInMessage)
	if c := conditions.Get(h.claim, ipamv1.IPAddressClaimReadyCondition); c != nil &&
		c.Status == metav1.ConditionFalse && c.Reason == ipamv1alpha1.ClaimReadySecretNotProtectedReason {
		msg = c.Message
	}
	w := failed(ipamv1alpha1.ClaimReadySecretNotProtectedReason, msg)
	o.ready, o.reason, o.message, o.action = w.ready, w.reason, w.message, w.action
	return o
}
