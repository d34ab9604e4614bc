package index

import (
	"context"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

func registration(service, address string) *record.Registration {
	return &record.Registration{
		Endpoint: "https://ipam.example", Zone: "hnet-private", Family: ipamapi.FamilyIPv4,
		Identity: ipamapi.Identity{ServiceName: service, NamespaceID: "ns-1", ClusterID: "c-1"},
		Secret:   record.ObjectRef{Namespace: "vitistack-system", Name: "ipam-api", Key: record.DefaultSecretKey},
		Address:  address,
	}
}

// neighbours returns two registrations whose keys (by is Key or HostKey) differ but
// fall into one bucket, so a lookup of one lists the other too and must drop it.
func neighbours(t *testing.T, by func(*record.Registration) string) (*record.Registration, *record.Registration) {
	t.Helper()
	first := registration("svc-0", "10.0.0.0/32")
	for i := 1; i < 100000; i++ {
		r := registration(fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.%d.%d.%d/32", i>>16, i>>8&255, i&255))
		if by(r) != by(first) && bucket(by(r)) == bucket(by(first)) {
			return first, r
		}
	}
	t.Fatal("no two keys in one bucket")
	return nil, nil
}

func claimWith(name string, r *record.Registration) *ipamv1.IPAddressClaim {
	c := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	r.SetOn(c)
	return c
}

func addressWith(name string, r *record.Registration) *ipamv1.IPAddress {
	a := &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: name, Labels: map[string]string{}, Annotations: map[string]string{}}}
	r.WriteTo(a.Labels, a.Annotations)
	return a
}

func fakeClient(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := ipamv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...)
	Each(func(obj client.Object, field string, fn client.IndexerFunc) { b = b.WithIndex(obj, field, fn) })
	return b.Build()
}

func names[T any, P interface {
	*T
	client.Object
}](items []T) []string {
	var out []string
	for i := range items {
		out = append(out, client.ObjectKeyFromObject(P(&items[i])).String())
	}
	return out
}

func TestListByRegistrationKeepsOnlyTheKeyOfItsBucket(t *testing.T) {
	mine, neighbour := neighbours(t, (*record.Registration).Key)
	c := fakeClient(t, claimWith("mine", mine), claimWith("neighbour", neighbour), addressWith("mine", mine), addressWith("neighbour", neighbour))
	ctx := context.Background()

	claims := &ipamv1.IPAddressClaimList{}
	if err := ListByRegistration(ctx, c, claims, mine.Key()); err != nil {
		t.Fatal(err)
	}
	if got := names(claims.Items); len(got) != 1 || got[0] != "default/mine" {
		t.Errorf("claims with the key: %v, want [default/mine]", got)
	}
	addrs := &ipamv1.IPAddressList{}
	if err := ListByRegistration(ctx, c, addrs, neighbour.Key()); err != nil {
		t.Fatal(err)
	}
	if got := names(addrs.Items); len(got) != 1 || got[0] != "other/neighbour" {
		t.Errorf("IPAddresses with the key: %v, want [other/neighbour]", got)
	}
	if err := ListByRegistration(ctx, c, addrs, registration("nobody", "").Key()); err != nil || len(addrs.Items) != 0 {
		t.Errorf("a key nobody holds: %v, %v; want none", names(addrs.Items), err)
	}
}

func TestListByHostKeepsOnlyTheAddressOfItsBucket(t *testing.T) {
	mine, neighbour := neighbours(t, (*record.Registration).HostKey)
	sharer := registration("sharer", mine.Address) // another identity on the same address
	c := fakeClient(t, claimWith("mine", mine), claimWith("sharer", sharer), claimWith("neighbour", neighbour),
		addressWith("mine", mine), addressWith("neighbour", neighbour))
	ctx := context.Background()

	claims := &ipamv1.IPAddressClaimList{}
	if err := ListByHost(ctx, c, claims, mine.HostKey()); err != nil {
		t.Fatal(err)
	}
	if got := names(claims.Items); len(got) != 2 || got[0] != "default/mine" || got[1] != "default/sharer" {
		t.Errorf("claims on the address: %v, want [default/mine default/sharer]", got)
	}
	addrs := &ipamv1.IPAddressList{}
	if err := ListByHost(ctx, c, addrs, mine.HostKey()); err != nil {
		t.Fatal(err)
	}
	if got := names(addrs.Items); len(got) != 1 || got[0] != "other/mine" {
		t.Errorf("IPAddresses on the address: %v, want [other/mine]", got)
	}
}
