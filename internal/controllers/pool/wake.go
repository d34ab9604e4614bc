package pool

import (
	"context"

	"github.com/pkg/errors"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// wakeWaiting wakes the claims that found no room in the subnet-mode pools of a
// subnet-mode pool's zone, when its count of addresses in use fell (or is seen for the
// first time by this process): addresses went, and there may be room. It runs in the
// pool's reconcile, at most once a second per pool; live, unbound claims only (the
// index holds no others), through the claim controller's wake channel.
func (r *Reconciler) wakeWaiting(ctx context.Context, pool ipamv1alpha1.Pool, inUse int32) error {
	key := client.ObjectKeyFromObject(pool)
	r.mu.Lock()
	last, seen := r.inUse[key]
	r.inUse[key] = inUse
	r.mu.Unlock()
	spec := pool.PoolSpec()
	if spec.Subnet == "" || seen && inUse >= last {
		return nil
	}
	local := &ipamv1alpha1.VitistackIPPoolList{}
	global := &ipamv1alpha1.GlobalVitistackIPPoolList{}
	if err := r.Client.List(ctx, local, client.UnsafeDisableDeepCopy); err != nil {
		return errors.Wrap(err, "listing VitistackIPPools")
	}
	if err := r.Client.List(ctx, global, client.UnsafeDisableDeepCopy); err != nil {
		return errors.Wrap(err, "listing GlobalVitistackIPPools")
	}
	var waiting []client.ListOption
	for _, p := range local.Items {
		if p.Spec.Subnet != "" && p.Spec.Zone == spec.Zone {
			waiting = append(waiting, client.MatchingFields{index.ClaimWaiting: index.PoolRefValue(ipamv1alpha1.VitistackIPPoolKind, p.Name)})
		}
	}
	for _, p := range global.Items {
		if p.Spec.Subnet != "" && p.Spec.Zone == spec.Zone {
			waiting = append(waiting, client.MatchingFields{index.ClaimWaiting: index.PoolRefValue(ipamv1alpha1.GlobalVitistackIPPoolKind, p.Name)})
		}
	}
	for _, field := range waiting {
		claims := &ipamv1.IPAddressClaimList{}
		if err := r.Client.List(ctx, claims, field, client.UnsafeDisableDeepCopy); err != nil {
			return errors.Wrap(err, "listing the claims waiting for room")
		}
		if err := registrar.WakeClaims(ctx, r.Wake, claims.Items); err != nil {
			return err
		}
	}
	return nil
}
