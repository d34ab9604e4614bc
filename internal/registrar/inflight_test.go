package registrar_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

func claim(name string) *ipamv1.IPAddressClaim {
	return &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}}
}

func TestInFlightReservations(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	a, b, c := claim("a"), claim("b"), claim("c")
	f := &registrar.InFlight{Reader: fake.NewClientBuilder().WithScheme(manager.NewScheme()).WithObjects(a, b).Build(), Quarantine: time.Second}

	// One identity: no two claims without an address, nor with the same one.
	_, ok := f.Reserve(ctx, "id", "", a)
	g.Expect(ok).To(BeTrue())
	holder, ok := f.Reserve(ctx, "id", "", b)
	g.Expect(ok).To(BeFalse())
	g.Expect(holder).To(Equal("ns/a"))
	// Different explicit addresses may coexist (make before break).
	f.Forget(a.UID)
	_, ok = f.Reserve(ctx, "id", "10.0.0.1/32", a)
	g.Expect(ok).To(BeTrue())
	_, ok = f.Reserve(ctx, "id", "10.0.0.2/32", b)
	g.Expect(ok).To(BeTrue())
	// A claim that no longer exists holds nothing.
	_, ok = f.Reserve(ctx, "id", "10.0.0.1/32", c)
	g.Expect(ok).To(BeFalse())
	_, ok = f.Reserve(ctx, "gone", "", claim("ghost"))
	g.Expect(ok).To(BeTrue())
	_, ok = f.Reserve(ctx, "gone", "", c)
	g.Expect(ok).To(BeTrue(), "ghost does not exist")

	// One address: only claims that declare the same share key.
	_, ok = f.ReserveAddress(ctx, "host", "k", a)
	g.Expect(ok).To(BeTrue())
	_, ok = f.ReserveAddress(ctx, "host", "k", b)
	g.Expect(ok).To(BeTrue())
	_, ok = f.ReserveAddress(ctx, "host", "", c)
	g.Expect(ok).To(BeFalse())

	// Forget drops everything of a claim.
	for _, x := range []*ipamv1.IPAddressClaim{a, b, c} {
		f.Forget(x.UID)
	}
	reserved, answered := f.Len()
	g.Expect(reserved).To(Equal(0))
	g.Expect(answered).To(Equal(0))
}

func TestInFlightQuarantine(t *testing.T) {
	g := NewWithT(t)
	f := &registrar.InFlight{Quarantine: time.Hour}
	attempt := time.Now()
	_, waiting := f.MayStillBeInFlight("u", attempt)
	g.Expect(waiting).To(BeTrue(), "an attempt whose answer this process never saw")
	f.SawAnswer("u", attempt)
	_, waiting = f.MayStillBeInFlight("u", attempt)
	g.Expect(waiting).To(BeFalse())
	_, waiting = f.MayStillBeInFlight("u", attempt.Add(time.Second))
	g.Expect(waiting).To(BeTrue(), "a later attempt is another request")
	_, waiting = f.MayStillBeInFlight("u", time.Time{})
	g.Expect(waiting).To(BeFalse(), "nothing was ever sent")
}
