package secret_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/controllers/secret"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

var ledgerKey = types.NamespacedName{Namespace: "provider", Name: secret.LedgerName}

func newClient(objs ...client.Object) client.Client {
	b := fake.NewClientBuilder().WithScheme(manager.NewScheme()).WithObjects(objs...)
	index.Each(func(obj client.Object, field string, fn client.IndexerFunc) { b = b.WithIndex(obj, field, fn) })
	return b.Build()
}

// newLeader is a protector with empty memory: a process that has just been elected.
func newLeader(c client.Client) *secret.Protector {
	return &secret.Protector{Client: c, Reader: c, Ledger: &secret.Ledger{Client: c, Reader: c, Key: ledgerKey}}
}

// started runs what the controller's sources enqueue when a leader starts: the ledger's
// sweep. It returns the Secrets enqueued.
func started(t *testing.T, p *secret.Protector) []types.NamespacedName {
	t.Helper()
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := p.Ledger.Sweep(false).Start(ctx, q); err != nil {
		t.Fatal(err)
	}
	var out []types.NamespacedName
	for deadline := time.Now().Add(10 * time.Second); q.Len() == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	for q.Len() > 0 {
		r, _ := q.Get()
		out = append(out, r.NamespacedName)
		q.Done(r)
	}
	return out
}

func claimRecording(secretRef record.ObjectRef) *ipamv1.IPAddressClaim {
	c := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "node-1"}}
	reg := &record.Registration{Endpoint: "http://ipam", Zone: "inet", Family: ipamapi.FamilyIPv4, Address: "10.0.0.1/32",
		Identity: ipamapi.Identity{ServiceName: "node-1", NamespaceID: "ns", ClusterID: "cluster"}, Secret: secretRef, Phase: record.PhaseRegistered}
	reg.SetOn(c)
	return c
}

// A Secret whose last record goes while no leader runs (the leader died in the second
// after, before its coalescing delay ran out) is let go by the next leader, which hears
// no event for what is no longer there: the ledger lists it.
func TestANewLeaderLetsGoOfASecretWhoseLastRecordWentWhileNoneLed(t *testing.T) {
	ctx := ctrl.LoggerInto(context.Background(), ctrl.Log)
	owner := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "owner"}, Data: map[string][]byte{"secret": []byte("0123456789abcdef")}}
	key := client.ObjectKeyFromObject(owner)
	c := newClient(owner, claimRecording(record.ObjectRef{Namespace: "apps", Name: "owner", Key: "secret"}))

	first := newLeader(c)
	if _, err := first.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
		t.Fatal(err)
	}
	got := &corev1.Secret{}
	must(t, c.Get(ctx, key, got))
	if !controllerutil.ContainsFinalizer(got, ipamv1alpha1.SecretInUseFinalizer) {
		t.Fatalf("the Secret a claim records was not protected: finalizers %v", got.Finalizers)
	}

	// The claim goes; the leader dies before it looks at the Secret again.
	must(t, c.Delete(ctx, claimRecording(record.ObjectRef{})))

	next := newLeader(c)
	enqueued := started(t, next)
	if len(enqueued) != 1 || enqueued[0] != key {
		t.Fatalf("a new leader looked at %v first, want the protected Secret %s", enqueued, key)
	}
	for _, k := range enqueued {
		if _, err := next.Reconcile(ctx, ctrl.Request{NamespacedName: k}); err != nil {
			t.Fatal(err)
		}
	}
	must(t, c.Get(ctx, key, got))
	if controllerutil.ContainsFinalizer(got, ipamv1alpha1.SecretInUseFinalizer) || len(record.Fingerprints(got.Annotations)) > 0 {
		t.Errorf("no record names the Secret, but it keeps its protection: finalizers %v annotations %v", got.Finalizers, got.Annotations)
	}
	if left, err := next.Ledger.List(ctx); err != nil || len(left) != 0 {
		t.Errorf("the ledger still lists %v (%v) after the Secret was let go", left, err)
	}
}

// A Secret that is deleted while listed is taken off the list when it is looked at.
func TestAGoneSecretIsTakenOffTheLedger(t *testing.T) {
	ctx := context.Background()
	c := newClient()
	l := &secret.Ledger{Client: c, Reader: c, Key: ledgerKey}
	gone := types.NamespacedName{Namespace: "apps", Name: "gone"}
	must(t, l.Set(ctx, gone, true))
	if _, err := newLeader(c).Reconcile(ctx, ctrl.Request{NamespacedName: gone}); err != nil {
		t.Fatal(err)
	}
	if left, err := l.List(ctx); err != nil || len(left) != 0 {
		t.Errorf("the ledger still lists %v (%v) for a Secret that does not exist", left, err)
	}
}

// Workers that list and unlist Secrets at once lose none of each other's entries (each
// write is made on the version it read; a conflict reads again).
func TestLedgerWritersLoseNothing(t *testing.T) {
	ctx := context.Background()
	c := newClient()
	l := &secret.Ledger{Client: c, Reader: c, Key: ledgerKey}
	var wg sync.WaitGroup
	want := map[types.NamespacedName]bool{}
	for w := range 4 { // more workers than the protector has
		var mine []types.NamespacedName
		for i := range 5 {
			s := types.NamespacedName{Namespace: "apps", Name: fmt.Sprintf("s%d-%d", w, i)}
			want[s] = i%2 == 0
			mine = append(mine, s)
		}
		wg.Go(func() {
			for i, s := range mine {
				if err := l.Set(ctx, s, true); err != nil {
					t.Error(err)
				}
				if i%2 == 1 {
					if err := l.Set(ctx, s, false); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	got, err := l.List(ctx)
	must(t, err)
	listed := map[types.NamespacedName]bool{}
	for _, s := range got {
		listed[s] = true
	}
	for s, w := range want {
		if listed[s] != w {
			t.Errorf("Secret %s listed %v, want %v", s, listed[s], w)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
