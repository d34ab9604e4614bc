package claim_test

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A user waits for Ready, then reads the addressRef (kubectl wait, then the IPAddress):
// Cluster API's patch helper writes a claim's conditions before its status, so Ready=True
// never goes out in the reconcile that sets the addressRef, only in the next one, which
// the addressRef brings.
func TestReadyNeverComesBeforeTheAddressRef(t *testing.T) {
	w := newWorld(t)
	pools(w)
	w.create(claimObj("c", "routed", nil))
	w.admit("c")
	key := ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: "c"}}
	var c *ipamv1.IPAddressClaim
	for range 10 {
		if _, err := waitOf(w.claims.Reconcile(w.ctx, key)); err != nil {
			t.Fatal(err)
		}
		_, _ = w.protector.Reconcile(w.ctx, ctrl.Request{NamespacedName: w.cfg.DefaultSecret})
		c = w.get(claimObj("c", "", nil)).(*ipamv1.IPAddressClaim)
		if r := readyOf(c); r != nil && r.Status == metav1.ConditionTrue && c.Status.AddressRef.Name == "" {
			t.Fatalf("Ready=True before the addressRef: %+v", c.Status)
		}
		if c.Status.AddressRef.Name != "" {
			break
		}
	}
	if c.Status.AddressRef.Name == "" {
		t.Fatalf("the claim was not bound:\n%s", w.describe())
	}
	if r := readyOf(c); r != nil && r.Status == metav1.ConditionTrue {
		t.Fatalf("Ready=True went out with the addressRef: %+v", r)
	}
	if _, err := w.claims.Reconcile(w.ctx, key); err != nil {
		t.Fatal(err)
	}
	if r := readyOf(w.get(claimObj("c", "", nil)).(*ipamv1.IPAddressClaim)); r == nil || r.Status != metav1.ConditionTrue || r.Reason != "Allocated" {
		t.Fatalf("Ready after the reconcile the addressRef brings: %+v, want True Allocated", r)
	}
	if ev := w.drainEvents(); len(ev) != 0 {
		t.Errorf("a first binding sent events %q", ev)
	}
	w.check()
}
