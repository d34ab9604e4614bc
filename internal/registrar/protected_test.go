package registrar_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// Set says which keys of a Secret are protected, and forgets them all when given none.
func TestProtectedSet(t *testing.T) {
	p := &registrar.Protected{}
	s := types.NamespacedName{Namespace: "ns", Name: "s"}
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
