package claim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/pkg/errors"
	"k8s.io/apimachinery/pkg/types"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// refuse records that the IPAM-API (or the Secret) refused the claim for a reason only
// a user can fix, and waits for a change: of the claim or its pool (watched), or of
// its Secret (looked at again every SecretRecheckInterval; Secrets are not watched).
func (h *Handler) refuse(ctx context.Context, o outcome, secretVersion string, reg *record.Registration, nothingHeld bool) outcome {
	// Keep the record while it may name something held: a registered address, or an
	// earlier request whose outcome this answer does not settle.
	keep := reg
	if !reg.Registered && (nothingHeld || reg.Attempt.IsZero()) {
		keep = nil
	}
	digest := h.inputs(reg)
	if err := h.writeRecord(ctx, keep, map[string]*string{ipamv1alpha1.RefusedInputsAnnotation: &digest}); err != nil {
		return transient(err)
	}
	if keep == nil {
		h.forgetSends()
	}
	h.refusals.remember(h.claim.UID, secretVersion)
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

// refusedBefore reports whether the claim was refused for exactly these inputs: the
// digest on the claim (its generation and annotations, its pool, the manager's
// settings) and, in this process's memory, the Secret's value. After a restart a
// refused claim is therefore sent once more, never again until something changes.
func (h *Handler) refusedBefore(reg *record.Registration, secret string) bool {
	v := h.claim.Annotations[ipamv1alpha1.RefusedInputsAnnotation]
	return v != "" && v == h.inputs(reg) && h.refusals.same(h.claim.UID, secret)
}

// inputs is a digest of what a refusal depends on, besides the Secret: the request
// that was refused (reg: its holder, Secret, and the address unless the provider
// picked it), the claim's generation and annotations, its pool's generation and the
// manager's settings. The request is part of it because it need not follow from the
// annotations the claim has now: a pending record computed before a user's change is
// sent once more, and its refusal must not stand for the request the change asks for.
func (h *Handler) inputs(reg *record.Registration) string {
	d := sha256.New()
	add := func(s string) { d.Write([]byte(s)); d.Write([]byte{0}) }
	add(reg.Key())
	add(reg.Secret.String())
	if !reg.Candidate {
		add(reg.Address)
	}
	add(string(h.claim.UID))
	add(strconv.FormatInt(h.claim.Generation, 10))
	ann := userAnnotations(h.claim)
	keys := make([]string, 0, len(ann))
	for k := range ann {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
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

// valueKey identifies what a Secret said when it was read (kept in memory only, never
// on an object): its value, or why there was none. The provider's own changes to the
// Secret (finalizer, fingerprint) do not change it.
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

// refusals is, per claim refused for a reason only a user can fix, what its Secret
// said at the time (valueKey). Entries go when the claim binds or goes.
type refusals struct {
	mu sync.Mutex
	m  map[types.UID]string
}

func (r *refusals) remember(uid types.UID, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[types.UID]string{}
	}
	r.m[uid] = key
}

func (r *refusals) same(uid types.UID, key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.m[uid]
	return ok && v == key
}

func (r *refusals) forget(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, uid)
}
