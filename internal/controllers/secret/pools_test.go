package secret_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/controllers/secret"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// protectorWithSecrets is a protector that knows the default Secret and keeps what it
// protected in Secrets.Protected, as the manager's does.
func protectorWithSecrets(c client.Client) *secret.Protector {
	secrets := &registrar.Secrets{Reader: c, Writer: c, Default: types.NamespacedName{Namespace: "provider", Name: "default"}}
	return &secret.Protector{Client: c, Reader: c, Secrets: secrets, Resync: time.Minute,
		Ledger: &secret.Ledger{Client: c, Reader: c, Key: ledgerKey}}
}

func poolNaming(name string) *ipamv1alpha1.VitistackIPPool {
	return &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "pool"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", SecretRef: &ipamv1alpha1.SecretReference{Name: name}}}
}

// The Secret a pool names, as the protector leaves it after one look: its finalizer,
// and the fingerprint of each key.
func lookAt(t *testing.T, p *secret.Protector, c client.Client, key types.NamespacedName) (reconcile.Result, *corev1.Secret) {
	t.Helper()
	ctx := ctrl.LoggerInto(context.Background(), ctrl.Log)
	res, err := p.Reconcile(ctx, ctrl.Request{NamespacedName: key})
	if err != nil {
		t.Fatal(err)
	}
	got := &corev1.Secret{}
	if err := c.Get(ctx, key, got); err != nil {
		return res, nil
	}
	return res, got
}

// A pool's Secret is protected without any record; a value the IPAM-API would refuse
// gets no fingerprint, so fixing it in place is no change of a value in use; a delete
// of it is not held by the pool alone.
func TestAPoolsSecretIsProtectedUntilItIsDeleted(t *testing.T) {
	ctx := context.Background()
	owner := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "owner"}, Data: map[string][]byte{"secret": []byte("short")}}
	key := client.ObjectKeyFromObject(owner)
	c := newClient(owner, poolNaming("owner"))
	p := protectorWithSecrets(c)

	_, got := lookAt(t, p, c, key)
	if !controllerutil.ContainsFinalizer(got, ipamv1alpha1.SecretInUseFinalizer) {
		t.Fatalf("the Secret a pool names was not protected: finalizers %v", got.Finalizers)
	}
	if fp := record.Fingerprints(got.Annotations); len(fp) != 0 {
		t.Errorf("a value the IPAM-API refuses was fingerprinted: %v", fp)
	}

	const fixed = "a-value-of-the-right-length"
	got.Data["secret"] = []byte(fixed)
	must(t, c.Update(ctx, got))
	_, got = lookAt(t, p, c, key)
	if fp := record.Fingerprints(got.Annotations)["secret"]; fp != record.Fingerprint([]byte(fixed)) {
		t.Errorf("the fixed value is not the one fingerprinted: %q", fp)
	}
	if !p.Secrets.Protected.Has(record.ObjectRef{Namespace: "apps", Name: "owner", Key: "secret"}) {
		t.Error("the protector does not count the key as protected")
	}

	must(t, c.Delete(ctx, got))
	if _, got = lookAt(t, p, c, key); got != nil {
		t.Errorf("a Secret that only a pool names stays after its delete: finalizers %v", got.Finalizers)
	}

	// Made again, protected, and then gone behind the protector's back (its finalizer
	// stripped): it no longer counts as protected, so the next one is looked at.
	must(t, c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "owner"}, Data: map[string][]byte{"secret": []byte(fixed)}}))
	_, got = lookAt(t, p, c, key)
	got.Finalizers = nil
	must(t, c.Update(ctx, got))
	must(t, c.Delete(ctx, got))
	lookAt(t, p, c, key)
	if p.Secrets.Protected.Has(record.ObjectRef{Namespace: "apps", Name: "owner", Key: "secret"}) {
		t.Error("a Secret that is gone still counts as protected: one made again under its name would not be looked at")
	}
}

// A pool that names a Secret that does not exist yet has it looked at again, so one
// created later is protected before a claim asks; its creation is looked at even while
// the protector counts the Secret as protected (it may be letting it go right now).
func TestAPoolsMissingSecretIsLookedAtAgain(t *testing.T) {
	c := newClient(poolNaming("later"))
	p := protectorWithSecrets(c)
	key := types.NamespacedName{Namespace: "apps", Name: "later"}
	if res, _ := lookAt(t, p, c, key); res.RequeueAfter != time.Minute {
		t.Errorf("a missing Secret a pool names is looked at again after %v, want the resync interval", res.RequeueAfter)
	}

	// The pool's create event enqueues its Secret whatever the protector remembers.
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	p.Secrets.Protected.Set(key, []string{"secret"})
	secret.PoolEvents(p).Create(context.Background(), event.CreateEvent{Object: poolNaming("later")}, q)
	if q.Len() != 1 {
		t.Errorf("a new pool's Secret that counts as protected was not looked at: %d enqueued", q.Len())
	}
}

// A GlobalVitistackIPPool's Secret is in the namespace its secretRef names. A pool that
// switches to another Secret has that one looked at at once, and the one it named
// before a moment later: the new Secret is protected, the old one let go (nothing is
// registered under it).
func TestAGlobalPoolSwitchingSecretsMovesTheProtection(t *testing.T) {
	ctx := context.Background()
	value := map[string][]byte{"secret": []byte("a-value-of-the-right-length")}
	first := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenants", Name: "first"}, Data: value}
	second := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenants", Name: "second"}, Data: value}
	pool := &ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: "global"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", SecretRef: &ipamv1alpha1.SecretReference{Namespace: "tenants", Name: "first"}}}
	c := newClient(first, second, pool)
	p := protectorWithSecrets(c)
	protected := func(s *corev1.Secret) bool {
		_, got := lookAt(t, p, c, client.ObjectKeyFromObject(s))
		return controllerutil.ContainsFinalizer(got, ipamv1alpha1.SecretInUseFinalizer)
	}
	if !protected(first) {
		t.Fatal("the Secret in the namespace the global pool's secretRef names was not protected")
	}

	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	switched := pool.DeepCopy()
	switched.Spec.SecretRef.Name = "second"
	must(t, c.Update(ctx, switched))
	secret.PoolEvents(p).Update(ctx, event.UpdateEvent{ObjectOld: pool, ObjectNew: switched}, q)
	if q.Len() != 1 {
		t.Fatalf("%d Secrets looked at at once after the switch, want the new one", q.Len())
	}
	if r, _ := q.Get(); r.NamespacedName != client.ObjectKeyFromObject(second) {
		t.Fatalf("%s looked at at once after the switch, want %s", r.NamespacedName, client.ObjectKeyFromObject(second))
	}
	if !protected(second) {
		t.Error("the Secret the pool switched to was not protected")
	}
	if protected(first) {
		t.Error("the Secret the pool no longer names keeps its protection, with nothing registered under it")
	}
}
