package claim_test

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/controllers/claim"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// A pool and its claims applied together: the manager's cache may see a claim before
// its pool. The claim waits without a word (no Warning, no write); a pool that really
// does not exist is named on the claim, with the fix.
func TestClaimBeforeItsPoolIsCached(t *testing.T) {
	w := newWorld(t)
	cacheHasPool := false
	cached := interceptor.NewClient(w.c.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*ipamv1alpha1.VitistackIPPool); ok && !cacheHasPool {
				return apierrors.NewNotFound(ipamv1alpha1.GroupVersion.WithResource("vitistackippools").GroupResource(), key.Name)
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	// The process as a manager runs it: a cached client, an uncached reader.
	reg := registrar.New(cached, w.c, &registrar.CachingClientFactory{Timeout: w.cfg.RequestTimeout}, w.cfg)
	w.claims = &claim.Reconciler{Registrar: reg, Recorder: w.events}
	w.observe()

	// No pool at all: Ready=False PoolNotReady naming it, one Warning.
	w.create(claimObj("missing", "nowhere", nil))
	w.admit("missing")
	if _, err := w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: "missing"}}); err != nil {
		t.Fatalf("a claim of a missing pool waits for the pool's watch event, but failed: %v", err)
	}
	cond := readyOf(w.get(claimObj("missing", "", nil)).(*ipamv1.IPAddressClaim))
	if cond == nil || cond.Reason != ipamv1.IPAddressClaimReadyPoolNotReadyReason || !strings.Contains(cond.Message, `"nowhere" not found: create it`) {
		t.Fatalf("Ready of a claim of a missing pool = %+v, want PoolNotReady naming the pool", cond)
	}
	if ev := w.drainEvents(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning PoolNotReady ") {
		t.Fatalf("events of a claim of a missing pool = %q, want one Warning PoolNotReady", ev)
	}

	// The pool exists, the cache has not seen it yet: nothing is written, no event.
	w.create(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "pool"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4}})
	w.create(claimObj("early", "pool", nil))
	w.admit("early")
	before := w.writes
	wait, err := waitOf(w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: "early"}}))
	if err != nil || wait <= 0 {
		t.Fatalf("a claim whose pool is not cached yet: wait %v, error %v; want a wait", wait, err)
	}
	got := w.get(claimObj("early", "", nil)).(*ipamv1.IPAddressClaim)
	if w.writes != before || len(got.Status.Conditions) != 0 {
		t.Fatalf("a claim whose pool is not cached yet was written (%d writes): conditions %+v", w.writes-before, got.Status.Conditions)
	}
	if ev := w.drainEvents(); len(ev) != 0 {
		t.Fatalf("a claim whose pool is not cached yet got events %q", ev)
	}

	// Once the cache sees it, the claim is bound; its first binding sends no event.
	cacheHasPool = true
	w.deleteClaims("missing")
	w.settle()
	if cond := readyOf(w.get(claimObj("early", "", nil)).(*ipamv1.IPAddressClaim)); cond == nil || cond.Status != metav1.ConditionTrue {
		t.Fatalf("Ready = %+v, want True", cond)
	}
	if ev := w.drainEvents(); len(ev) != 0 {
		t.Fatalf("a first binding sent events %q", ev)
	}
	w.check()
}

// A Cluster's unpause brings all its claims to the controller, other providers' too (as
// ipamutil's loop does for every provider on it). Those are not this provider's: ipamutil's
// loop gives them the release finalizer, as their own provider on ipamutil does; then
// nothing more is written, no condition, no event, no error, and a deleted one is not
// released.
func TestAClaimOfAnotherProvidersPoolIsLeftAlone(t *testing.T) {
	w := newWorld(t)
	w.create(&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "c1"}})
	other := &ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "in-cluster", Labels: map[string]string{clusterv1.ClusterNameLabel: "c1"}},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{
			APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool", Name: "nodes"}},
	}
	w.create(other)
	w.admit(other.Name)
	before := w.writes
	res, err := w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(other)})
	got := w.get(other.DeepCopy()).(*ipamv1.IPAddressClaim)
	if err != nil || !res.IsZero() || w.writes != before || len(got.Status.Conditions) != 0 {
		t.Fatalf("another provider's claim: result %+v, error %v, %d writes, conditions %+v; want it untouched",
			res, err, w.writes-before, got.Status.Conditions)
	}
	// Deleted: its IPAddress (its provider's) and its finalizer are left to its provider.
	theirs := &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: other.Name}, Spec: ipamv1.IPAddressSpec{
		ClaimRef: ipamv1.IPAddressClaimReference{Name: other.Name}, PoolRef: other.Spec.PoolRef, Address: "10.9.9.9", Prefix: ptr.To[int32](24)}}
	w.create(theirs)
	must(t, w.direct.Delete(w.ctx, got))
	before = w.writes
	res, err = w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(other)})
	got = w.get(other.DeepCopy()).(*ipamv1.IPAddressClaim)
	if err != nil || !res.IsZero() || w.writes != before || len(got.Finalizers) != 1 || w.get(theirs.DeepCopy()) == nil {
		t.Fatalf("another provider's deleted claim: result %+v, error %v, %d writes, finalizers %v; want it and its IPAddress untouched",
			res, err, w.writes-before, got.Finalizers)
	}
	if ev := w.drainEvents(); len(ev) != 0 {
		t.Fatalf("another provider's claim got events %q", ev)
	}
}
