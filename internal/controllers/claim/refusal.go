package claim

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/pkg/errors"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// refuse records a refusal (by the IPAM-API or the Secret) only a user can fix, and waits for
// the claim, its pool or its Secret to change (see Config.SecretRecheckInterval).
func (h *Handler) refuse(ctx context.Context, o outcome, secretVersion string, reg *record.Registration, nothingHeld bool) outcome {
	// Kept while it may name something held: a registered address, or an unsettled attempt.
	keep := reg
	if reg.Phase != record.PhaseRegistered && (nothingHeld || reg.Attempt.IsZero()) {
		keep = nil
	}
	digest := h.inputs(reg, secretVersion)
	if err := h.writeRecord(ctx, keep, map[string]*string{ipamv1alpha1.RefusedInputsAnnotation: &digest}); err != nil {
		return transient(err)
	}
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

// refusedBefore reports whether the claim was refused for exactly these inputs, its Secret's
// value (secret: valueKey) among them. The digest is keyed with this process's refusalKey, so
// after a restart a refused claim is sent once more, then not again until something changes.
func (h *Handler) refusedBefore(reg *record.Registration, secret string) bool {
	v := h.claim.Annotations[ipamv1alpha1.RefusedInputsAnnotation]
	return v != "" && v == h.inputs(reg, secret)
}

// inputs is a digest of what a refusal depends on: the refused request (identity, Secret, and
// the address unless picked), what the Secret said (secret: valueKey), the claim's generation
// and annotations, its pool and the manager's settings. The request counts itself: a pending
// record made before a user's change is sent once more, and its refusal must not stand for the
// changed request. The digest is an HMAC with a key of this process (refusalKey): it goes on
// the claim, whose readers may not read the Secret, and must not let them test guesses of it.
func (h *Handler) inputs(reg *record.Registration, secret string) string {
	d := hmac.New(sha256.New, h.refusalKey())
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
	return hex.EncodeToString(d.Sum(nil)[:12])
}

// valueKey identifies what a Secret said when read (it goes on an object only keyed, see
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
