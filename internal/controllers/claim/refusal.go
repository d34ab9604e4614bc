package claim

import (
	"context"
	"crypto/sha256"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/pkg/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// refuse notes a refusal (by the IPAM-API or the Secret) only a user can fix, and waits for
// the claim, its pool or its Secret to change (see Config.SecretRecheckInterval). The record
// is kept while it may name something held (a registered address, or an unsettled attempt),
// else removed; the refusal itself is written nowhere but the claim's condition.
func (h *Handler) refuse(ctx context.Context, o outcome, secretVersion string, reg *record.Registration, nothingHeld bool) outcome {
	keep := reg
	if reg.Phase != record.PhaseRegistered && (nothingHeld || reg.Attempt.IsZero()) {
		keep = nil
	}
	_, recorded := h.claim.Annotations[ipamv1alpha1.RegistrationAnnotation]
	if keep == nil && recorded || keep != nil && !h.recordWritten(keep) {
		if err := h.writeRecord(ctx, keep); err != nil {
			return transient(err)
		}
	}
	h.refusals.Store(h.claimKey(), h.inputs(reg, secretVersion))
	if keep == nil {
		h.forget()
	}
	return o.retryIn(h.secretRecheck())
}

// waitForChange is the outcome of a claim refused before for the same inputs: nothing
// is sent, the condition stays, and the Secret is looked at again later.
func (h *Handler) waitForChange() outcome {
	return outcome{err: errors.New("the IPAM-API refused this claim before for the same claim, pool and Secret; waiting for one of them to change"),
		retry: h.secretRecheck()}
}

func (h *Handler) secretRecheck() time.Duration {
	if d := h.Config.SecretRecheckInterval; d > 0 {
		return d
	}
	return time.Minute
}

// refusedBefore reports whether this process refused the claim for exactly these inputs,
// its Secret's value (secret: valueKey) among them. A new process sends a refused claim
// once more, then not again until something changes.
func (h *Handler) refusedBefore(reg *record.Registration, secret string) bool {
	v, ok := h.refusals.Load(h.claimKey())
	return ok && v == h.inputs(reg, secret)
}

// inputs is a digest of what a refusal depends on: the refused request (identity, Secret, and
// the address unless picked), what the Secret said (secret: valueKey), the claim's generation
// and annotations, its pool and the manager's settings. The request counts itself: a pending
// record made before a user's change is sent once more, and its refusal must not stand for the
// changed request.
func (h *Handler) inputs(reg *record.Registration, secret string) string {
	d := sha256.New()
	add := func(s string) { d.Write([]byte(s)); d.Write([]byte{0}) }
	add(reg.Key())
	add(reg.Secret.String())
	add(secret)
	if !reg.Picked() {
		add(reg.Address)
	}
	add(string(h.claim.UID))
	add(strconv.FormatInt(h.claim.Generation, 10))
	ann := userAnnotations(h.claim)
	for _, k := range slices.Sorted(maps.Keys(ann)) {
		add(k)
		add(ann[k])
	}
	add(string(h.pool.GetUID()))
	add(strconv.FormatInt(h.pool.GetGeneration(), 10))
	// A pool that became Ready again (the IPAM-API fixed or reloaded the zone) is a change.
	add(strconv.FormatBool(poolReady(h.pool)))
	add(h.Config.DefaultEndpoint)
	add(h.Config.ClusterID)
	add(h.Config.DefaultSecret.String())
	return string(d.Sum(nil))
}

// claimKey is the claim's namespace and name.
func (h *Handler) claimKey() types.NamespacedName { return client.ObjectKeyFromObject(h.claim) }

// valueKey identifies what a Secret said when read (it is kept only inside a digest, see
// inputs): its value, or why there was none; the provider's own finalizer and fingerprint do
// not change it.
func valueKey(ref record.ObjectRef, sec *registrar.Secret, err error) string {
	var inv *registrar.SecretInvalidError
	switch {
	case sec != nil:
		return ref.String() + "|" + record.Fingerprint([]byte(sec.Value))
	case errors.As(err, &inv):
		return ref.String() + "|invalid|" + inv.ResourceVersion
	case err != nil:
		return ref.String() + "|absent"
	}
	return ref.String()
}
