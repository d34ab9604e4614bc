package claim

import (
	"net/netip"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/subnet"
)

// boundAddresses tells s that n IPAddresses of the pool hold the first n usable
// addresses of plan, as the cache's events would.
func boundAddresses(t testing.TB, s *subnetState, plan *subnet.Plan, ref ipamv1.IPPoolReference, n int) {
	t.Helper()
	for i := range n {
		a, ok := plan.Next(func(a netip.Addr) bool { return s.used[poolKey(ref, "ns")][a] > 0 })
		if !ok {
			t.Fatalf("subnet full after %d", i)
		}
		s.observe(&ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a" + strconv.Itoa(i), UID: types.UID("a" + strconv.Itoa(i))},
			Spec: ipamv1.IPAddressSpec{PoolRef: ref, Address: a.String()}}, false)
	}
}

// Picking follows the IPAddresses the events show: the lowest free address not found taken
// lately, and one freed by a deletion is picked again.
func TestPickFollowsTheEvents(t *testing.T) {
	plan, err := subnet.New("10.9.0.0/24", "10.9.0.1", nil)
	if err != nil {
		t.Fatal(err)
	}
	ref := ipamv1.IPPoolReference{APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: ipamv1alpha1.VitistackIPPoolKind, Name: "p"}
	s := &subnetState{recheck: time.Minute}
	boundAddresses(t, s, plan, ref, 3) // .2 .3 .4
	key := poolKey(ref, "ns")
	if got, _ := s.next(plan, "z", key, nil); got.String() != "10.9.0.5" {
		t.Fatalf("first pick %s, want 10.9.0.5", got)
	}
	s.markTaken("z", netip.MustParseAddr("10.9.0.5"))
	if got, _ := s.next(plan, "z", key, nil); got.String() != "10.9.0.6" {
		t.Fatalf("the pick after 10.9.0.5 was found taken is %s, want 10.9.0.6", got)
	}
	s.observe(&ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{UID: "a1"}}, true) // 10.9.0.3 goes
	if got, _ := s.next(plan, "z", key, nil); got.String() != "10.9.0.3" {
		t.Fatalf("after a deletion the pick is %s, want the freed 10.9.0.3", got)
	}
}

// BenchmarkPickIn16With5000Bound: one pick in a /16 whose lowest 5,000 addresses are
// bound (go test -bench Pick ./internal/controllers/claim/).
func BenchmarkPickIn16With5000Bound(b *testing.B) {
	plan, err := subnet.New("10.8.0.0/16", "10.8.0.1", nil)
	if err != nil {
		b.Fatal(err)
	}
	ref := ipamv1.IPPoolReference{APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: ipamv1alpha1.VitistackIPPoolKind, Name: "p"}
	s := &subnetState{recheck: time.Minute}
	boundAddresses(b, s, plan, ref, 5000)
	key := poolKey(ref, "ns")
	for b.Loop() {
		if _, ok := s.next(plan, "z", key, nil); !ok {
			b.Fatal("no address")
		}
	}
}
