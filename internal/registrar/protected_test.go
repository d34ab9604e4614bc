package registrar_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// The claims that wait for a Secret ask the protector to look at it once, not once
// per claim, and a full channel never holds a claim up. Set says which keys are
// protected, and forgets them all when given none.
func TestProtectedAskForAndSet(t *testing.T) {
	p := &registrar.Protected{Ask: make(chan event.GenericEvent, 1)}
	s, other := types.NamespacedName{Namespace: "ns", Name: "s"}, types.NamespacedName{Namespace: "ns", Name: "other"}
	for range 3 {
		p.AskFor(s)
	}
	if len(p.Ask) != 1 {
		t.Fatalf("three claims waiting for one Secret asked %d times within a second, want once", len(p.Ask))
	}
	p.AskFor(other) // the channel is full: dropped, not blocking
	if got := client.ObjectKeyFromObject((<-p.Ask).Object); got != s {
		t.Fatalf("the protector was asked to look at %s, want %s", got, s)
	}
	p.AskFor(other)
	if len(p.Ask) != 1 || client.ObjectKeyFromObject((<-p.Ask).Object) != other {
		t.Fatal("an ask dropped on a full channel is not made by the next claim that waits")
	}

	a, b := record.ObjectRef{Namespace: "ns", Name: "s", Key: "a"}, record.ObjectRef{Namespace: "ns", Name: "s", Key: "b"}
	p.Set(s, []string{"a"})
	if !p.Has(a) || p.Has(b) {
		t.Fatalf("after protecting key a: Has(a) %v, Has(b) %v; want true, false", p.Has(a), p.Has(b))
	}
	p.Set(s, nil)
	if p.Has(a) {
		t.Fatal("a Secret let go still counts as protected")
	}
}
