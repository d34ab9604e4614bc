package registrar_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
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

// fakeLedger records what Protect lists.
type fakeLedger struct{ listed []types.NamespacedName }

func (l *fakeLedger) Set(_ context.Context, secret types.NamespacedName, listed bool) error {
	if listed {
		l.listed = append(l.listed, secret)
	}
	return nil
}

// Protect gives a Secret its finalizer and the fingerprint of the key's value, listed in
// the ledger first, and takes a Secret back from being let go; a write that meets
// another (the Secret protector's) reads the Secret again and tries once more, keeping
// what the other wrote. A Secret that is protected already, being deleted, or changed
// since its fingerprint is not written: the last two come back not usable.
func TestProtect(t *testing.T) {
	ctx := context.Background()
	ref := record.ObjectRef{Namespace: "ns", Name: "s", Key: "secret"}
	secretWith := func(mutate func(*corev1.Secret)) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", Annotations: map[string]string{}},
			Data: map[string][]byte{"secret": []byte("a-value-of-the-ipam-api"), "other": []byte("another-value-1")}}
		if mutate != nil {
			mutate(s)
		}
		return s
	}
	fp := record.Fingerprint([]byte("a-value-of-the-ipam-api"))
	for _, tc := range []struct {
		name     string
		secret   *corev1.Secret
		conflict bool // another writer adds a fingerprint of its own just before the first patch
		writes   int
		usable   bool
	}{
		{name: "new", secret: secretWith(nil), writes: 1, usable: true},
		{name: "being let go", secret: secretWith(func(s *corev1.Secret) {
			s.Finalizers = []string{ipamv1alpha1.SecretInUseFinalizer}
			s.Annotations[ipamv1alpha1.SecretLettingGoAnnotation] = "true"
			record.SetFingerprints(s.Annotations, map[string]string{"secret": fp})
		}), writes: 1, usable: true},
		{name: "met another writer", secret: secretWith(nil), conflict: true, writes: 2, usable: true},
		{name: "protected already", secret: secretWith(func(s *corev1.Secret) {
			s.Finalizers = []string{ipamv1alpha1.SecretInUseFinalizer}
			record.SetFingerprints(s.Annotations, map[string]string{"secret": fp})
		}), writes: 0, usable: true},
		{name: "value changed", secret: secretWith(func(s *corev1.Secret) {
			record.SetFingerprints(s.Annotations, map[string]string{"secret": record.Fingerprint([]byte("the-value-before-1"))})
		}), writes: 0},
		{name: "being deleted", secret: secretWith(func(s *corev1.Secret) {
			s.Finalizers = []string{"someone.else/keep"}
			s.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		}), writes: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := fake.NewClientBuilder().WithObjects(tc.secret).Build()
			writes, conflicted := 0, false
			c := interceptor.NewClient(base, interceptor.Funcs{
				Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
					writes++
					if tc.conflict && !conflicted {
						conflicted = true
						other := &corev1.Secret{}
						if err := c.Get(ctx, client.ObjectKeyFromObject(obj), other); err != nil {
							t.Fatal(err)
						}
						if other.Annotations == nil {
							other.Annotations = map[string]string{}
						}
						record.SetFingerprints(other.Annotations, map[string]string{"other": record.Fingerprint([]byte("another-value-1"))})
						if err := c.Update(ctx, other); err != nil {
							t.Fatal(err)
						}
					}
					return c.Patch(ctx, obj, p, opts...)
				},
			})
			ledger := &fakeLedger{}
			s := &registrar.Secrets{Reader: c, Writer: c, Ledger: ledger}
			got, err := s.Protect(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			if got.Usable(false) != tc.usable || writes != tc.writes {
				t.Fatalf("usable %v after %d writes, want %v after %d", got.Usable(false), writes, tc.usable, tc.writes)
			}
			stored := &corev1.Secret{}
			if err := base.Get(ctx, client.ObjectKeyFromObject(tc.secret), stored); err != nil {
				t.Fatal(err)
			}
			if !tc.usable {
				if len(ledger.listed) != 0 {
					t.Errorf("a Secret not protected is listed: %v", ledger.listed)
				}
				return
			}
			fps := record.Fingerprints(stored.Annotations)
			_, marked := stored.Annotations[ipamv1alpha1.SecretLettingGoAnnotation]
			if !slices.Contains(stored.Finalizers, ipamv1alpha1.SecretInUseFinalizer) || fps["secret"] != fp || marked {
				t.Fatalf("stored: finalizers %v, fingerprints %v, letting go %v; want the finalizer, the value's fingerprint, no mark",
					stored.Finalizers, fps, marked)
			}
			if tc.conflict && fps["other"] == "" {
				t.Errorf("the write after the conflict dropped the other writer's fingerprint: %v", fps)
			}
			if tc.writes > 0 && (len(ledger.listed) == 0 || ledger.listed[0] != (types.NamespacedName{Namespace: "ns", Name: "s"})) {
				t.Errorf("the Secret was protected without being listed in the ledger first: %v", ledger.listed)
			}
		})
	}
}
