package claim

import (
	"context"
	"fmt"
	"maps"
	"strings"

	"github.com/pkg/errors"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
)

// Handler is this provider's ipamutil.ClaimHandler: one reconcile of one IPAddressClaim, with
// the claim as it is being changed, as it was read and last written, and its pool.
type Handler struct {
	*Reconciler
	claim *ipamv1.IPAddressClaim
	pool  ipamv1alpha1.Pool
	// read is the claim as ipamutil's loop read it, and its patch helper has it.
	read *ipamv1.IPAddressClaim
	// written is the claim as the API server has it after the handler's own writes.
	written *ipamv1.IPAddressClaim
	// writtenVersion is the claim's version after the last write ("": none); awaited in the cache.
	writtenVersion string
	// creating: the claim has no IPAddress yet, so a wait must be an error (see waiting).
	creating bool
}

// forget drops the claim's reservations (its subnet candidate among them) and seen answers:
// it is bound, released, gone, or holds nothing.
func (h *Handler) forget() { h.InFlight.Forget(h.claim.UID) }

// writeRecord saves the claim's record (nil: removes it) now, in one patch with the rest
// of the unwritten metadata, such as a new claim's finalizer. On failure the claim's
// annotations stay as they were.
func (h *Handler) writeRecord(ctx context.Context, reg *record.Registration) error {
	before := maps.Clone(h.claim.Annotations)
	if reg != nil {
		reg.SetOn(h.claim)
	} else {
		record.Remove(h.claim)
	}
	if err := h.patchMetadata(ctx); err != nil {
		h.claim.Annotations = before
		return errors.Wrap(err, "recording the registration on the claim")
	}
	return nil
}

// errPoolNotCached: the pool exists, but the manager's cache has not seen it yet.
var errPoolNotCached = errors.New("the pool is not in the cache yet")

// fetchPool reads the claim's pool from the cache. A deleted claim whose pool is not
// found (or not read) gets NotFound: its release needs no pool.
func (h *Handler) fetchPool(ctx context.Context) (ipamv1alpha1.Pool, error) {
	ref := h.claim.Spec.PoolRef
	pool, key := ipamv1alpha1.Pool(&ipamv1alpha1.GlobalVitistackIPPool{}), types.NamespacedName{Name: ref.Name}
	if ref.Kind == ipamv1alpha1.VitistackIPPoolKind {
		pool, key.Namespace = &ipamv1alpha1.VitistackIPPool{}, h.claim.Namespace
	}
	if err := h.Client.Get(ctx, key, pool); err != nil {
		if !h.claim.DeletionTimestamp.IsZero() {
			return nil, apierrors.NewNotFound(ipamv1alpha1.GroupVersion.WithResource(strings.ToLower(ref.Kind)+"s").GroupResource(), ref.Name)
		}
		if apierrors.IsNotFound(err) && h.Reader != nil && h.Reader.Get(ctx, key, pool) == nil {
			// Created moments ago, not cached yet: its watch brings the claim back; no Warning.
			return nil, errPoolNotCached
		}
		if apierrors.IsNotFound(err) {
			_, _ = h.report(ctx, failed(ipamv1.IPAddressClaimReadyPoolNotReadyReason,
				fmt.Sprintf("%s %q not found: create it, or point spec.poolRef at an existing pool", ref.Kind, ref.Name)))
		}
		return nil, err
	}
	pool.GetObjectKind().SetGroupVersionKind(ipamv1alpha1.GroupVersion.WithKind(ref.Kind))
	h.pool = pool
	return pool, nil
}
