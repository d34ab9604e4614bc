package registrar_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// An admission webhook that refuses the default Secret may quote the object it was sent:
// the error the provider reports (it reaches the log and the claims' conditions) still
// says what failed and why, but holds neither the generated value, in any form, nor its
// fingerprint.
func TestARefusedDefaultSecretKeepsItsValueOutOfTheError(t *testing.T) {
	var sent *corev1.Secret
	c := interceptor.NewClient(fake.NewClientBuilder().Build(), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			sec, ok := obj.(*corev1.Secret)
			if !ok {
				return c.Create(ctx, obj, opts...)
			}
			sent = sec.DeepCopy()
			body, err := json.Marshal(sec)
			if err != nil {
				t.Fatal(err)
			}
			return apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, sec.Name,
				fmt.Errorf("policy no-opaque-secrets refused %s (value %q, fingerprint %s)", body, sec.Data[record.DefaultSecretKey],
					record.Fingerprint(sec.Data[record.DefaultSecretKey])))
		},
	})
	s := &registrar.Secrets{Reader: c, Writer: c, Default: types.NamespacedName{Namespace: "provider", Name: "default"}}
	_, err := s.Get(context.Background(), record.ObjectRef{Namespace: "provider", Name: "default", Key: record.DefaultSecretKey}, true)
	if err == nil || sent == nil {
		t.Fatalf("the refused default Secret: sent %v, error %v", sent != nil, err)
	}
	msg, value := err.Error(), sent.Data[record.DefaultSecretKey]
	for _, want := range []string{"creating default Secret provider/default", "policy no-opaque-secrets refused", "[redacted]"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q: %s", want, msg)
		}
	}
	for form, leak := range map[string]string{"the value": string(value), "its base64": base64.StdEncoding.EncodeToString(value),
		"its fingerprint": record.Fingerprint(value)} {
		if strings.Contains(msg, leak) {
			t.Errorf("the error has %s: %s", form, msg)
		}
	}
}
