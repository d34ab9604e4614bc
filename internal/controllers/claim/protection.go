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

// awaitProtection is the outcome of a claim whose Secret is not protected yet, its
// pending record written (which asks the protector for the protection): nothing is
// sent under the Secret until the protector has added its finalizer and the
// fingerprint of its value. The protector wakes the claim when it has (it finds it by
// its record); the claim also looks again, and asks the protector again, every
// protectionRecheck. While the protector's last look at the Secret failed, it looks
// again after half its age (at most backoffMax), so a Secret that cannot be protected
// is not read every few seconds for ever; and a claim older than protectionQuiet is
// Ready=False SecretNotProtected with the protector's error. The condition then stays
// as it is while the claim waits (one status patch and one event, not one per change
// of the error). Waiting is never a reconcile error.
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
