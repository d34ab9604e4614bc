package registrar_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

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
