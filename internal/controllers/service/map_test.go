package service

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func controlledBy(apiVersion, kind, name string) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(name), Controller: new(true)}}
}

// A new IPAddress brings back the Service whose claim it binds, and only that Service:
// the claim's bound status can reach the Service controller before the IPAddress
// reaches the cache.
func TestNewIPAddressWakesTheServiceOfItsClaim(t *testing.T) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := ipamv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	meta := func(name string, owners []metav1.OwnerReference) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: "apps", Name: name, OwnerReferences: owners}
	}
	claimGV := ipamv1.GroupVersion.String()
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		&ipamv1.IPAddressClaim{ObjectMeta: meta("web-ipv4", controlledBy("v1", "Service", "web"))},
		&ipamv1.IPAddressClaim{ObjectMeta: meta("node-0", controlledBy("infrastructure.cluster.x-k8s.io/v1beta1", "Machine", "node-0"))},
	).Build()
	r := &Reconciler{Client: c}
	for _, tc := range []struct {
		what  string
		owner []metav1.OwnerReference
		want  []reconcile.Request
	}{
		{"the IPAddress of a Service's claim", controlledBy(claimGV, "IPAddressClaim", "web-ipv4"),
			[]reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: "apps", Name: "web"}}}},
		{"the IPAddress of a node's claim", controlledBy(claimGV, "IPAddressClaim", "node-0"), nil},
		{"the IPAddress of a claim not in the cache", controlledBy(claimGV, "IPAddressClaim", "gone"), nil},
		{"an IPAddress without a claim", nil, nil},
		{"an IPAddress controlled by something else named like a claim", controlledBy("example.com/v1", "IPAddressClaim", "web-ipv4"), nil},
	} {
		got := r.serviceOfAddress(t.Context(), &ipamv1.IPAddress{ObjectMeta: meta("a", tc.owner)})
		if len(got) != len(tc.want) || (len(got) == 1 && got[0] != tc.want[0]) {
			t.Errorf("%s: got %v, want %v", tc.what, got, tc.want)
		}
	}
}
