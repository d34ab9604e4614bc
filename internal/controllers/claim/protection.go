package claim

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/pkg/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/note"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// awaitProtection lets a claim without a record wait for its Secret to be protected
// (nothing is registered under a Secret before the Secret protector has added its
// finalizer and the fingerprint of its value) without writing anything, when another
// claim's record names the Secret key already, or another claim of this process is
// writing the first such record (so its protection is under way): a burst of new
// claims under a new Secret then writes each pending record once, with its attempt
// time, instead of once to name the Secret and again to send. The protector wakes the
// claim; nil: the claim writes its own record, which asks for the protection.
func (h *Handler) awaitProtection(ctx context.Context, sec *registrar.Secret) *outcome {
	if !h.namedByAnother(ctx, sec.Ref) && !h.Secrets.Protected.RecordedByAnother(sec.Ref, h.claim.UID) {
		return nil
	}
	// Nothing of this reconcile is written, not even a new finalizer: the claim has
	// sent nothing and holds nothing, here or in the IPAM-API.
	h.claim.Finalizers = slices.Clone(h.written.Finalizers)
	h.forgetSends()
	o := h.await(sec, fmt.Sprintf("waiting for Secret %s/%s to be protected (finalizer %s), which another claim has asked for, "+
		"before anything is registered under it", sec.Ref.Namespace, sec.Ref.Name, ipamv1alpha1.SecretInUseFinalizer))
	return &o
}

// await makes the claim one that the Secret protector wakes when it has protected the
// Secret key, and asks it to look. The claim comes back at once if that happened since
// the Secret was read, else after protectionRecheck should no wake come (later, less
// often); it writes nothing more, and logs why at V(1), not as a reconcile error. A
// wait is no condition (the protector protects a Secret within moments, and a
// burst under a new Secret writes nothing more) until claims have waited
// protectionQuiet for the Secret: then the claim is Ready=False SecretNotProtected,
// with the protector's last error at that moment. The condition then stays as it is while the claim waits (one status
// patch and one event, not one per change of the error).
func (h *Handler) await(sec *registrar.Secret, why string) outcome {
	o := transient(errors.New(why))
	waited, protected := h.Secrets.Protected.Await(sec.Ref, client.ObjectKeyFromObject(h.claim))
	if protected {
		return o.retryIn(0)
	}
	if waited < protectionQuiet {
		return o.retryIn(protectionRecheck)
	}
	// Then the claim looks again less often the longer claims have waited (at most once
	// a minute, as a failing claim): a Secret the protector cannot protect does not make
	// every waiting claim read it every few seconds for ever.
	o = o.retryIn(min(max(protectionRecheck, waited/2), backoffMax))
	msg := o.err.Error() + "; the Secret protector has not done so yet, its log says why"
	if c := conditions.Get(h.claim, ipamv1.IPAddressClaimReadyCondition); c != nil &&
		c.Status == metav1.ConditionFalse && c.Reason == ipamv1alpha1.ClaimReadySecretNotProtectedReason {
		msg = c.Message
	} else if err := h.Secrets.Protected.Failure(sec.Ref.ObjectKey()); err != nil {
		msg = o.err.Error() + "; the Secret protector failed: " + note.Truncate(err.Error(), maxErrorInMessage)
	}
	w := failed(ipamv1alpha1.ClaimReadySecretNotProtectedReason, msg)
	o.ready, o.reason, o.message, o.action = w.ready, w.reason, w.message, w.action
	return o
}

// maxErrorInMessage bounds the part of a condition's message that another component
// wrote (an admission webhook's refusal, say): a condition's message may have 32,768
// characters at most.
const maxErrorInMessage = 1024

const (
	// protectionQuiet is how long claims wait for their Secret's protection before they
	// say so in their Ready condition.
	protectionQuiet = 8 * time.Second
	// protectionRecheck brings a waiting claim back should the protector's wake not come
	// (it failed, say): the Secret is read again, and asked for again.
	protectionRecheck = 2 * time.Second
)

// namedByAnother reports whether the record of another claim in the cache names the
// Secret key (the first few claims that name the Secret are looked at; a lookup that
// fails counts as none).
func (h *Handler) namedByAnother(ctx context.Context, ref record.ObjectRef) bool {
	claims := &ipamv1.IPAddressClaimList{}
	if err := h.Client.List(ctx, claims, client.MatchingFields{index.ClaimSecret: index.SecretValue(ref)},
		client.Limit(64), client.UnsafeDisableDeepCopy); err != nil {
		return false
	}
	for i := range claims.Items {
		if c := &claims.Items[i]; c.UID != h.claim.UID {
			if reg, err := record.OnClaim(c.Annotations); err == nil && reg != nil && slices.ContainsFunc(reg.Secrets(), ref.Equal) {
				return true
			}
		}
	}
	return false
}
