package claim

import (
	"context"
	"maps"
	"strconv"
	"time"

	"github.com/pkg/errors"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// handOver ends the handler's part of a reconcile; Cluster API's patch helper, which
// ipamutil's loop made from the claim as it read it (read), then writes what changed since:
// the conditions (locked to the claim's version in the cache), the metadata and the status.
// What the handler wrote itself is set back to what the helper read, so the helper does not
// write it again; and the handler's own writes are waited for in the cache, so that the
// helper's conditions patch is not refused for a version the cache has not shown yet, and the
// next reconcile does not act on a copy older than them.
func (h *Handler) handOver(ctx context.Context) {
	if h.writtenVersion == "" {
		return // nothing written: the helper writes what changed
	}
	_ = h.waitForCache(ctx, &ipamv1.IPAddressClaim{}, client.ObjectKeyFromObject(h.claim), h.writtenVersion, untilSeenOrGone)
	ann := h.claim.Annotations
	h.claim.ObjectMeta = *h.read.ObjectMeta.DeepCopy()
	h.claim.Annotations = unwritten(h.read.Annotations, h.written.Annotations, ann)
}

// unwritten is the annotations to hand the patch helper, which read them as read: those of
// want that the API server has already (written) as read has them, the others as want has
// them. The helper's patch then carries only what is not written yet.
func unwritten(read, written, want map[string]string) map[string]string {
	out := maps.Clone(read)
	keys := map[string]string{}
	maps.Copy(keys, want)
	maps.Copy(keys, written)
	maps.Copy(keys, read)
	for k := range keys {
		w, inWant := want[k]
		s, inWritten := written[k]
		if inWant == inWritten && w == s {
			continue // written already: as read
		}
		if out == nil {
			out = map[string]string{}
		}
		if inWant {
			out[k] = w
		} else {
			delete(out, k)
		}
	}
	return out
}

// patchMetadata writes the claim's changed metadata, locked to the version last read or written:
// a reconcile that acted on a stale read (a lagging cache that misses the deletion, say) gets a
// conflict here, before the request its record announces goes out, and runs again.
//
// The release finalizer is ipamutil's loop's first write, before the handler runs.
func (h *Handler) patchMetadata(ctx context.Context) error {
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
