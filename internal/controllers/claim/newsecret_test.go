package claim_test

import (
	"slices"
	"testing"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// Claims under a Secret that is not protected yet (here the default Secret, created by
// the first claim): the first writes its pending record, which asks for the
// protection, and waits. The next finds that record and waits too, writing nothing,
// not even its finalizer, and asks the protector to look at the Secret. Protecting
// it, the protector wakes both, and the second binds with one patch of the claim, its
// IPAddress and one status patch: its pending record is written once, with its
// attempt time.
func TestClaimsWaitForANewSecretWithoutWriting(t *testing.T) {
	w := newWorld(t)
	pools(w)
	wake := make(chan event.GenericEvent, 8)
	w.protector.Wake = wake
	w.create(claimObj("a", "routed", nil))
	w.create(claimObj("b", "routed", nil))
	reconcile := func(name string) (ctrl.Result, error) {
		return w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: name}})
	}
	// Waiting is not an error (nothing a user need see in the log): the claim comes
	// back later on its own, unless the protector wakes it first.
	waits := func(name string) {
		t.Helper()
		if res, err := reconcile(name); err != nil || res.RequeueAfter <= 0 {
			t.Fatalf("claim %s whose Secret is not protected was not told to wait: %+v, %v", name, res, err)
		}
	}

	waits("a")
	if a := w.get(claimObj("a", "", nil)); a.GetAnnotations()[ipamv1alpha1.RegistrationAnnotation] == "" {
		t.Fatal("the first claim did not write its pending record")
	}
	before := w.writes
	waits("b")
	if w.writes != before {
		t.Fatalf("the second claim wrote %d times while it waited", w.writes-before)
	}
	if b := w.get(claimObj("b", "", nil)); len(b.GetFinalizers()) != 0 || len(b.GetAnnotations()) != 0 {
		t.Fatalf("the waiting claim changed: finalizers %v, annotations %v", b.GetFinalizers(), b.GetAnnotations())
	}
	select {
	case e := <-w.claims.Adapter.Secrets.Protected.Ask:
		if key := client.ObjectKeyFromObject(e.Object); key != w.cfg.DefaultSecret {
			t.Fatalf("the protector was asked to look at %s, want %s", key, w.cfg.DefaultSecret)
		}
	default:
		t.Fatal("the protector was not asked to look at the Secret")
	}

	if _, err := w.protector.Reconcile(w.ctx, ctrl.Request{NamespacedName: w.cfg.DefaultSecret}); err != nil {
		t.Fatal(err)
	}
	var woken []string
	for len(wake) > 0 {
		woken = append(woken, (<-wake).Object.GetName())
	}
	slices.Sort(woken)
	if !slices.Equal(woken, []string{"a", "b"}) {
		t.Fatalf("protecting the Secret woke %v, want [a b]", woken)
	}

	before = w.writes
	if _, err := reconcile("b"); err != nil {
		t.Fatal(err)
	}
	if w.addressOf("b") == nil {
		t.Fatalf("the woken claim is not bound:\n%s", w.describe())
	}
	if n := w.writes - before; n != 3 {
		t.Errorf("the woken claim was bound with %d writes, want 3 (its record, its IPAddress, its status)", n)
	}
	w.settle()
	if n := w.api.Stats().Total(sim.RouteRegister); n != 2 {
		t.Errorf("%d registration requests for two claims, want 2", n)
	}
	w.check()
}
