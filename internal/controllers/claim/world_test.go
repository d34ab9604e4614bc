package claim_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"reflect"
	"sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/ipamutil"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/tools/events"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/controllers/claim"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/controllers/secret"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/test/chaos"
)

// world is a cluster (a fake client, with the manager's indexes), the IPAM-API stand-in,
// and a manager process (the claim controller and the Secret protector) that can die
// between any two Kubernetes writes and be started again with empty memory.
type world struct {
	t      *testing.T
	ctx    context.Context
	c      client.Client // the cluster as the process sees it (intercepted)
	direct client.Client // the cluster as the test sees it
	api    *sim.Server

	claims    *claim.Reconciler
	seen      map[types.UID]client.Object // what the Reconciler was told exists (its cache's events)
	events    *events.FakeRecorder
	protector *secret.Protector
	cfg       registrar.Config
	url       string

	writes int   // Kubernetes writes the process has made
	fault  fault // what happens at write number fault.at
	dead   bool  // the process died: every write until the restart fails, none lands
	deaths int
	// beforeWrite, when set, runs before each write of the process lands: a user's
	// change that reaches the API server first.
	beforeWrite func(obj client.Object)
	// stale, while set, answers the process's reads of each key with what it holds
	// (nil: not found) instead of what the API server has: a cache that has not caught
	// up.
	stale map[string]client.Object
	// lagging answers the next read of each key with the object it holds, then no more:
	// a cache whose event of a change comes right after that read.
	lagging map[string]client.Object
}

// staleKey is the key of stale: the object's type and its namespaced name.
func staleKey(obj client.Object, key client.ObjectKey) string {
	return fmt.Sprintf("%T %s", obj, key)
}

type faultKind int

const (
	none      faultKind = iota
	conflict            // the write is refused with a conflict
	die                 // the write lands, then the process dies
	dieBefore           // the process dies before the write reaches the API server: it does not land
)

type fault struct {
	kind faultKind
	at   int
}

var errDied = errors.New("the process died here")

func init() { ctrl.SetLogger(logr.Discard()) }

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{t: t, ctx: ctrl.LoggerInto(context.Background(), ctrl.Log), api: sim.New(sim.Config{})}
	srv := httptest.NewServer(w.api)
	t.Cleanup(srv.Close)
	w.url = srv.URL

	b := fake.NewClientBuilder().WithScheme(manager.NewScheme()).
		WithStatusSubresource(&ipamv1.IPAddressClaim{}, &ipamv1alpha1.VitistackIPPool{}, &ipamv1alpha1.GlobalVitistackIPPool{})
	index.Each(func(obj client.Object, field string, fn client.IndexerFunc) { b = b.WithIndex(obj, field, fn) })
	w.direct = b.Build()
	w.c = interceptor.NewClient(w.direct.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			s, ok := w.stale[staleKey(obj, key)]
			if l, lags := w.lagging[staleKey(obj, key)]; lags {
				delete(w.lagging, staleKey(obj, key))
				s, ok = l, true
			}
			if ok {
				if s == nil {
					return apierrors.NewNotFound(schema.GroupResource{Resource: fmt.Sprintf("%T", obj)}, key.Name)
				}
				reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(s.DeepCopyObject()).Elem())
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			setUID(obj)
			w.created(obj)
			return w.write(obj, func() error { return c.Create(ctx, obj, opts...) })
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			return w.write(obj, func() error { return c.Update(ctx, obj, opts...) })
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			return w.write(obj, func() error { return c.Patch(ctx, obj, p, opts...) })
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			return w.write(obj, func() error { return c.Delete(ctx, obj, opts...) })
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			return w.write(obj, func() error { return c.SubResource(sub).Patch(ctx, obj, p, opts...) })
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			return w.write(obj, func() error { return c.SubResource(sub).Update(ctx, obj, opts...) })
		},
	})
	w.cfg = registrar.Config{
		DefaultEndpoint: w.url,
		ClusterID:       "cluster-a",
		DefaultSecret:   types.NamespacedName{Namespace: "provider", Name: "default"},
		// Long enough that no request to the in-process stand-in times out, even under
		// -race with every package's tests on 2 cores (that would change the path, and the writes, from
		// one run to the next). The stand-in in process finishes every request it got
		// at once, so a lost answer needs only a short wait.
		RequestTimeout:          30 * time.Second,
		QuarantineTime:          100 * time.Millisecond,
		MaxConcurrentReconciles: 1,
		SubnetRecheckInterval:   time.Minute,
	}
	w.start()
	for _, ns := range []string{"apps", "provider"} {
		w.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, UID: types.UID("uid-" + ns)}})
	}
	return w
}

// start starts the process: new controllers with empty memory.
func (w *world) start() {
	// Its uncached reader reads the API server: a stale cache (w.stale) is not in its way.
	reg := registrar.New(w.c, w.direct, &registrar.CachingClientFactory{Timeout: w.cfg.RequestTimeout}, w.cfg)
	w.events = events.NewFakeRecorder(10000)
	w.claims = &claim.Reconciler{Registrar: reg, Recorder: w.events}
	w.seen = nil
	w.observe()
	w.protector = &secret.Protector{Client: w.c, Reader: w.c, Secrets: reg.Secrets,
		Ledger: &secret.Ledger{Client: w.c, Reader: w.c, Key: types.NamespacedName{Namespace: "provider", Name: secret.LedgerName}}}
	reg.Secrets.Ledger = w.protector.Ledger
	w.dead = false
}

func (w *world) write(obj client.Object, do func() error) error {
	if w.dead {
		return errDied
	}
	if w.beforeWrite != nil {
		w.beforeWrite(obj)
	}
	w.writes++
	if w.fault.kind != none && w.writes == w.fault.at {
		switch w.fault.kind {
		case conflict:
			return apierrors.NewConflict(schema.GroupResource{Resource: fmt.Sprintf("%T", obj)}, obj.GetName(), errors.New("injected"))
		case die:
			err := do()
			w.dead = true
			w.deaths++
			if err != nil {
				return err
			}
			return errDied
		case dieBefore:
			w.dead = true
			w.deaths++
			return errDied
		}
	}
	defer w.observe()
	return do()
}

// loseAddress loses the IPAddress of the claim name in namespace apps: its finalizer taken
// off by hand, and deleted (or a claim restored without it).
func (w *world) loseAddress(name string) {
	w.t.Helper()
	addr := &ipamv1.IPAddress{}
	must(w.t, w.direct.Get(w.ctx, client.ObjectKey{Namespace: "apps", Name: name}, addr))
	addr.Finalizers = nil
	must(w.t, w.direct.Update(w.ctx, addr))
	must(w.t, w.direct.Delete(w.ctx, addr))
	w.observe()
}

// admit reconciles new claims once: ipamutil's loop adds the release finalizer and ends
// the reconcile, before the handler sees the claim.
func (w *world) admit(names ...string) {
	w.t.Helper()
	for _, n := range names {
		res, err := w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: n}})
		c := w.get(claimObj(n, "", nil))
		if err != nil || !res.IsZero() || !slices.Contains(c.GetFinalizers(), ipamutil.ReleaseAddressFinalizer) {
			w.t.Fatalf("the first reconcile of claim %s: %+v, %v, finalizers %v; want the release finalizer alone", n, res, err, c.GetFinalizers())
		}
	}
}

// waitOf is the wait a reconcile came to (a RequeueAfter, or an error that is a wait: see
// claim.WaitOf), and its error if it is not a wait.
func waitOf(res ctrl.Result, err error) (time.Duration, error) {
	if d, ok := claim.WaitOf(err); ok {
		return d, nil
	}
	return res.RequeueAfter, err
}

// setUID gives a new object a UID, as the API server does (the fake client does not).
func setUID(obj client.Object) {
	if obj.GetUID() == "" {
		obj.SetUID(uuid.NewUUID())
	}
}

// created gives a new object its creation time, as the API server does (the fake
// client does not): now on the world's clock, if it has one.
func (w *world) created(obj client.Object) {
	if ts := obj.GetCreationTimestamp(); ts.IsZero() {
		now := time.Now()
		if w.cfg.Clock != nil {
			now = w.cfg.Clock.Now()
		}
		obj.SetCreationTimestamp(metav1.NewTime(now))
	}
}

func (w *world) create(obj client.Object) {
	w.t.Helper()
	setUID(obj)
	w.created(obj)
	if err := w.direct.Create(w.ctx, obj); err != nil {
		w.t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
	w.observe()
}

// observe tells the claim Reconciler what exists, as a manager's cache events would.
func (w *world) observe() {
	if w.claims == nil {
		return
	}
	now := map[types.UID]client.Object{}
	addrs := &ipamv1.IPAddressList{}
	claims := &ipamv1.IPAddressClaimList{}
	if w.direct.List(w.ctx, addrs) != nil || w.direct.List(w.ctx, claims) != nil {
		return
	}
	for i := range addrs.Items {
		now[addrs.Items[i].UID] = &addrs.Items[i]
	}
	for i := range claims.Items {
		now[claims.Items[i].UID] = &claims.Items[i]
	}
	for uid, o := range w.seen {
		if _, ok := now[uid]; !ok {
			w.claims.Observe(o, true)
			w.claims.Cached(o, true)
		}
	}
	for uid, o := range now {
		w.claims.Observe(o, false)
		if _, ok := w.seen[uid]; !ok {
			w.claims.Cached(o, false)
		}
	}
	w.seen = now
}

// settle reconciles every claim and Secret until nothing changes: what a running
// manager does, one object at a time. A dead process is started again first.
func (w *world) settle() {
	w.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	// Settled: two passes without a write, and, while reconciles still fail (a claim
	// waiting for something), long enough for any quarantine to run out.
	var quietSince time.Time
	for quiet := 0; ; {
		if time.Now().After(deadline) {
			w.t.Fatalf("the cluster did not settle:\n%s", w.describe())
		}
		if w.dead {
			w.start()
		}
		before := w.writes
		failed := w.pass()
		if w.writes != before || w.dead {
			quiet, quietSince = 0, time.Time{}
			continue
		}
		if quiet++; quiet == 1 {
			quietSince = time.Now()
		}
		if quiet >= 2 && (!failed || time.Since(quietSince) > 2*w.cfg.Quarantine()) {
			return
		}
		time.Sleep(20 * time.Millisecond) // lets a quarantine run out
	}
}

// pass reconciles every claim, then every Secret, once; it reports whether any
// reconcile failed, or a claim asked to come back.
func (w *world) pass() (failed bool) {
	claims := &ipamv1.IPAddressClaimList{}
	must(w.t, w.direct.List(w.ctx, claims))
	for _, c := range claims.Items {
		// A claim that waits comes back later: it has not settled either.
		if wait, err := waitOf(w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&c)})); err != nil || wait > 0 {
			failed = true
		}
	}
	secrets := &corev1.SecretList{}
	must(w.t, w.direct.List(w.ctx, secrets))
	for _, s := range secrets.Items {
		if _, err := w.protector.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&s)}); err != nil {
			failed = true
		}
	}
	return failed
}

// run makes n passes, for a cluster that does not settle (a claim that keeps retrying).
func (w *world) run(n int) {
	for range n {
		if w.dead {
			w.start()
		}
		w.pass()
	}
}

// check asserts the promise (see problems).
func (w *world) check() {
	w.t.Helper()
	for _, p := range w.problems() {
		w.t.Error(p)
	}
}

// problems lists where the promise is broken, as the accounting oracle finds it for
// the world's namespaces (holders under every cluster ID).
func (w *world) problems() []string {
	w.t.Helper()
	a, err := chaos.Account(w.ctx, w.direct, w.api.Registrations(), map[string]bool{"uid-apps": true, "uid-provider": true}, w.cfg.DefaultSecret)
	must(w.t, err)
	return a.Entries()
}

// drainEvents returns the events recorded since the last call.
func (w *world) drainEvents() []string {
	var out []string
	for {
		select {
		case e := <-w.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// live is the stand-in's live holders of this cluster, address by address.
func (w *world) live() map[string][]string {
	out := map[string][]string{}
	for _, r := range w.api.Registrations() {
		for _, h := range r.Holders {
			if h.ExpiresAt == nil && h.ClusterID == w.cfg.ClusterID {
				out[r.Address] = append(out[r.Address], h.ServiceName)
			}
		}
	}
	return out
}

func (w *world) describe() string {
	var b strings.Builder
	claims := &ipamv1.IPAddressClaimList{}
	_ = w.direct.List(w.ctx, claims)
	for _, c := range claims.Items {
		fmt.Fprintf(&b, "claim %s: finalizers %v deleting %v record %q conditions %v\n", c.Name, c.Finalizers,
			!c.DeletionTimestamp.IsZero(), c.Annotations[ipamv1alpha1.RegistrationAnnotation], c.Status.Conditions)
	}
	fmt.Fprintf(&b, "stand-in: %v\n", w.live())
	return b.String()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
