package registrar_test

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar/registrartest"
)

// The claims that wait for a Secret ask the protector to look at it once, not once
// per claim; an ask made before the protector runs is dropped, and made again by the
// next claim that waits. Set says which keys are protected, and forgets them all when
// given none.
func TestProtectedAskForAndSet(t *testing.T) {
	p := &registrar.Protected{Ask: &registrar.Queue{}}
	s, other := types.NamespacedName{Namespace: "ns", Name: "s"}, types.NamespacedName{Namespace: "ns", Name: "other"}
	p.AskFor(other) // the protector does not run yet: dropped
	q := registrartest.Start(t, p.Ask)
	for range 3 {
		p.AskFor(s)
	}
	p.AskFor(other)
	if got := registrartest.Drain(q); !slices.Equal(got, []types.NamespacedName{s, other}) {
		t.Fatalf("three claims waiting for %s and one for %s (asked before the protector ran) asked for %v; want each once", s, other, got)
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
