package claim_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/controllers/claim"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// A manager's cache shows a claim's own writes a moment later. A claim whose new default
// Secret cannot be protected yet (a policy refuses it, for a while) writes its pending
// record and ends the reconcile without another write: the next reconcile must still
// find that record, or it writes a new attempt and then takes the first for one whose
// answer it never saw ("may still be in flight", a Warning and a 20 s wait).
func TestClaimReconcileSeesItsOwnWrites(t *testing.T) {
	w := newWorld(t)
	// The cache: after a write to a claim, its next read still returns the claim as it
	// was before the write; the read after that one is current.
	stale := map[client.ObjectKey]*ipamv1.IPAddressClaim{}
	snapshot := func(obj client.Object) {
		if _, ok := obj.(*ipamv1.IPAddressClaim); !ok {
			return
		}
		key := client.ObjectKeyFromObject(obj)
		if _, ok := stale[key]; ok {
			return
		}
		before := &ipamv1.IPAddressClaim{}
		if w.direct.Get(w.ctx, key, before) == nil {
			stale[key] = before
		}
	}
	cached := interceptor.NewClient(w.c.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if old, ok := stale[key]; ok {
				if into, ok := obj.(*ipamv1.IPAddressClaim); ok {
					delete(stale, key)
					old.DeepCopyInto(into)
					return nil
				}
			}
			return c.Get(ctx, key, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			snapshot(obj)
			return c.Patch(ctx, obj, p, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			snapshot(obj)
			return c.SubResource(sub).Patch(ctx, obj, p, opts...)
		},
	})
	reg := registrar.New(cached, w.c, &registrar.CachingClientFactory{Timeout: w.cfg.RequestTimeout}, w.cfg)
	denied := true
	reg.Secrets.Writer = refuseSecretPatches(cached, &denied, func(*corev1.Secret) string { return "a policy forbids finalizers on Secrets" })
	w.claims = &claim.Reconciler{Registrar: reg, Recorder: w.events}
	w.observe()

	pools(w)
	w.create(claimObj("c", "routed", nil))
	w.admit("c")
	// ipamutil's loop ends the reconcile with the finalizer; its update event, which brings
	// the claim back, is the cache showing it.
	delete(stale, client.ObjectKey{Namespace: "apps", Name: "c"})
	// The default Secret is created by the first reconcile after; it cannot be protected
	// yet, so two reconciles in a row end with the claim's pending record.
	for range 2 {
		if _, err := w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: "c"}}); err == nil {
			t.Fatal("a claim whose Secret cannot be protected did not fail")
		}
	}
	w.drainEvents()
	denied = false
	w.settle()
	if w.addressOf("c") == nil {
		t.Fatalf("the claim is not bound:\n%s", w.describe())
	}
	for _, ev := range w.drainEvents() {
		if strings.HasPrefix(ev, "Warning") {
			t.Errorf("the binding after the wait sent the warning %q", ev)
		}
	}
	if n := w.api.Stats().Total(sim.RouteRegister); n != 1 {
		t.Errorf("%d registration requests for one claim, want 1", n)
	}
	w.check()
}
