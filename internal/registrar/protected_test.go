package registrar_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// Claims that wait for a Secret key to be protected are asked for once (not once per
// claim), told how long claims have waited for the Secret (from the first, unless no
// claim waited for minutes: then a new wait begins), handed out
// by the Set that protects their key (not another key's), and a claim that comes after
// it is told at once.
func TestProtectedAwait(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	p := &registrar.Protected{Ask: make(chan event.GenericEvent, 8), Clock: clk}
	secret := types.NamespacedName{Namespace: "ns", Name: "s"}
	a := record.ObjectRef{Namespace: "ns", Name: "s", Key: "a"}
	b := record.ObjectRef{Namespace: "ns", Name: "s", Key: "b"}
	claim := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "c", Name: n} }
	for _, w := range []struct {
		ref   record.ObjectRef
		claim string
	}{{a, "1"}, {a, "2"}, {b, "3"}, {a, "1"}} {
		if waited, protected := p.Await(w.ref, claim(w.claim)); protected || waited != 0 {
			t.Fatalf("claim %s: protected (%v) before anything was, or waited %v in no time", w.claim, protected, waited)
		}
	}
	if len(p.Ask) != 1 {
		t.Fatalf("the protector was asked %d times, want once", len(p.Ask))
	}
	if e := <-p.Ask; e.Object.GetNamespace() != "ns" || e.Object.GetName() != "s" {
		t.Fatalf("asked for %s/%s", e.Object.GetNamespace(), e.Object.GetName())
	}
	clk.SetTime(clk.Now().Add(4 * time.Second))
	if waited, _ := p.Await(b, claim("5")); waited != 4*time.Second {
		t.Fatalf("4 s after the first claim waited for the Secret, a new one is told they waited %v", waited)
	}
	if len(p.Ask) != 1 {
		t.Fatalf("the protector was asked %d times in the 4 s since, want once more", len(p.Ask))
	}
	if got := p.Set(secret, nil); got != nil {
		t.Fatalf("nothing protected, woken %v", got)
	}
	got := p.Set(secret, []string{"a"})
	slices.SortFunc(got, func(x, y types.NamespacedName) int { return strings.Compare(x.String(), y.String()) })
	if want := []types.NamespacedName{claim("1"), claim("2")}; !slices.Equal(got, want) {
		t.Fatalf("protecting key a woke %v, want %v", got, want)
	}
	if got := p.Set(secret, []string{"a"}); got != nil {
		t.Fatalf("woken twice: %v", got)
	}
	if _, protected := p.Await(a, claim("4")); !protected {
		t.Fatal("key a is protected, but a new claim is told to wait")
	}
	got = p.Set(secret, []string{"a", "b"})
	slices.SortFunc(got, func(x, y types.NamespacedName) int { return strings.Compare(x.String(), y.String()) })
	if want := []types.NamespacedName{claim("3"), claim("5")}; !slices.Equal(got, want) {
		t.Fatalf("protecting key b woke %v, want %v", got, want)
	}
	p.Set(secret, nil) // let go
	if waited, protected := p.Await(b, claim("6")); protected || waited != 0 {
		t.Fatalf("once every claim waiting for the Secret was woken, a new wait starts at 0, not %v", waited)
	}
	clk.SetTime(clk.Now().Add(time.Minute))
	if waited, _ := p.Await(b, claim("6")); waited != time.Minute {
		t.Fatalf("a claim that looks again a minute later is told the claims waited %v, want 1m", waited)
	}
	clk.SetTime(clk.Now().Add(3 * time.Minute))
	if waited, _ := p.Await(b, claim("7")); waited != 0 {
		t.Fatalf("after 3 minutes in which no claim waited for the Secret, a new wait starts at 0, not %v", waited)
	}
	if got := p.Set(secret, []string{"b"}); !slices.Equal(got, []types.NamespacedName{claim("7")}) {
		t.Fatalf("protecting key b after a wait began anew woke %v, want only [c/7] (c/6 went with the old wait)", got)
	}
}

// The first claim of a process to write a record naming a Secret key that is not
// protected is the one; the others are told so until the key is protected, or for a
// few seconds at most (then the next writes its own).
func TestProtectedRecordedByAnother(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	p := &registrar.Protected{Clock: clk}
	a := record.ObjectRef{Namespace: "ns", Name: "s", Key: "a"}
	b := record.ObjectRef{Namespace: "ns", Name: "s", Key: "b"}
	if p.RecordedByAnother(a, "first") {
		t.Fatal("nobody records key a yet")
	}
	if p.RecordedByAnother(a, "first") {
		t.Fatal("the first claim is told that another records its own record")
	}
	if !p.RecordedByAnother(a, "second") {
		t.Fatal("the second claim is not told that the first records key a")
	}
	if p.RecordedByAnother(b, "second") {
		t.Fatal("key b is not recorded by anyone yet")
	}
	p.Set(types.NamespacedName{Namespace: "ns", Name: "s"}, []string{"a"})
	if p.RecordedByAnother(a, "third") {
		t.Fatal("key a is protected: nobody needs to wait for the first record")
	}
	if !p.RecordedByAnother(b, "third") {
		t.Fatal("protecting key a forgot who records key b")
	}
	clk.SetTime(clk.Now().Add(6 * time.Second))
	if p.RecordedByAnother(b, "fourth") {
		t.Fatal("6 s after the second claim began the first record of key b, a fourth claim still waits for it")
	}
	if !p.RecordedByAnother(b, "fifth") {
		t.Fatal("the fourth claim, now writing the first record of key b, is not the one the fifth waits for")
	}
}
