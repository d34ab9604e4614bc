package claim

import (
	"context"
	"strconv"
	"time"

	"github.com/pkg/errors"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/ipamutil"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
)

// patchClaim writes what the reconcile changed on the claim since it was read or last
// written: its metadata in one patch, its status (addressRef, conditions) in another.
func (h *Handler) patchClaim(ctx context.Context) error {
	var errs []error
	lastFinalizer := !h.claim.DeletionTimestamp.IsZero() && len(h.claim.Finalizers) == 0 && len(h.written.Finalizers) > 0
	err := h.patchMetadata(ctx)
	if err == nil && lastFinalizer {
		// The API server deleted the claim and answered with its last state, finalizer still
		// on: only its absence from the cache keeps the next reconcile from releasing again.
		_ = h.waitForCache(ctx, &ipamv1.IPAddressClaim{}, client.ObjectKeyFromObject(h.claim), "", untilGone)
		return nil
	}
	if err != nil {
		errs = append(errs, errors.Wrap(err, "patching the claim"))
	}
	if !apiequality.Semantic.DeepEqual(h.claim.Status, h.written.Status) {
		st := statusOnly(h.claim)
		if err := h.Client.Status().Patch(ctx, st, client.MergeFrom(statusOnly(h.written))); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, errors.Wrap(err, "patching the claim's status"))
		} else {
			h.written.Status = *h.claim.Status.DeepCopy()
			h.writtenVersion = st.ResourceVersion
		}
	}
	if a := h.created; a != nil {
		// The next reconcile must see the new IPAddress in the cache, or it would create it again;
		// then the request is forgotten (creating its IPAddress does not re-queue the claim, so no
		// later reconcile would). Waiting after the status patch binds one watch delay sooner.
		if err := h.waitForCache(ctx, &ipamv1.IPAddress{}, client.ObjectKeyFromObject(a), a.ResourceVersion, untilSeen); err != nil {
			errs = append(errs, errors.Wrapf(err, "waiting for IPAddress %s to be visible in the cache after create", a.Name))
		} else {
			h.forget()
		}
	}
	if h.writtenVersion != "" {
		// The next reconcile must not act on a copy older than this one's writes (even if a later
		// write failed): it would write them again, or take an attempt it finds for one whose
		// answer this process never saw.
		_ = h.waitForCache(ctx, &ipamv1.IPAddressClaim{}, client.ObjectKeyFromObject(h.claim), h.writtenVersion, untilSeenOrGone)
	}
	return kerrors.NewAggregate(errs)
}

// patchMetadata writes the claim's changed metadata, locked to the version last read or written:
// a reconcile that acted on a stale read (a lagging cache that misses the deletion, say) gets a
// conflict here, before the request its record announces goes out, and runs again.
//
// A live claim that records a registration has the release finalizer: it goes out with the
// first record, before any send, and comes back on a claim restored or moved without it.
func (h *Handler) patchMetadata(ctx context.Context) error {
	if _, recorded := h.claim.Annotations[ipamv1alpha1.RegistrationAnnotation]; recorded && h.claim.DeletionTimestamp.IsZero() {
		controllerutil.AddFinalizer(h.claim, ipamutil.ReleaseAddressFinalizer)
	}
	meta, written := withoutStatus(h.claim), withoutStatus(h.written)
	if apiequality.Semantic.DeepEqual(meta.ObjectMeta, written.ObjectMeta) && apiequality.Semantic.DeepEqual(meta.Spec, written.Spec) {
		return nil
	}
	err := h.Client.Patch(ctx, meta, client.MergeFromWithOptions(written, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsNotFound(err) && len(meta.Finalizers) == 0 {
		return nil // a claim whose last finalizer went is gone
	}
	if err != nil {
		return err
	}
	// The claim takes the API server's answer: its resourceVersion and server-set fields.
	h.claim.ObjectMeta = *meta.ObjectMeta.DeepCopy()
	status := h.written.Status
	h.written = meta
	h.written.Status = status
	h.writtenVersion = meta.ResourceVersion
	return nil
}

// cacheWait is what waitForCache waits for.
type cacheWait int

const (
	// untilSeen: the object at the resourceVersion or later.
	untilSeen cacheWait = iota
	// untilSeenOrGone: that, or the object no longer there.
	untilSeenOrGone
	// untilGone: the object no longer there.
	untilGone
)

// cacheWaitMax bounds a wait for the cache.
const cacheWaitMax = 5 * time.Second

// waitForCache waits until the cache holds the object at key as until says, polling from
// 1 ms, doubling up to 64 ms, on the process's monotonic clock, for cacheWaitMax at most.
// obj is an empty object of the kind.
func (h *Handler) waitForCache(ctx context.Context, obj client.Object, key types.NamespacedName, rv string, until cacheWait) error {
	want, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		want = 0 // not a number: the object being there is enough
	}
	clk, poll := h.Config.Ticks(), time.Duration(0)
	for start := clk.Now(); ; poll = min(max(2*poll, time.Millisecond), 64*time.Millisecond) {
		// A wait that lasts (an object deleted meanwhile) costs few polls.
		clk.Sleep(poll)
		switch err := h.Client.Get(ctx, key, obj); {
		case apierrors.IsNotFound(err):
			if until != untilSeen {
				return nil
			}
		case err != nil:
			return err
		case until != untilGone:
			if got, err := strconv.ParseUint(obj.GetResourceVersion(), 10, 64); err != nil || got >= want {
				return nil
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if clk.Since(start) >= cacheWaitMax {
			return errors.Errorf("the cache did not show %s within %s", key, cacheWaitMax)
		}
	}
}

func withoutStatus(c *ipamv1.IPAddressClaim) *ipamv1.IPAddressClaim {
	out := c.DeepCopy()
	out.Status = ipamv1.IPAddressClaimStatus{}
	return out
}

func statusOnly(c *ipamv1.IPAddressClaim) *ipamv1.IPAddressClaim {
	out := &ipamv1.IPAddressClaim{TypeMeta: c.TypeMeta, Status: *c.Status.DeepCopy()}
	out.Namespace, out.Name, out.UID = c.Namespace, c.Name, c.UID
	return out
}
