package controllers

import (
	"context"
	"crypto/rand"
	"math/big"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// DefaultSecretKey is the key of the value in every IPAM-API secret.
const DefaultSecretKey = "secret"

// errSecretNotFound marks a Secret (or key) that does not exist: a user must create it.
type errSecretNotFound struct{ ref objectRef }

func (e *errSecretNotFound) Error() string {
	return "Secret " + e.ref.Namespace + "/" + e.ref.Name + " with key " + e.ref.Key + " not found"
}

// errSecretInvalid marks a Secret whose value the IPAM-API cannot accept.
type errSecretInvalid struct {
	ref objectRef
	n   int
}

func (e *errSecretInvalid) Error() string {
	return "the value of Secret " + e.ref.Namespace + "/" + e.ref.Name + " key " + e.ref.Key +
		" must be 8 to 64 characters long for the IPAM-API (it has " + strconv.Itoa(e.n) + ")"
}

// Secrets reads IPAM-API secrets and CA bundles straight from the API server (Secrets
// are not cached, so the manager needs no cluster-wide list/watch on them) and creates
// the default secret on first use.
type Secrets struct {
	// Reader reads Secrets and ConfigMaps uncached.
	Reader client.Reader
	// Writer creates the default secret.
	Writer client.Writer
	// Default is the provider's default secret.
	Default types.NamespacedName

	createMu sync.Mutex
}

// Value returns the secret value ref points at. With create, a missing default secret
// is created first (never one named by a user). With protect, the Secret gets the
// ipam.vitistack.io/secret-in-use finalizer, so it outlives the addresses it owns.
func (s *Secrets) Value(ctx context.Context, ref objectRef, create, protect bool) (ipamapi.Secret, error) {
	if create && ref.Namespace == s.Default.Namespace && ref.Name == s.Default.Name && ref.Key == DefaultSecretKey {
		if err := s.EnsureDefault(ctx); err != nil {
			return "", err
		}
	}
	sec := &corev1.Secret{}
	if err := s.Reader.Get(ctx, secretKey(ref), sec); err != nil {
		if apierrors.IsNotFound(err) {
			return "", &errSecretNotFound{ref: ref}
		}
		return "", errors.Wrapf(err, "reading Secret %s/%s", ref.Namespace, ref.Name)
	}
	v, ok := sec.Data[ref.Key]
	if !ok {
		return "", &errSecretNotFound{ref: ref}
	}
	if n := utf8.RuneCount(v); n < 8 || n > 64 { // the IPAM-API counts characters
		return "", &errSecretInvalid{ref: ref, n: n}
	}
	if protect && !controllerutil.ContainsFinalizer(sec, ipamv1alpha1.SecretInUseFinalizer) {
		before := sec.DeepCopy()
		controllerutil.AddFinalizer(sec, ipamv1alpha1.SecretInUseFinalizer)
		if err := s.Writer.Patch(ctx, sec, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return "", errors.Wrapf(err, "adding finalizer %s to Secret %s/%s", ipamv1alpha1.SecretInUseFinalizer, ref.Namespace, ref.Name)
		}
	}
	return ipamapi.Secret(v), nil
}

// Unprotect removes the secret-in-use finalizer from a Secret.
func (s *Secrets) Unprotect(ctx context.Context, ref objectRef) error {
	sec := &corev1.Secret{}
	if err := s.Reader.Get(ctx, secretKey(ref), sec); err != nil {
		return client.IgnoreNotFound(errors.Wrapf(err, "reading Secret %s/%s", ref.Namespace, ref.Name))
	}
	before := sec.DeepCopy()
	if !controllerutil.RemoveFinalizer(sec, ipamv1alpha1.SecretInUseFinalizer) {
		return nil
	}
	err := s.Writer.Patch(ctx, sec, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	return client.IgnoreNotFound(errors.Wrapf(err, "removing finalizer %s from Secret %s/%s", ipamv1alpha1.SecretInUseFinalizer, ref.Namespace, ref.Name))
}

// EnsureDefault creates the default secret unless it exists. Safe when many claims
// arrive at once, here and in other processes: the API server's create decides, and
// an existing secret is never changed.
func (s *Secrets) EnsureDefault(ctx context.Context) error {
	s.createMu.Lock()
	defer s.createMu.Unlock()
	if err := s.Reader.Get(ctx, s.Default, &corev1.Secret{}); err == nil || !apierrors.IsNotFound(err) {
		return errors.Wrapf(err, "reading default Secret %s", s.Default)
	}
	value, err := RandomString(32)
	if err != nil {
		return err
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: s.Default.Namespace,
			Name:      s.Default.Name,
			Labels:    map[string]string{"app.kubernetes.io/managed-by": "cluster-api-ipam-provider-vitistack"},
			Annotations: map[string]string{
				"ipam.vitistack.io/description": "Owns the addresses this provider registers in the IPAM-API. Deleting or changing it orphans them.",
			},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{DefaultSecretKey: []byte(value)},
	}
	err = s.Writer.Create(ctx, sec)
	if apierrors.IsNotFound(err) {
		// Its namespace does not exist yet (ipam-system on a cluster the IPAM-operator
		// never ran on): create it, then the Secret.
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.Default.Namespace}}
		if err := s.Writer.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
			return errors.Wrapf(err, "creating Namespace %s for the default Secret", s.Default.Namespace)
		}
		err = s.Writer.Create(ctx, sec)
	}
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return errors.Wrapf(err, "creating default Secret %s", s.Default)
	}
	return nil
}

// CABundle returns the PEM bundle ref points at, nil when ref is empty.
func (s *Secrets) CABundle(ctx context.Context, ref objectRef) ([]byte, error) {
	if ref.Name == "" {
		return nil, nil
	}
	key := secretKey(ref)
	var data map[string][]byte
	if ref.Kind == "Secret" {
		sec := &corev1.Secret{}
		if err := s.Reader.Get(ctx, key, sec); err != nil {
			return nil, errors.Wrapf(err, "reading CA bundle Secret %s", key)
		}
		data = sec.Data
	} else {
		cm := &corev1.ConfigMap{}
		if err := s.Reader.Get(ctx, key, cm); err != nil {
			return nil, errors.Wrapf(err, "reading CA bundle ConfigMap %s", key)
		}
		data = map[string][]byte{}
		for k, v := range cm.Data {
			data[k] = []byte(v)
		}
		for k, v := range cm.BinaryData {
			data[k] = v
		}
	}
	if v, ok := data[ref.Key]; ok && len(v) > 0 {
		return v, nil
	}
	return nil, errors.Errorf("%s %s has no key %q", ref.Kind, key, ref.Key)
}

const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

// RandomString returns n characters from crypto/rand over [a-zA-Z0-9].
func RandomString(n int) (string, error) {
	b := make([]byte, n)
	max := big.NewInt(int64(len(alphabet)))
	for i := range b {
		x, err := rand.Int(rand.Reader, max)
		if err != nil {
			return "", errors.Wrap(err, "reading crypto/rand")
		}
		b[i] = alphabet[x.Int64()]
	}
	return string(b), nil
}
