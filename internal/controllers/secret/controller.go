package secret

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;patch

// defaultResync is how often a protected Secret is looked at again without an event,
// when Resync is not set.
const defaultResync = time.Minute

// Protector keeps Secrets that own addresses, or will, from being deleted (the
// finalizer) or silently changed (the fingerprint): every Secret key that a pool
// names (its spec.secretRef, else the default Secret) or a record names (a claim's or
// an IPAddress's). It is enqueued by pools, claims and IPAddresses; Secrets themselves
// are not watched (the manager has no list/watch on Secrets).
type Protector struct {
	// Client is the manager's cached client: records are looked up through indexes.
	Client client.Client
	// Reader reads Secrets, and the records once more before a finalizer is removed,
	// straight from the API server.
	Reader client.Reader
	// Secrets are the claims' Secret reads: their Protected is told what the protector
	// has made sure of; nil: every record that names a Secret enqueues it.
	Secrets *registrar.Secrets
	// Wake takes claims to the claim controller: those whose Secret's value it found
	// changed, or back as it was; nil: none.
	Wake *registrar.Queue
	// Ledger lists the Secrets the protector has protected, for the next leader to look
	// at again; nil: none (a Secret whose last record goes while no leader runs keeps
	// its protection).
	Ledger *Ledger
	// Resync is how often a protected Secret is looked at again without an event
	// (Secrets are not watched): a finalizer or fingerprint someone stripped comes back,
	// and a value changed in place shows on the claims bound under it. Zero: a minute.
	Resync time.Duration
}

// SetupWithManager registers the protector.
func (p *Protector) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		Named("secret-protector").
		WithOptions(controller.Options{MaxConcurrentReconciles: 2}).
		Watches(&ipamv1.IPAddressClaim{}, p.recordsChanged()).
		Watches(&ipamv1.IPAddress{}, p.recordsChanged()).
		Watches(&ipamv1alpha1.VitistackIPPool{}, p.recordsChanged()).
		Watches(&ipamv1alpha1.GlobalVitistackIPPool{}, p.recordsChanged())
	if p.Ledger != nil {
		b = b.WatchesRawSource(p.Ledger.Sweep(false))
	}
	return b.Complete(p)
}

// removalDelay coalesces the reconciles of a Secret whose records go: a burst of
// deletions looks at it about once a second, not once per record.
const removalDelay = time.Second

// recordsChanged enqueues the Secrets a pool or a record starts naming, unless the
// protector has already protected that key (a burst of claims under one Secret asks
// once), and, delayed, the Secrets one stops naming. Every update of a pool enqueues
// its Secret until it is protected: a Secret made after the pool (the default Secret,
// which the pool's first readiness check creates, say) is protected before the first
// claim comes.
func (p *Protector) recordsChanged() handler.TypedEventHandler[client.Object, reconcile.Request] {
	named := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], refs []record.ObjectRef) {
		for _, ref := range refs {
			if p.Secrets == nil || !p.Secrets.Protected.Has(ref) {
				q.Add(reconcile.Request{NamespacedName: ref.ObjectKey()})
			}
		}
	}
	always := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], refs []record.ObjectRef) {
		for _, ref := range refs {
			q.Add(reconcile.Request{NamespacedName: ref.ObjectKey()})
		}
	}
	unnamed := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], refs []record.ObjectRef) {
		for _, ref := range refs {
			q.AddAfter(reconcile.Request{NamespacedName: ref.ObjectKey()}, removalDelay)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if _, pool := e.Object.(ipamv1alpha1.Pool); pool {
				always(q, p.secretsOf(e.Object)) // rare; and the protector may be letting the Secret go right now
			} else {
				named(q, p.secretsOf(e.Object))
			}
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			before, after := p.secretsOf(e.ObjectOld), p.secretsOf(e.ObjectNew)
			if _, pool := e.ObjectNew.(ipamv1alpha1.Pool); pool {
				always(q, without(after, before))
				named(q, after)
			} else {
				named(q, without(after, before))
			}
			unnamed(q, without(before, after))
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			unnamed(q, p.secretsOf(e.Object))
		},
	}
}

// without is the refs of a that are not in b.
func without(a, b []record.ObjectRef) []record.ObjectRef {
	var out []record.ObjectRef
	for _, r := range a {
		if !slices.ContainsFunc(b, r.Equal) {
			out = append(out, r)
		}
	}
	return out
}

// secretsOf is the Secret keys a pool or an object's record names.
func (p *Protector) secretsOf(o client.Object) []record.ObjectRef {
	var reg *record.Registration
	var err error
	switch x := o.(type) {
	case *ipamv1.IPAddressClaim:
		reg, err = record.OnClaim(o.GetAnnotations())
	case *ipamv1.IPAddress:
		reg, err = record.OnAddress(o.GetLabels(), o.GetAnnotations())
	case ipamv1alpha1.Pool:
		if ref := registrar.PoolSecret(x, p.defaultSecret()); ref.Name != "" {
			return []record.ObjectRef{ref}
		}
	}
	if err != nil || reg == nil {
		return nil
	}
	return reg.Secrets()
}

// defaultSecret is the provider's default Secret (none without Secrets).
func (p *Protector) defaultSecret() types.NamespacedName {
	if p.Secrets == nil {
		return types.NamespacedName{}
	}
	return p.Secrets.Default
}

// Reconcile protects a Secret while any pool or record names it, and lets it go when
// none does.
func (p *Protector) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	res, sec, ready, err := p.protect(ctx, req)
	if p.Secrets == nil {
		return res, err
	}
	if err != nil {
		return res, err
	}
	if sec == nil {
		p.Secrets.Protected.Set(req.NamespacedName, nil) // gone: a Secret made again under the name is not protected
		return res, p.valueChanged(ctx, req.NamespacedName, nil, nil)
	}
	p.Secrets.Protected.Set(req.NamespacedName, ready)
	return res, p.valueChanged(ctx, req.NamespacedName, sec, ready)
}

// valueChanged tells the claims whose records name the Secret (bound ones too, which
// read it no more) when a protected key's value is found changed since its fingerprint
// was taken, or back as it was: they say so in their Ready condition.
func (p *Protector) valueChanged(ctx context.Context, secret types.NamespacedName, sec *corev1.Secret, ready []string) error {
	var changed []string
	protected := false
	if sec != nil && sec.DeletionTimestamp.IsZero() {
		for k := range record.Fingerprints(sec.Annotations) {
			protected = true
			if !slices.Contains(ready, k) {
				changed = append(changed, k)
			}
		}
	}
	if !p.Secrets.Protected.SetChanged(secret, changed, protected) || p.Wake == nil {
		return nil
	}
	claims, err := p.claimsNaming(ctx, secret)
	if err != nil {
		return err
	}
	addrs := &ipamv1.IPAddressList{}
	if err := p.Client.List(ctx, addrs, client.MatchingFields{index.AddressSecret: secret.String()}, client.UnsafeDisableDeepCopy); err != nil {
		return errors.Wrap(err, "listing the IPAddresses that record the Secret")
	}
	woken := map[types.NamespacedName]bool{}
	for _, c := range claims {
		woken[client.ObjectKeyFromObject(&c)] = true
	}
	for _, a := range addrs.Items {
		woken[client.ObjectKeyFromObject(&a)] = true // named like its claim
	}
	p.Wake.Add(slices.Collect(maps.Keys(woken))...)
	return nil
}

// claimsNaming lists the claims whose records name the Secret (copies the cache shares:
// read them only).
func (p *Protector) claimsNaming(ctx context.Context, secret types.NamespacedName) ([]ipamv1.IPAddressClaim, error) {
	claims := &ipamv1.IPAddressClaimList{}
	if err := p.Client.List(ctx, claims, client.MatchingFields{index.ClaimSecret: secret.String()}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, errors.Wrap(err, "listing the claims that record the Secret")
	}
	return claims.Items, nil
}

// protect makes the Secret's protection what its pools and records need; it returns the Secret
// as the API server has it now (nil: it is gone), and its ready keys: protected, with
// the fingerprint of their value.
func (p *Protector) protect(ctx context.Context, req ctrl.Request) (ctrl.Result, *corev1.Secret, []string, error) {
	named, err := p.referencedKeys(ctx, req.NamespacedName, p.Client, true)
	if err != nil {
		return ctrl.Result{}, nil, nil, err
	}
	sec := &corev1.Secret{}
	if err := p.Reader.Get(ctx, req.NamespacedName, sec); err != nil {
		if apierrors.IsNotFound(err) {
			// A pool or record names it: it is looked at again, should it be created.
			return p.resync(len(named.all) > 0), nil, nil, p.list(ctx, req.NamespacedName, false)
		}
		return ctrl.Result{}, nil, nil, errors.Wrapf(err, "reading Secret %s", req.NamespacedName)
	}
	keys := named.of(sec)
	if len(keys) == 0 && controllerutil.ContainsFinalizer(sec, ipamv1alpha1.SecretInUseFinalizer) {
		// Letting go is two-phase: mark the Secret (claims take it for unprotected from
		// then on), look for records once more, uncached (the cache may lag one just
		// written), and only then take the protection off. A claim writes its record before
		// its last read of the Secret: it reads the mark, or this look finds its record.
		if p.Secrets != nil {
			p.Secrets.Protected.Set(req.NamespacedName, nil) // a new record's event enqueues the Secret from now on
		}
		if _, marked := sec.Annotations[ipamv1alpha1.SecretLettingGoAnnotation]; !marked {
			before := sec.DeepCopy()
			if sec.Annotations == nil {
				sec.Annotations = map[string]string{}
			}
			sec.Annotations[ipamv1alpha1.SecretLettingGoAnnotation] = "true"
			if res, done, err := p.patch(ctx, req.NamespacedName, sec, before, ctrl.Result{}, "marking"); done {
				return res, nil, nil, err
			}
		}
		if named, err = p.referencedKeys(ctx, req.NamespacedName, p.Reader, false); err != nil {
			return ctrl.Result{}, nil, nil, err
		}
		keys = named.of(sec)
	}
	before := sec.DeepCopy()
	delete(sec.Annotations, ipamv1alpha1.SecretLettingGoAnnotation) // let go below, or kept
	fp := record.Fingerprints(sec.Annotations)
	want := map[string]string{}
	for _, k := range keys {
		if v, ok := fp[k]; ok {
			want[k] = v // taken when a pool or record first named the key: never rewritten while one does
		} else if v, ok := sec.Data[k]; ok && registrar.UsableValue(v) {
			want[k] = record.Fingerprint(v) // not of a value nothing can be registered under: it is fixed in place
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
	// stripped comes back (Secrets are not watched). So is one being deleted that a pool
	// names: a Secret made again under its name (the default Secret, by a pool's next
	// check) is protected then.
	res := p.resync(len(named.all) > 0)
	if len(keys) > 0 {
		// Listed before it is protected: a protected Secret is always listed.
		if err := p.list(ctx, req.NamespacedName, true); err != nil {
			return ctrl.Result{}, nil, nil, err
		}
	}
	if !maps.Equal(before.Annotations, sec.Annotations) || !slices.Equal(before.Finalizers, sec.Finalizers) {
		if res, done, err := p.patch(ctx, req.NamespacedName, sec, before, res, "protecting"); done {
			return res, nil, nil, err
		}
	}
	if len(keys) == 0 {
		// Unlisted once it is let go.
		if err := p.list(ctx, req.NamespacedName, false); err != nil {
			return res, nil, nil, err
		}
	}
	var ready []string // keys whose fingerprint matches the value (a changed value is not ready)
	for _, k := range keys {
		if v, ok := sec.Data[k]; ok && want[k] == record.Fingerprint(v) && sec.DeletionTimestamp.IsZero() {
			ready = append(ready, k)
		}
	}
	return res, sec, ready, nil
}

// patch writes the Secret's protection (sec, read as before), locked to the version read
// (registrar.PatchSecret: a refusal's text has the Secret's values cut out, as it reaches
// the log). done: the reconcile ends here with res and err (a conflict comes back soon;
// a Secret gone is unlisted).
func (p *Protector) patch(ctx context.Context, key types.NamespacedName, sec, before *corev1.Secret, res ctrl.Result, doing string) (
	ctrl.Result, bool, error) {
	err := registrar.PatchSecret(ctx, p.Client, p.Reader, sec, before, doing)
	switch {
	case err == nil:
		return res, false, nil
	case apierrors.IsConflict(err):
		return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, true, nil
	case apierrors.IsNotFound(err):
		return res, true, p.list(ctx, key, false)
	}
	return res, true, err
}

// resync is the result of a reconcile that looks at the Secret again after the resync
// interval, if again.
func (p *Protector) resync(again bool) ctrl.Result {
	if !again {
		return ctrl.Result{}
	}
	if p.Resync > 0 {
		return ctrl.Result{RequeueAfter: p.Resync}
	}
	return ctrl.Result{RequeueAfter: defaultResync}
}

// names are the keys of a Secret that pools and records name.
type names struct{ all, byRecord []string }

// of is the keys the Secret's protection needs: those pools or records name, or, once
// the Secret is being deleted, only those records name (a pool alone does not hold
// its deletion: nothing is registered under it).
func (n names) of(sec *corev1.Secret) []string {
	if !sec.DeletionTimestamp.IsZero() {
		return n.byRecord
	}
	return n.all
}

// list lists the Secret in the ledger, or takes it off.
func (p *Protector) list(ctx context.Context, secret types.NamespacedName, listed bool) error {
	if p.Ledger == nil {
		return nil
	}
	return p.Ledger.Set(ctx, secret, listed)
}

// referencedKeys lists the keys of the Secret that pools and records name, through the
// indexes (cached reader) or by listing everything (the API server).
func (p *Protector) referencedKeys(ctx context.Context, secret types.NamespacedName, r client.Reader, cached bool) (names, error) {
	var opts []client.ListOption
	if cached {
		opts = append(opts, client.MatchingFields{index.ClaimSecret: secret.String()}, client.UnsafeDisableDeepCopy)
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
		return names{}, errors.Wrap(err, "listing the claims that record the Secret")
	}
	for _, c := range claims.Items {
		if reg, err := record.OnClaim(c.Annotations); err == nil && reg != nil {
			add(reg)
		}
	}
	if cached {
		opts = []client.ListOption{client.MatchingFields{index.AddressSecret: secret.String()}, client.UnsafeDisableDeepCopy}
	}
	addrs := &ipamv1.IPAddressList{}
	if err := r.List(ctx, addrs, opts...); err != nil {
		return names{}, errors.Wrap(err, "listing the IPAddresses that record the Secret")
	}
	for _, a := range addrs.Items {
		if reg, err := record.OnAddress(a.Labels, a.Annotations); err == nil && reg != nil {
			add(reg)
		}
	}
	var poolOpts []client.ListOption
	if cached {
		poolOpts = append(poolOpts, client.UnsafeDisableDeepCopy)
	}
	pools, err := index.ListPools(ctx, r, poolOpts...)
	if err != nil {
		return names{}, errors.Wrap(err, "listing the pools")
	}
	// A pool's subnet check in flight is a registration too: its release needs the Secret.
	for _, pool := range pools {
		if _, probing := pool.GetAnnotations()[ipamv1alpha1.SubnetProbeAnnotation]; probing {
			if ref := registrar.PoolSecret(pool, p.defaultSecret()); ref.ObjectKey() == secret {
				keys[ref.Key] = true
			}
		}
	}
	out := names{byRecord: slices.Sorted(maps.Keys(keys))}
	for _, pool := range pools {
		if ref := registrar.PoolSecret(pool, p.defaultSecret()); ref.ObjectKey() == secret {
			keys[ref.Key] = true
		}
	}
	out.all = slices.Sorted(maps.Keys(keys))
	return out, nil
}
