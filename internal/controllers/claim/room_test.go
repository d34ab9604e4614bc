package claim

import (
	"context"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// A subnet-mode pool whose count of addresses in use falls wakes the claims that found
// no room in the subnet-mode pools of its zone, namespaced and global: not those of
// another zone, of a routed pool, bound ones, or ones that failed for another reason.
// A count that rises, or falls in a routed pool, wakes nobody.
func TestAFreedAddressWakesTheClaimsWaitingForRoomInItsZone(t *testing.T) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{ipamv1.AddToScheme, ipamv1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	pool := func(name, zone, subnet string, inUse int32) *ipamv1alpha1.VitistackIPPool {
		return &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec:   ipamv1alpha1.VitistackIPPoolSpec{Zone: zone, Subnet: subnet},
			Status: ipamv1alpha1.VitistackIPPoolStatus{AddressesInUse: ptr.To(inUse)}}
	}
	full := pool("full", "z", "10.0.0.0/29", 5)
	global := &ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: "shared"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "z", Subnet: "10.1.0.0/29"}}
	routed := pool("routed", "z", "", 5)
	claim := func(name, kind, poolName, reason string, bound bool) *ipamv1.IPAddressClaim {
		c := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: kind, Name: poolName}}}
		c.Status.Conditions = []metav1.Condition{{Type: ipamv1.IPAddressClaimReadyCondition, Status: metav1.ConditionFalse, Reason: reason}}
		if bound {
			c.Status.AddressRef.Name = name
		}
		return c
	}
	exhausted := ipamv1.IPAddressClaimReadyPoolExhaustedReason
	b := fake.NewClientBuilder().WithScheme(s).WithObjects(full, global, routed, pool("elsewhere", "other", "10.2.0.0/29", 5),
		claim("waits-here", ipamv1alpha1.VitistackIPPoolKind, "full", exhausted, false),
		claim("waits-in-global", ipamv1alpha1.GlobalVitistackIPPoolKind, "shared", exhausted, false),
		claim("waits-elsewhere", ipamv1alpha1.VitistackIPPoolKind, "elsewhere", exhausted, false),
		claim("waits-routed", ipamv1alpha1.VitistackIPPoolKind, "routed", exhausted, false),
		claim("bound", ipamv1alpha1.VitistackIPPoolKind, "full", exhausted, true),
		claim("failed", ipamv1alpha1.VitistackIPPoolKind, "full", ipamv1.IPAddressClaimReadyAllocationFailedReason, false))
	index.Each(func(obj client.Object, field string, fn client.IndexerFunc) { b = b.WithIndex(obj, field, fn) })
	a := &Reconciler{Registrar: &registrar.Registrar{Client: b.Build()}}

	var woken []string
	for _, r := range a.claimsWaitingForRoom(context.Background(), full) {
		woken = append(woken, r.Name)
	}
	slices.Sort(woken)
	if want := []string{"waits-here", "waits-in-global"}; !slices.Equal(woken, want) {
		t.Errorf("a freed address in zone z woke %v, want %v", woken, want)
	}

	freed := full.DeepCopy()
	freed.Status.AddressesInUse = ptr.To[int32](4)
	routedFreed := routed.DeepCopy()
	routedFreed.Status.AddressesInUse = ptr.To[int32](4)
	for _, c := range []struct {
		what     string
		old, new client.Object
		want     bool
	}{
		{"a subnet-mode pool's count falls", full, freed, true},
		{"a subnet-mode pool's count rises", freed, full, false},
		{"a subnet-mode pool's count stays", full, full.DeepCopy(), false},
		{"a routed pool's count falls", routed, routedFreed, false},
	} {
		if got := roomFreed().Update(event.UpdateEvent{ObjectOld: c.old, ObjectNew: c.new}); got != c.want {
			t.Errorf("%s: wakes the waiting claims %v, want %v", c.what, got, c.want)
		}
	}
}
