package registrar

import (
	"context"
	"crypto/rand"
	"math/big"
	"strconv"
	"unicode/utf8"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// SecretNotFoundError marks a Secret (or key) that does not exist: a user must create it.
type SecretNotFoundError struct {
	Ref record.ObjectRef
	// NoKey is true when the Secret exists but has no key Ref.Key.
	NoKey bool
	// Hint says what to do, when there is more to say than "create it".
	Hint string
}

func (e *SecretNotFoundError) Error() string {
	s := "Secret " + e.Ref.Namespace + "/" + e.Ref.Name + " with key " + e.Ref.Key + " not found"
	if e.NoKey {
		s = "Secret " + e.Ref.Namespace + "/" + e.Ref.Name + " has no key \"" + e.Ref.Key + "\""
	}
	if e.Hint != "" {
		s += ": " + e.Hint
	}
	return s
}

// SecretInvalidError marks a Secret whose value the IPAM-API cannot accept.
type SecretInvalidError struct {
	Ref record.ObjectRef
	N   int
	// ResourceVersion is the Secret's, so a fix is noticed.
	ResourceVersion string
}

func (e *SecretInvalidError) Error() string {
	return "the value of Secret " + e.Ref.Namespace + "/" + e.Ref.Name + " key " + e.Ref.Key +
		" must be 8 to 64 characters long for the IPAM-API (it has " + strconv.Itoa(e.N) + ")"
}

// Secret is what one read of an IPAM-API Secret found.
type Secret struct {
	Ref record.ObjectRef
	// Value is the secret value; it never goes into a log, an event, an error or an object.
	Value ipamapi.Secret
	// ResourceVersion changes whenever the Secret does.
	ResourceVersion string
	// Protected is true when the Secret has the secret-in-use finalizer.
	Protected bool
	// Deleting is true when the Secret is being deleted.
	Deleting bool
	// Fingerprint is the fingerprint recorded on the Secret for Ref.Key ("" if none).
	Fingerprint string
	// LettingGo is true while the Secret protector is letting the Secret go.
	LettingGo bool
}

// Changed reports whether the value differs from the one the Secret's addresses were
// registered under (false while none is recorded).
func (s *Secret) Changed() bool {
	return s.Fingerprint != "" && s.Fingerprint != record.Fingerprint([]byte(s.Value))
}

// ready reports whether new registrations may be made under the Secret: it is protected and
// fingerprinted with its present value, not being let go by the Secret protector, and not
// being deleted.
func (s *Secret) ready() bool {
	return s.Protected && !s.Deleting && !s.LettingGo && s.Fingerprint == record.Fingerprint([]byte(s.Value))
}

// Usable reports whether a request may go out under the Secret's value: a new
// registration (forRelease false) only under a ready one (below); a release, or a request about
// an address registered under it, only under the value its fingerprint was taken of (a
// request under another value would find nothing, and abandon the address). The one rule
// for every request the provider sends under a Secret.
func (s *Secret) Usable(forRelease bool) bool {
	if !forRelease {
		return s.ready()
	}
	return s.Fingerprint != "" && !s.Changed()
}

// Secrets reads IPAM-API secrets and CA bundles uncached (the manager needs no cluster-wide
// list/watch on Secrets) and creates the default secret on first use.
type Secrets struct {
	// Reader reads Secrets and ConfigMaps uncached.
	Reader client.Reader
	// Writer creates the default secret and writes the protection of Secrets (Protect).
	Writer client.Writer
	// Default is the provider's default secret.
	Default types.NamespacedName
	// Protected is what the Secret protector last made sure of.
	Protected Protected
	// Ledger lists a Secret before Protect gives it the secret-in-use finalizer, so
	// that every new leader's Secret protector looks at it again (nil: not listed).
	Ledger Ledger
}

// Ledger lists the Secrets and CA bundles the provider protects with its finalizers.
type Ledger interface {
	// Set lists the Secret (listed) or takes it off the list.
	Set(ctx context.Context, secret types.NamespacedName, listed bool) error
}

// Get reads the Secret ref points at, with one uncached GET. With createDefault, a
// missing default secret is created first (never one named by a user).
func (s *Secrets) Get(ctx context.Context, ref record.ObjectRef, createDefault bool) (*Secret, error) {
	sec := &corev1.Secret{}
	err := s.Reader.Get(ctx, ref.ObjectKey(), sec)
	if apierrors.IsNotFound(err) && createDefault && ref.Equal(defaultRef(s.Default)) {
		sec, err = s.createDefault(ctx)
	}
	if err != nil {
		var nf *SecretNotFoundError
		if apierrors.IsNotFound(err) {
			return nil, &SecretNotFoundError{Ref: ref}
		} else if errors.As(err, &nf) {
			return nil, err
		}
		return nil, errors.Wrapf(err, "reading Secret %s/%s", ref.Namespace, ref.Name)
	}
	out, err := secretFrom(ref, sec)
	if err != nil {
		return nil, err
	}
	if !out.ready() {
		s.Protected.Set(ref.ObjectKey(), nil) // the protector is asked again by the next record naming it
	}
	return out, nil
}

// Protect makes ref's Secret ready for new registrations and returns it as the API server
// has it then. Its caller has written the record that names the Secret first. Read
// uncached, a Secret without the secret-in-use finalizer or the fingerprint of ref's key
// gets them (the fingerprint of its value now), listed in the ledger before; one the
// Secret protector is letting go loses the letting-go mark in the same write. The write is
// locked to the version read and tried again after a conflict: either the protector's
// last uncached look for records finds the caller's record, or its own write is refused
// (two-phase letting go, see SecretLettingGoAnnotation). A Secret being deleted, or whose
// value changed since its fingerprint, is returned as it is, not usable: nothing new is
// registered under it. A refusal's text has the Secret's values cut out.
func (s *Secrets) Protect(ctx context.Context, ref record.ObjectRef) (*Secret, error) {
	var out *Secret
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sec := &corev1.Secret{}
		if err := s.Reader.Get(ctx, ref.ObjectKey(), sec); err != nil {
			if apierrors.IsNotFound(err) {
				return &SecretNotFoundError{Ref: ref}
			}
			return errors.Wrapf(err, "reading Secret %s/%s", ref.Namespace, ref.Name)
		}
		got, err := secretFrom(ref, sec)
		if err != nil || got.ready() || got.Deleting || got.Changed() {
			out = got
			return err
		}
		if s.Ledger != nil {
			if err := s.Ledger.Set(ctx, ref.ObjectKey(), true); err != nil {
				return err
			}
		}
		before := sec.DeepCopy()
		if sec.Annotations == nil {
			sec.Annotations = map[string]string{}
		}
		fp := record.Fingerprints(sec.Annotations)
		if _, ok := fp[ref.Key]; !ok {
			fp[ref.Key] = record.Fingerprint([]byte(got.Value))
		}
		record.SetFingerprints(sec.Annotations, fp)
		delete(sec.Annotations, ipamv1alpha1.SecretLettingGoAnnotation)
		controllerutil.AddFinalizer(sec, ipamv1alpha1.SecretInUseFinalizer)
		err = PatchSecret(ctx, s.Writer, s.Reader, sec, before, "protecting")
		switch {
		case apierrors.IsNotFound(err):
			return &SecretNotFoundError{Ref: ref}
		case err != nil:
			return err
		}
		out, err = secretFrom(ref, sec)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// secretFrom is ref's key of sec.
func secretFrom(ref record.ObjectRef, sec *corev1.Secret) (*Secret, error) {
	v, ok := sec.Data[ref.Key]
	if !ok {
		return nil, &SecretNotFoundError{Ref: ref, NoKey: true,
			Hint: "add the key \"" + ref.Key + "\" with the IPAM-API secret (8 to 64 characters) to it"}
	}
	if !UsableValue(v) {
		return nil, &SecretInvalidError{Ref: ref, N: utf8.RuneCount(v), ResourceVersion: sec.ResourceVersion}
	}
	return &Secret{
		Ref:             ref,
		Value:           ipamapi.Secret(v),
		ResourceVersion: sec.ResourceVersion,
		Protected:       controllerutil.ContainsFinalizer(sec, ipamv1alpha1.SecretInUseFinalizer),
		Deleting:        !sec.DeletionTimestamp.IsZero(),
		Fingerprint:     record.Fingerprints(sec.Annotations)[ref.Key],
		LettingGo:       sec.Annotations[ipamv1alpha1.SecretLettingGoAnnotation] != "",
	}, nil
}

// UsableValue reports whether the IPAM-API accepts v as a secret: 8 to 64 characters, not bytes.
func UsableValue(v []byte) bool {
	n := utf8.RuneCount(v)
	return n >= 8 && n <= 64
}

// createDefault creates the default secret. Many claims, here and in other processes, may find
// it missing at once: the API server's create decides, the losers read the winner's, and an
// existing secret is never changed.
func (s *Secrets) createDefault(ctx context.Context) (*corev1.Secret, error) {
	value, err := RandomString(32)
	if err != nil {
		return nil, err
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: s.Default.Namespace,
			Name:      s.Default.Name,
			Labels:    map[string]string{"app.kubernetes.io/managed-by": "cluster-api-ipam-provider-vitistack"},
			Annotations: map[string]string{
				ipamv1alpha1.DescriptionAnnotation: "Owns the addresses this provider registers in the IPAM-API. Deleting or changing it orphans them.",
			},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{record.DefaultSecretKey: []byte(value)},
	}
	err = s.Writer.Create(ctx, sec)
	switch {
	case err == nil:
		return sec, nil
	case apierrors.IsAlreadyExists(err):
		got := &corev1.Secret{}
		return got, s.Reader.Get(ctx, s.Default, got)
	case apierrors.IsNotFound(err):
		return nil, &SecretNotFoundError{Ref: record.ObjectRef{Namespace: s.Default.Namespace, Name: s.Default.Name, Key: record.DefaultSecretKey},
			Hint: "its Namespace " + s.Default.Namespace + " does not exist, so the provider cannot create it; create the Namespace " +
				"(the provider's manifests ship it), or point --default-secret-namespace at an existing one"}
	}
	// A webhook's refusal may quote the new Secret, value and all.
	return nil, RedactSecret(errors.Wrapf(err, "creating default Secret %s", s.Default), sec)
}

// CABundle returns the PEM bundle ref points at, nil when ref is empty.
func (s *Secrets) CABundle(ctx context.Context, ref record.ObjectRef) ([]byte, error) {
	b, _, err := s.caBundle(ctx, ref)
	return b, err
}

// ErrCABundleNotProtected says the CA bundle has no ipam.vitistack.io/ca-bundle-in-use
// finalizer yet (or is being deleted): nothing new is registered through it, or a release
// could find it gone.
var ErrCABundleNotProtected = errors.New("the CA bundle is not protected yet")

// caBundle is CABundle, and whether the bundle is protected for new registrations: it
// carries the CA bundle protector's finalizer and is not being deleted (no bundle: true).
func (s *Secrets) caBundle(ctx context.Context, ref record.ObjectRef) ([]byte, bool, error) {
	if ref.Name == "" {
		return nil, true, nil
	}
	key := ref.ObjectKey()
	var data map[string][]byte
	var obj client.Object
	if ref.BundleKind() == "Secret" {
		sec := &corev1.Secret{}
		if err := s.Reader.Get(ctx, key, sec); err != nil {
			return nil, false, errors.Wrapf(err, "reading CA bundle Secret %s", key)
		}
		data, obj = sec.Data, sec
	} else {
		cm := &corev1.ConfigMap{}
		if err := s.Reader.Get(ctx, key, cm); err != nil {
			return nil, false, errors.Wrapf(err, "reading CA bundle ConfigMap %s", key)
		}
		data, obj = map[string][]byte{}, cm
		for k, v := range cm.Data {
			data[k] = []byte(v)
		}
		for k, v := range cm.BinaryData {
			data[k] = v
		}
	}
	protected := controllerutil.ContainsFinalizer(obj, ipamv1alpha1.CABundleInUseFinalizer) && obj.GetDeletionTimestamp().IsZero()
	if v, ok := data[ref.Key]; ok && len(v) > 0 {
		return v, protected, nil
	}
	return nil, false, errors.Errorf("%s %s has no key %q", ref.Kind, key, ref.Key)
}

const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

// RandomString returns n characters from crypto/rand over [a-zA-Z0-9].
func RandomString(n int) (string, error) {
	b := make([]byte, n)
	limit := big.NewInt(int64(len(alphabet)))
	for i := range b {
		x, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return "", errors.Wrap(err, "reading crypto/rand")
		}
		b[i] = alphabet[x.Int64()]
	}
	return string(b), nil
}
