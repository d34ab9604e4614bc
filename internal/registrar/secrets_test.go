package registrar_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// A burst of registrations under one ready Secret reads it once a second, not once per
// claim; a Secret that is not ready yet is read every time (its protection is awaited).
func TestGetRecentReusesAReadyRead(t *testing.T) {
	ctx := context.Background()
	value := []byte("a-secret-value-1")
	ready := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ready",
		Finalizers:  []string{ipamv1alpha1.SecretInUseFinalizer},
		Annotations: map[string]string{}}, Data: map[string][]byte{"secret": value}}
	record.SetFingerprints(ready.Annotations, map[string]string{"secret": record.Fingerprint(value)})
	waiting := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "waiting"}, Data: map[string][]byte{"secret": value}}
	gets := map[string]int{}
	c := interceptor.NewClient(fake.NewClientBuilder().WithObjects(ready, waiting).Build(), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			gets[key.Name]++
			return c.Get(ctx, key, obj, opts...)
		},
	})
	s := &registrar.Secrets{Reader: c, Writer: c, Default: types.NamespacedName{Namespace: "ns", Name: "default"}}
	for range 5 {
		for _, name := range []string{"ready", "waiting"} {
			sec, err := s.GetRecent(ctx, record.ObjectRef{Namespace: "ns", Name: name, Key: "secret"}, true)
			if err != nil || string(sec.Value) != string(value) {
				t.Fatalf("%s: %v", name, err)
			}
		}
	}
	if gets["ready"] != 1 || gets["waiting"] != 5 {
		t.Fatalf("GETs: ready %d (want 1), waiting %d (want 5)", gets["ready"], gets["waiting"])
	}
}

// Claims that wait for a Secret key to be protected are asked for once (not once per
// claim), handed out by the Set that protects their key (not another key's), and a
// claim that comes after it is told at once.
func TestProtectedAwait(t *testing.T) {
	p := &registrar.Protected{Ask: make(chan event.GenericEvent, 8)}
	secret := types.NamespacedName{Namespace: "ns", Name: "s"}
	a := record.ObjectRef{Namespace: "ns", Name: "s", Key: "a"}
	b := record.ObjectRef{Namespace: "ns", Name: "s", Key: "b"}
	claim := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "c", Name: n} }
	for _, w := range []struct {
		ref   record.ObjectRef
		claim string
	}{{a, "1"}, {a, "2"}, {b, "3"}, {a, "1"}} {
		if p.Await(w.ref, claim(w.claim)) {
			t.Fatalf("claim %s: protected before anything was", w.claim)
		}
	}
	if len(p.Ask) != 1 {
		t.Fatalf("the protector was asked %d times, want once", len(p.Ask))
	}
	if e := <-p.Ask; e.Object.GetNamespace() != "ns" || e.Object.GetName() != "s" {
		t.Fatalf("asked for %s/%s", e.Object.GetNamespace(), e.Object.GetName())
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
	if !p.Await(a, claim("4")) {
		t.Fatal("key a is protected, but a new claim is told to wait")
	}
	if got := p.Set(secret, []string{"a", "b"}); !slices.Equal(got, []types.NamespacedName{claim("3")}) {
		t.Fatalf("protecting key b woke %v, want [c/3]", got)
	}
}

// The first claim of a process to write a record naming a Secret key that is not
// protected is the one; the others are told so until the key is protected.
func TestProtectedRecordedByAnother(t *testing.T) {
	p := &registrar.Protected{}
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
}
