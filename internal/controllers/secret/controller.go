package secret

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
)

// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;patch

// resync is how often a protected Secret is looked at again without an event.
const resync = 10 * time.Minute

// Protector keeps Secrets that own addresses from being deleted (the finalizer) or
// silently changed (the fingerprint), from what the cluster records. It is enqueued by
// claims and IPAddresses, the records; Secrets themselves are not watched (the manager
// has no list/watch on Secrets).
type Protector struct {
	// Client is the manager's cached client: records are looked up through indexes.
	Client client.Client
	// Reader reads Secrets, and the records once more before a finalizer is removed,
	// straight from the API server.
	Reader client.Reader
}

// SetupWithManager registers the protector.
func (p *Protector) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	refsChanged := predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return len(secretsOf(e.Object)) > 0 },
		DeleteFunc:  func(e event.DeleteEvent) bool { return len(secretsOf(e.Object)) > 0 },
		UpdateFunc:  func(e event.UpdateEvent) bool { return !slices.Equal(secretsOf(e.ObjectOld), secretsOf(e.ObjectNew)) },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	toSecrets := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		var reqs []reconcile.Request
		for _, s := range secretsOf(o) {
			reqs = append(reqs, reconcile.Request{NamespacedName: s})
		}
		return reqs
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("secret-protector").
		WithOptions(controller.Options{MaxConcurrentReconciles: 2}).
		Watches(&ipamv1.IPAddressClaim{}, toSecrets, builder.WithPredicates(refsChanged)).
		Watches(&ipamv1.IPAddress{}, toSecrets, builder.WithPredicates(refsChanged)).
		Complete(p)
}

// secretsOf is the Secrets an object's record names.
func secretsOf(o client.Object) []types.NamespacedName {
	var regs []*record.Registration
	switch o.(type) {
	case *ipamv1.IPAddressClaim:
		if r, err := record.OnClaim(o.GetAnnotations()); err == nil && r != nil {
			regs = append(regs, r)
		}
	case *ipamv1.IPAddress:
		if r, err := record.OnAddress(o.GetLabels(), o.GetAnnotations()); err == nil && r != nil {
			regs = append(regs, r)
		}
	}
	var out []types.NamespacedName
	for _, r := range regs {
		for _, s := range r.Secrets() {
			out = append(out, s.ObjectKey())
		}
	}
	slices.SortFunc(out, func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out)
}

// Reconcile protects a Secret while any record names it, and lets it go when none does.
func (p *Protector) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	keys, err := p.referencedKeys(ctx, req.NamespacedName, p.Client, true)
	if err != nil {
		return ctrl.Result{}, err
	}
	sec := &corev1.Secret{}
	if err := p.Reader.Get(ctx, req.NamespacedName, sec); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(errors.Wrapf(err, "reading Secret %s", req.NamespacedName))
	}
	if len(keys) == 0 && controllerutil.ContainsFinalizer(sec, ipamv1alpha1.SecretInUseFinalizer) {
		// The cache may lag a record just written: ask the API server before letting go.
		if keys, err = p.referencedKeys(ctx, req.NamespacedName, p.Reader, false); err != nil {
			return ctrl.Result{}, err
		}
	}
	before := sec.DeepCopy()
	fp := record.Fingerprints(sec.Annotations)
	want := map[string]string{}
	for _, k := range keys {
		if v, ok := fp[k]; ok {
			want[k] = v // recorded when the first address was registered under it: never rewritten
		} else if v, ok := sec.Data[k]; ok {
			want[k] = record.Fingerprint(v)
		}
	}
	if sec.Annotations == nil {
		sec.Annotations = map[string]string{}
	}
	record.SetFingerprints(sec.Annotations, want)
	if len(keys) > 0 {
		controllerutil.AddFinalizer(sec, ipamv1alpha1.SecretInUseFinalizer)
	} else {
		controllerutil.RemoveFinalizer(sec, ipamv1alpha1.SecretInUseFinalizer)
	}
	// Looked at again now and then while protected: a finalizer or fingerprint someone
	// stripped comes back (Secrets are not watched).
	res := ctrl.Result{}
	if len(keys) > 0 {
		res.RequeueAfter = resync
	}
	if maps.Equal(before.Annotations, sec.Annotations) && slices.Equal(before.Finalizers, sec.Finalizers) {
		return res, nil
	}
	err = p.Client.Patch(ctx, sec, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsConflict(err) {
		return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	return res, client.IgnoreNotFound(errors.Wrapf(err, "protecting Secret %s", req.NamespacedName))
}

// referencedKeys lists the keys of the Secret that records name, through the indexes
// (cached reader) or by listing everything (the API server).
func (p *Protector) referencedKeys(ctx context.Context, secret types.NamespacedName, r client.Reader, cached bool) ([]string, error) {
	var opts []client.ListOption
	if cached {
		opts = append(opts, client.MatchingFields{index.ClaimSecret: secret.String()})
	}
	keys := map[string]bool{}
	add := func(reg *record.Registration) {
		for _, s := range reg.Secrets() {
			if s.ObjectKey() == secret {
				keys[s.Key] = true
			}
		}
	}
	claims := &ipamv1.IPAddressClaimList{}
	if err := r.List(ctx, claims, opts...); err != nil {
		return nil, errors.Wrap(err, "listing the claims that record the Secret")
	}
	for _, c := range claims.Items {
		if reg, err := record.OnClaim(c.Annotations); err == nil && reg != nil {
			add(reg)
		}
	}
	if cached {
		opts = []client.ListOption{client.MatchingFields{index.AddressSecret: secret.String()}}
	}
	addrs := &ipamv1.IPAddressList{}
	if err := r.List(ctx, addrs, opts...); err != nil {
		return nil, errors.Wrap(err, "listing the IPAddresses that record the Secret")
	}
	for _, a := range addrs.Items {
		if reg, err := record.OnAddress(a.Labels, a.Annotations); err == nil && reg != nil {
			add(reg)
		}
	}
	return slices.Sorted(maps.Keys(keys)), nil
}
