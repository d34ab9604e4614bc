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

// secretsValue is the value of the Secrets of the GetRecent tests.
var secretsValue = []byte("a-secret-value-1")

// protectedSecret is a ready Secret (protected, fingerprinted) with these keys.
func protectedSecret(name string, keys ...string) *corev1.Secret {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
		Finalizers: []string{ipamv1alpha1.SecretInUseFinalizer}, Annotations: map[string]string{}}, Data: map[string][]byte{}}
	fp := map[string]string{}
	for _, k := range keys {
		sec.Data[k], fp[k] = secretsValue, record.Fingerprint(secretsValue)
	}
	record.SetFingerprints(sec.Annotations, fp)
	return sec
}

// countedSecrets reads objs, counting the GETs by Secret name; getRecent reads ref
// and expects secretsValue.
func countedSecrets(t *testing.T, objs ...client.Object) (s *registrar.Secrets, gets map[string]int, getRecent func(ref record.ObjectRef)) {
	gets = map[string]int{}
	c := interceptor.NewClient(fake.NewClientBuilder().WithObjects(objs...).Build(), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			gets[key.Name]++
			return c.Get(ctx, key, obj, opts...)
		},
	})
	s = &registrar.Secrets{Reader: c, Writer: c, Default: types.NamespacedName{Namespace: "ns", Name: "default"}}
	return s, gets, func(ref record.ObjectRef) {
		t.Helper()
		sec, err := s.GetRecent(context.Background(), ref, true)
		if err != nil || string(sec.Value) != string(secretsValue) {
			t.Fatalf("%s: %v", ref, err)
		}
	}
}

// A burst of registrations under one ready Secret reads it once a second, not once per
// claim; a Secret that is not ready yet is read every time (its protection is awaited).
func TestGetRecentReusesAReadyRead(t *testing.T) {
	waiting := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "waiting"}, Data: map[string][]byte{"secret": secretsValue}}
	_, gets, getRecent := countedSecrets(t, protectedSecret("ready", "secret"), waiting)
	for range 5 {
		for _, name := range []string{"ready", "waiting"} {
			getRecent(record.ObjectRef{Namespace: "ns", Name: name, Key: "secret"})
		}
	}
	if gets["ready"] != 1 || gets["waiting"] != 5 {
		t.Fatalf("GETs: ready %d (want 1), waiting %d (want 5)", gets["ready"], gets["waiting"])
	}
}

// What the API server answered the Secret protector about a Secret it protected serves
// the claims it wakes: they read it no more. A key the protector does not vouch for, or
// a Secret that is not ready, is still read.
func TestRememberServesTheClaimsTheProtectorWakes(t *testing.T) {
	protected := protectedSecret("protected", "secret", "other")
	bare := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "bare"}, Data: map[string][]byte{"secret": secretsValue}}
	s, gets, getRecent := countedSecrets(t, protected, bare)
	s.Remember(protected, []string{"secret"})
	s.Remember(bare, []string{"secret"})
	for _, ref := range []record.ObjectRef{{Namespace: "ns", Name: "protected", Key: "secret"},
		{Namespace: "ns", Name: "protected", Key: "other"}, {Namespace: "ns", Name: "bare", Key: "secret"}} {
		getRecent(ref)
	}
	if gets["protected"] != 1 || gets["bare"] != 1 {
		t.Fatalf("GETs: protected %d (want 1, for the key not remembered), bare %d (want 1)", gets["protected"], gets["bare"])
	}
}

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

// A read of a Secret that began before the Secret was forgotten (the protector let it
// go) is not kept for the next claim: it may show the Secret protected when it is not
// any more. A read that begins after is.
func TestAReadUnderWayWhenTheSecretIsForgottenIsNotKept(t *testing.T) {
	ref := record.ObjectRef{Namespace: "ns", Name: "owner", Key: "secret"}
	var s *registrar.Secrets
	gets, forgetDuring := 0, true
	c := interceptor.NewClient(fake.NewClientBuilder().WithObjects(protectedSecret("owner", "secret")).Build(), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			gets++
			err := c.Get(ctx, key, obj, opts...)
			if forgetDuring {
				s.Forget(key) // the protector lets the Secret go while this read is under way
			}
			return err
		},
	})
	s = &registrar.Secrets{Reader: c, Writer: c}
	read := func() {
		t.Helper()
		if _, err := s.GetRecent(context.Background(), ref, false); err != nil {
			t.Fatal(err)
		}
	}
	read()
	read()
	if gets != 2 {
		t.Fatalf("%d reads, want 2: a read under way when the Secret was forgotten served the next claim", gets)
	}
	forgetDuring = false
	read()
	read()
	if gets != 3 {
		t.Errorf("%d reads, want 3: a read of a Secret nobody forgot was not kept for the next claim", gets)
	}
}
