package manager

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"unsafe"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
)

// decoded returns a fresh IPAddress as a watch decodes it: every string its own copy.
func decoded(t *testing.T, name string) *ipamv1.IPAddress {
	t.Helper()
	a := &ipamv1.IPAddress{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "apps", Name: name, Finalizers: []string{"ipam.cluster.x-k8s.io/ProtectAddress"},
			Labels:      map[string]string{"ipam.vitistack.io/zone": "inet", "ipam.vitistack.io/ip-family": "ipv4"},
			Annotations: map[string]string{"ipam.vitistack.io/registered-cluster-id": "9e7f0c2a-cluster", "long": string(make([]byte, 200))},
			OwnerReferences: []metav1.OwnerReference{
				{APIVersion: "ipam.cluster.x-k8s.io/v1beta2", Kind: "IPAddressClaim", Name: name, UID: "uid-" + "claim-" + "x"},
				{APIVersion: "ipam.vitistack.io/v1alpha1", Kind: "VitistackIPPool", Name: "pool", UID: "uid-pool"},
			},
		},
		Spec: ipamv1.IPAddressSpec{Address: "10.0.0.1", Gateway: "10.0.0.254",
			PoolRef: ipamv1.IPPoolReference{APIGroup: "ipam.vitistack.io", Kind: "VitistackIPPool", Name: "pool"}},
	}
	raw, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	out := &ipamv1.IPAddress{}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func same(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

// The cache transform changes no value, and two objects share the strings they repeat
// (and not the long ones that are theirs alone).
func TestInternSharesRepeatedStrings(t *testing.T) {
	a, b := decoded(t, "a"), decoded(t, "b")
	before := a.DeepCopy()
	transform := cacheTransform()
	for _, o := range []*ipamv1.IPAddress{a, b} {
		if _, err := transform(o); err != nil {
			t.Fatal(err)
		}
	}
	if !apiequality.Semantic.DeepEqual(before, a) {
		t.Fatalf("the transform changed the object:\n%+v\n%+v", before, a)
	}
	for what, pair := range map[string][2]string{
		"namespace":         {a.Namespace, b.Namespace},
		"zone label":        {a.Labels["ipam.vitistack.io/zone"], b.Labels["ipam.vitistack.io/zone"]},
		"cluster-id":        {a.Annotations["ipam.vitistack.io/registered-cluster-id"], b.Annotations["ipam.vitistack.io/registered-cluster-id"]},
		"finalizer":         {a.Finalizers[0], b.Finalizers[0]},
		"pool owner UID":    {string(a.OwnerReferences[1].UID), string(b.OwnerReferences[1].UID)},
		"poolRef kind":      {a.Spec.PoolRef.Kind, b.Spec.PoolRef.Kind},
		"gateway":           {a.Spec.Gateway, b.Spec.Gateway},
		"owner API version": {a.OwnerReferences[0].APIVersion, b.OwnerReferences[0].APIVersion},
	} {
		if !same(pair[0], pair[1]) {
			t.Errorf("%s %q is not shared", what, pair[0])
		}
	}
	if same(a.Annotations["long"], b.Annotations["long"]) {
		t.Error("a long annotation value was shared")
	}
	if same(string(a.OwnerReferences[0].UID), string(b.OwnerReferences[0].UID)) {
		t.Error("the claim owner's UID was shared")
	}
}

func sameMap(a, b map[string]string) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// IPAddresses (and claims) with the same labels share one map of them; other labels
// get their own, with their own values, also after the table of sets was full.
func TestInternSharesLabelSets(t *testing.T) {
	transform := cacheTransform()
	cached := func(name, zone string) *ipamv1.IPAddress {
		o := decoded(t, name)
		o.Labels["ipam.vitistack.io/zone"] = zone
		if _, err := transform(o); err != nil {
			t.Fatal(err)
		}
		return o
	}
	a, b, c := cached("a", "inet"), cached("b", "inet"), cached("c", "hnet")
	if !sameMap(a.Labels, b.Labels) {
		t.Error("two IPAddresses with the same labels do not share them")
	}
	if sameMap(a.Labels, c.Labels) || c.Labels["ipam.vitistack.io/zone"] != "hnet" || a.Labels["ipam.vitistack.io/zone"] != "inet" {
		t.Errorf("other labels are not their own: %v %v", a.Labels, c.Labels)
	}
	for i := range maxLabelSets {
		cached(fmt.Sprint("own-", i), fmt.Sprint("zone-", i))
	}
	d, e := cached("d", "new"), cached("e", "new")
	if !sameMap(d.Labels, e.Labels) || d.Labels["ipam.vitistack.io/zone"] != "new" {
		t.Errorf("after the table was full, a new set is not shared: %v %v", d.Labels, e.Labels)
	}
	if a.Labels["ipam.vitistack.io/zone"] != "inet" || c.Labels["ipam.vitistack.io/zone"] != "hnet" {
		t.Errorf("objects cached before lost their labels: %v %v", a.Labels, c.Labels)
	}
}
