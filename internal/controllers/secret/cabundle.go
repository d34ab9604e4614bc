package secret

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
)

// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;patch

// CABundles keeps the finalizer ipam.vitistack.io/ca-bundle-in-use on every ConfigMap or
// Secret that a pool or a registration names as the CA bundle of its IPAM-API (a pool's
// spec.caBundleRef, the record of a claim or an IPAddress), and removes it once none does.
// A release needs the bundle to reach the IPAM-API, so the bundle outlives every
// registration that names it: a namespace being deleted takes its ConfigMaps at once, and
// its claims, whose releases need them, only as they are released. Nothing is registered
// through a bundle before it is protected (registrar.APIToRegister); its pool is what gets
// it protected first, before the first claim or subnet check, and the pool is deleted only
// after its claims and its subnet check are gone (the pool webhook).
//
// Its work items name the bundle as namespace and "Kind/name" (a name has no "/"). A
// bundle is listed in the Secret protector's ledger before its finalizer is added and
// taken off once it is removed, so a new leader looks at each again (one whose last
// registration went while no leader ran).
type CABundles struct {
	// Client is the manager's cached client: records are found through indexes.
	Client client.Client
	// Reader reads the bundles, and the records once more before a finalizer is removed,
	// straight from the API server.
	Reader client.Reader
	// Ledger lists the bundles it protects (beside the Secret protector's Secrets), for
	// the next leader to look at again; nil: none.
	Ledger *Ledger
}

// SetupWithManager registers the controller.
func (b *CABundles) SetupWithManager(_ context.Context, mgr ctrl.Manager) error {
	bl := ctrl.NewControllerManagedBy(mgr).
		Named("ca-bundle-protector").
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Watches(&ipamv1.IPAddressClaim{}, b.named()).
		Watches(&ipamv1.IPAddress{}, b.named()).
		Watches(&ipamv1alpha1.VitistackIPPool{}, b.named()).
		Watches(&ipamv1alpha1.GlobalVitistackIPPool{}, b.named())
	if b.Ledger != nil {
		bl = bl.WatchesRawSource(b.Ledger.Sweep(true))
	}
	return bl.Complete(b)
}

// named enqueues the bundles an object starts naming at once, and, delayed (coalescing a
// burst of deletions), those it stops naming.
func (b *CABundles) named() handler.TypedEventHandler[client.Object, reconcile.Request] {
	add := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], refs []record.ObjectRef, after time.Duration) {
		for _, ref := range refs {
			q.AddAfter(bundleRequest(ref), after)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, bundlesOf(e.Object), 0)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			before, after := bundlesOf(e.ObjectOld), bundlesOf(e.ObjectNew)
			add(q, without(after, before), 0)
			add(q, without(before, after), removalDelay)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, bundlesOf(e.Object), removalDelay)
		},
	}
}

// bundlesOf is the CA bundle the object names: a pool's, or a claim's or an IPAddress's
// record's.
func bundlesOf(o client.Object) []record.ObjectRef {
	var reg *record.Registration
	switch x := o.(type) {
	case *ipamv1.IPAddressClaim:
		reg, _ = record.OnClaim(o.GetAnnotations())
	case *ipamv1.IPAddress:
		reg, _ = record.OnAddress(o.GetLabels(), o.GetAnnotations())
	case ipamv1alpha1.Pool:
		return poolBundle(x)
	}
	if reg == nil || reg.CABundle.Name == "" {
		return nil
	}
	return []record.ObjectRef{reg.CABundle}
}

// poolBundle is the CA bundle a pool's spec names.
func poolBundle(p ipamv1alpha1.Pool) []record.ObjectRef {
	ref := p.PoolSpec().CABundleRef
	if ref == nil {
		return nil
	}
	out := record.ObjectRef{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name, Key: ref.Key}
	if p.GetNamespace() != "" {
		out.Namespace = p.GetNamespace()
	}
	return []record.ObjectRef{out}
}

func bundleRequest(ref record.ObjectRef) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ref.Namespace, Name: ref.BundleKind() + "/" + ref.Name}}
}

// Reconcile protects a CA bundle while a registration names it, and lets it go when none
// does.
func (b *CABundles) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	kind, name, ok := strings.Cut(req.Name, "/")
	if !ok {
		return ctrl.Result{}, nil
	}
	ref := record.ObjectRef{Kind: kind, Namespace: req.Namespace, Name: name}
	var obj client.Object = &corev1.ConfigMap{}
	if kind == "Secret" {
		obj = &corev1.Secret{}
	}
	if err := b.Reader.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, b.list(ctx, req.NamespacedName, false)
		}
		return ctrl.Result{}, errors.Wrapf(err, "reading CA bundle %s %s/%s", kind, req.Namespace, name)
	}
	has := controllerutil.ContainsFinalizer(obj, ipamv1alpha1.CABundleInUseFinalizer)
	needed, err := b.needed(ctx, ref, true)
	if err == nil && !needed && has {
		// The cache may lag a record just written: ask the API server before letting go.
		needed, err = b.needed(ctx, ref, false)
	}
	if err != nil || needed == has {
		return ctrl.Result{}, err
	}
	before := obj.DeepCopyObject().(client.Object)
	if needed {
		// Listed before it is protected: a protected bundle is always listed.
		if err := b.list(ctx, req.NamespacedName, true); err != nil {
			return ctrl.Result{}, err
		}
		controllerutil.AddFinalizer(obj, ipamv1alpha1.CABundleInUseFinalizer)
	} else {
		controllerutil.RemoveFinalizer(obj, ipamv1alpha1.CABundleInUseFinalizer)
	}
	err = b.Client.Patch(ctx, obj, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	switch {
	case apierrors.IsConflict(err):
		return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
	case err != nil && !apierrors.IsNotFound(err):
		return ctrl.Result{}, errors.Wrapf(err, "protecting CA bundle %s %s/%s", kind, req.Namespace, name)
	case !needed || apierrors.IsNotFound(err):
		return ctrl.Result{}, b.list(ctx, req.NamespacedName, false) // unlisted once it is let go
	}
	return ctrl.Result{}, nil
}

// list lists the bundle in the ledger, or takes it off.
func (b *CABundles) list(ctx context.Context, key types.NamespacedName, listed bool) error {
	if b.Ledger == nil {
		return nil
	}
	return b.Ledger.Set(ctx, key, listed)
}

// needed reports whether a registration names the bundle: through the indexes of the
// cache (cached), or by listing every record from the API server.
func (b *CABundles) needed(ctx context.Context, ref record.ObjectRef, cached bool) (bool, error) {
	want := index.CABundleValue(ref)
	names := func(o client.Object) bool {
		return slices.ContainsFunc(bundlesOf(o), func(x record.ObjectRef) bool { return index.CABundleValue(x) == want })
	}
	r := b.Reader
	if cached {
		r = b.Client
	}
	for _, l := range []struct {
		list        client.ObjectList
		field, what string
	}{{&ipamv1.IPAddressClaimList{}, index.ClaimCABundle, "claims"}, {&ipamv1.IPAddressList{}, index.AddressCABundle, "IPAddresses"}} {
		var opts []client.ListOption
		if cached {
			opts = []client.ListOption{client.MatchingFields{l.field: want}, client.UnsafeDisableDeepCopy}
		}
		if err := r.List(ctx, l.list, opts...); err != nil {
			return false, errors.Wrapf(err, "listing the %s that record the CA bundle", l.what)
		}
		found := false
		if err := apimeta.EachListItem(l.list, func(o runtime.Object) error {
			found = found || names(o.(client.Object))
			return nil
		}); err != nil || found {
			return found, err
		}
	}
	pools, err := index.ListPools(ctx, r)
	if err != nil {
		return false, errors.Wrap(err, "listing the pools")
	}
	return slices.ContainsFunc(pools, func(p ipamv1alpha1.Pool) bool { return names(p) }), nil
}
