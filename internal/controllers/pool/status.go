package pool

import (
	"context"
	"fmt"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/note"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/subnet"
)

// facts is what the cluster says about a pool.
type facts struct {
	inUse int32
	// outsideZone is a claim that found the subnet outside the zone, and what it says.
	outsideZone *ipamv1.IPAddressClaim
}

func (r *Reconciler) listOptions(pool ipamv1alpha1.Pool, field string) []client.ListOption {
	opts := []client.ListOption{client.MatchingFields{field: index.PoolRefValue(r.Kind, pool.GetName())}}
	if pool.GetNamespace() != "" {
		opts = append(opts, client.InNamespace(pool.GetNamespace()))
	}
	return opts
}

// gather reads the facts from the cache, through indexes.
func (r *Reconciler) gather(ctx context.Context, pool ipamv1alpha1.Pool) (facts, error) {
	var f facts
	n, err := r.countAddresses(ctx, pool)
	if err != nil {
		return f, err
	}
	f.inUse = int32(n)
	claims := &ipamv1.IPAddressClaimList{}
	if err := r.Client.List(ctx, claims, r.listOptions(pool, index.ClaimSubnetOutsideZone)...); err != nil {
		return f, errors.Wrap(err, "listing the pool's claims that found the subnet outside the zone")
	}
	if pool.PoolSpec().Subnet != "" && len(claims.Items) > 0 {
		f.outsideZone = &claims.Items[0]
	}
	return f, nil
}

// countAddresses counts the pool's IPAddresses from the cache's index, or (where the
// cache does not expose it) with a List that copies nothing.
func (r *Reconciler) countAddresses(ctx context.Context, pool ipamv1alpha1.Pool) (int, error) {
	if r.cache != nil {
		n, ok, err := index.Count(ctx, r.cache, &ipamv1.IPAddress{}, index.AddressPoolRef, pool.GetNamespace(), index.PoolRefValue(r.Kind, pool.GetName()))
		if err != nil {
			return 0, errors.Wrap(err, "counting the pool's IPAddresses")
		}
		if ok {
			return n, nil
		}
	}
	list := &ipamv1.IPAddressList{}
	// No deep copies: only the count is read (the cache is shared, never changed here).
	if err := r.Client.List(ctx, list, append(r.listOptions(pool, index.AddressPoolRef), client.UnsafeDisableDeepCopy)...); err != nil {
		return 0, errors.Wrap(err, "listing the pool's IPAddresses")
	}
	return len(list.Items), nil
}

// compute is the one place a pool's status is set: from the facts of the cluster and
// the last readiness check.
func (r *Reconciler) compute(pool ipamv1alpha1.Pool, f facts, c check) {
	st, spec := pool.PoolStatus(), pool.PoolSpec()
	st.AddressesInUse = ptr.To(f.inUse)
	st.ObservedGeneration = pool.GetGeneration()

	st.SubnetSize = nil
	plan, err := subnet.New(spec.Subnet, spec.Gateway, spec.ExcludedAddresses)
	if spec.Subnet == "" || err != nil {
		conditions.Delete(pool, ipamv1alpha1.PoolExhaustedCondition)
	} else {
		size := plan.Size()
		st.SubnetSize = &size
		ex := metav1.Condition{Type: ipamv1alpha1.PoolExhaustedCondition, Status: metav1.ConditionFalse, Reason: ipamv1alpha1.PoolNotExhaustedReason,
			Message: fmt.Sprintf("%d of %d addresses in use", f.inUse, size)}
		if int64(f.inUse) >= size {
			ex.Status, ex.Reason = metav1.ConditionTrue, ipamv1alpha1.PoolExhaustedReason
			ex.Message = fmt.Sprintf("all %d usable addresses of subnet %s are in use: free some, or widen the subnet or shrink excludedAddresses",
				size, spec.Subnet)
		}
		conditions.Set(pool, ex)
	}

	ready := metav1.Condition{Type: ipamv1alpha1.PoolReadyCondition, Status: metav1.ConditionFalse, Reason: c.reason, Message: c.message}
	switch {
	case !pool.GetDeletionTimestamp().IsZero():
		ready.Reason, ready.Message = ipamv1alpha1.PoolReadyDeletingReason, "the pool is being deleted"
	case c.reason == ipamv1alpha1.PoolReadyReason && f.outsideZone != nil:
		msg := ""
		if rc := conditions.Get(f.outsideZone, ipamv1.IPAddressClaimReadyCondition); rc != nil {
			msg = rc.Message
		}
		ready.Reason = ipamv1alpha1.PoolReadySubnetOutsideZoneReason
		ready.Message = fmt.Sprintf("IPAddressClaim %s/%s: %s", f.outsideZone.Namespace, f.outsideZone.Name, msg)
	case c.reason == ipamv1alpha1.PoolReadyReason:
		ready.Status = metav1.ConditionTrue
	}
	ready.Message = note.Truncate(ready.Message, note.ConditionLimit)
	prev := conditions.Get(pool, ipamv1alpha1.PoolReadyCondition)
	if ready.Status == metav1.ConditionFalse && (prev == nil || prev.Reason != ready.Reason) && r.Recorder != nil {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, ready.Reason, "CheckReadiness", "%s", ready.Message)
	}
	conditions.Set(pool, ready)
}
