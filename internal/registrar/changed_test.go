package registrar

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
)

// What the protector last found about a Secret's values, and when the claims bound
// under it have something new to show: a change found, a value restored, a Secret let
// go while changed. A first look that finds nothing changed is nothing new (a
// restarted manager's claims keep what they show until then).
func TestChangedValuesAreReportedWhenTheyDiffer(t *testing.T) {
	var p Protected
	secret := types.NamespacedName{Namespace: "ns", Name: "owner"}
	ref := record.ObjectRef{Namespace: "ns", Name: "owner", Key: "secret"}
	check := func(step string, differs, wantDiffers, wantChanged, wantKnown bool) {
		t.Helper()
		changed, known := p.Changed(ref)
		if differs != wantDiffers || changed != wantChanged || known != wantKnown {
			t.Errorf("%s: differs %v changed %v known %v, want %v %v %v", step, differs, changed, known, wantDiffers, wantChanged, wantKnown)
		}
	}
	changed, known := p.Changed(ref)
	if changed || known {
		t.Fatalf("before any look: changed %v known %v", changed, known)
	}
	check("first look, as fingerprinted", p.SetChanged(secret, nil, true), false, false, true)
	check("the value changed", p.SetChanged(secret, []string{"secret"}, true), true, true, true)
	check("looked again, still changed", p.SetChanged(secret, []string{"secret"}, true), false, true, true)
	check("restored", p.SetChanged(secret, nil, true), true, false, true)
	check("changed again", p.SetChanged(secret, []string{"secret"}, true), true, true, true)
	check("let go while changed", p.SetChanged(secret, nil, false), true, false, false)

	var restarted Protected
	differs := restarted.SetChanged(secret, []string{"secret"}, true)
	changed, known = restarted.Changed(ref)
	if !differs || !changed || !known {
		t.Errorf("a restarted manager's first look at a changed value: differs %v changed %v known %v", differs, changed, known)
	}
}
