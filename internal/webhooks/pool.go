package webhooks

import (
	"context"
	"fmt"
	"strings"

	"github.com/pkg/errors"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/subnet"
)

// +kubebuilder:webhook:path=/validate-ipam-vitistack-io-v1alpha1-vitistackippool,mutating=false,failurePolicy=fail,sideEffects=None,groups=ipam.vitistack.io,resources=vitistackippools,verbs=create;update;delete,versions=v1alpha1,name=validation.vitistackippool.ipam.vitistack.io,admissionReviewVersions=v1,timeoutSeconds=10
// +kubebuilder:webhook:path=/validate-ipam-vitistack-io-v1alpha1-globalvitistackippool,mutating=false,failurePolicy=fail,sideEffects=None,groups=ipam.vitistack.io,resources=globalvitistackippools,verbs=create;update;delete,versions=v1alpha1,name=validation.globalvitistackippool.ipam.vitistack.io,admissionReviewVersions=v1,timeoutSeconds=10

// Pool refuses changes that would orphan allocated addresses: a new zone or family
// while addresses are in use, and deleting a pool that claims still use.
type Pool struct {
	// Client reads claims and addresses through the manager's indexed cache.
	Client client.Reader
	// Kind is VitistackIPPool or GlobalVitistackIPPool.
	Kind string
}

// SetupWithManager registers the webhook for its kind.
func (w *Pool) SetupWithManager(mgr ctrl.Manager) error {
	if w.Kind == ipamv1alpha1.GlobalVitistackIPPoolKind {
		return register(mgr, &ipamv1alpha1.GlobalVitistackIPPool{}, w)
	}
	return register(mgr, &ipamv1alpha1.VitistackIPPool{}, w)
}

// register serves w for the kind of obj, through controller-runtime's typed validators.
func register[T ipamv1alpha1.Pool](mgr ctrl.Manager, obj T, w *Pool) error {
	return ctrl.NewWebhookManagedBy(mgr, obj).WithValidator(poolValidator[T]{w}).Complete()
}

// poolValidator is Pool typed for one kind: both kinds share one spec, so one Pool
// serves both.
type poolValidator[T ipamv1alpha1.Pool] struct{ *Pool }

func (v poolValidator[T]) ValidateCreate(ctx context.Context, obj T) (admission.Warnings, error) {
	return v.Pool.ValidateCreate(ctx, obj)
}

func (v poolValidator[T]) ValidateUpdate(ctx context.Context, oldObj, newObj T) (admission.Warnings, error) {
	return v.Pool.ValidateUpdate(ctx, oldObj, newObj)
}

func (v poolValidator[T]) ValidateDelete(ctx context.Context, obj T) (admission.Warnings, error) {
	return v.Pool.ValidateDelete(ctx, obj)
}

// ValidateCreate refuses what CEL in the CRD cannot see: the subnet plan is built
// once, as the controller will build it.
func (w *Pool) ValidateCreate(_ context.Context, pool ipamv1alpha1.Pool) (admission.Warnings, error) {
	return nil, w.checkPlan(pool)
}

// checkPlan refuses a subnet the controller could not use (for example a range whose
// first address is above its last).
func (w *Pool) checkPlan(pool ipamv1alpha1.Pool) error {
	spec := pool.PoolSpec()
	if spec.Subnet == "" {
		return nil
	}
	if _, err := subnet.New(spec.Subnet, spec.Gateway, spec.ExcludedAddresses); err != nil {
		return apierrors.NewInvalid(ipamv1alpha1.GroupVersion.WithKind(w.Kind).GroupKind(), pool.GetName(), field.ErrorList{
			field.Invalid(field.NewPath("spec", "excludedAddresses"), spec.ExcludedAddresses, err.Error()+"; write ranges as first-last, lowest first"),
		})
	}
	return nil
}

// ValidateUpdate refuses a new zone or family while addresses are allocated.
func (w *Pool) ValidateUpdate(ctx context.Context, oldPool, newPool ipamv1alpha1.Pool) (admission.Warnings, error) {
	if err := w.checkPlan(newPool); err != nil {
		return nil, err
	}
	o, n := oldPool.PoolSpec(), newPool.PoolSpec()
	if o.Zone == n.Zone && o.IPFamily == n.IPFamily && o.Subnet == n.Subnet {
		return nil, nil
	}
	if o.Zone == n.Zone && o.IPFamily == n.IPFamily {
		// A new subnet (or mode) while claims hold or are registering addresses of the
		// old one would strand them (their IPAddresses and records name the old subnet):
		// it needs those claims gone. Claims still waiting (for example because the old
		// subnet lies outside the zone) hold nothing and follow the new subnet.
		claims := &ipamv1.IPAddressClaimList{}
		if err := w.Client.List(ctx, claims, w.listOptions(newPool, index.ClaimPoolRef)...); err != nil {
			return nil, apierrors.NewInternalError(errors.Wrap(err, "listing the pool's claims"))
		}
		holding := 0
		for _, c := range claims.Items {
			// A record with an address, or with a request sent, may hold one.
			if rec, _ := record.OnClaim(c.Annotations); c.Status.AddressRef.Name != "" || rec != nil && (rec.Address != "" || !rec.Attempt.IsZero()) {
				holding++
			}
		}
		if holding == 0 {
			return nil, nil
		}
		return nil, apierrors.NewInvalid(ipamv1alpha1.GroupVersion.WithKind(w.Kind).GroupKind(), newPool.GetName(), field.ErrorList{
			field.Forbidden(field.NewPath("spec", "subnet"), fmt.Sprintf("cannot change while %d IPAddressClaims hold or are registering "+
				"addresses of this pool: delete them first, or create a new pool for the new subnet", holding)),
		})
	}
	inUse, example, err := w.addresses(ctx, newPool)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	if inUse == 0 {
		return nil, nil
	}
	var errs field.ErrorList
	why := fmt.Sprintf("cannot change while %d IPAddresses (for example %s) are allocated from this pool: "+
		"delete their claims first, or create a new pool for the new value", inUse, example)
	if o.Zone != n.Zone {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "zone"), why))
	}
	if o.IPFamily != n.IPFamily {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "ipFamily"), why))
	}
	return nil, apierrors.NewInvalid(ipamv1alpha1.GroupVersion.WithKind(w.Kind).GroupKind(), newPool.GetName(), errs)
}

// ValidateDelete refuses to delete a pool while claims use it, or while the address its
// subnet check registered is not released yet, except when clusterctl move deletes it
// after copying it to the target cluster.
func (w *Pool) ValidateDelete(ctx context.Context, pool ipamv1alpha1.Pool) (admission.Warnings, error) {
	if _, moving := pool.GetAnnotations()[clusterctlv1.DeleteForMoveAnnotation]; moving {
		return nil, nil
	}
	gr := ipamv1alpha1.GroupVersion.WithResource(strings.ToLower(w.Kind) + "s").GroupResource()
	if probe, ok := pool.GetAnnotations()[ipamv1alpha1.SubnetProbeAnnotation]; ok {
		return nil, apierrors.NewForbidden(gr, pool.GetName(), errors.Errorf(
			"the check of the pool's subnet against its zone has registered an address that is not released yet (annotation %s: %s): "+
				"try again in a moment, once the provider has released it", ipamv1alpha1.SubnetProbeAnnotation, probe))
	}
	claims := &ipamv1.IPAddressClaimList{}
	if err := w.Client.List(ctx, claims, w.listOptions(pool, index.ClaimPoolRef)...); err != nil {
		return nil, apierrors.NewInternalError(errors.Wrap(err, "listing the pool's claims"))
	}
	if len(claims.Items) == 0 {
		return nil, nil
	}
	names := make([]string, 0, 3)
	for i := range claims.Items {
		if i == 3 {
			names = append(names, "...")
			break
		}
		names = append(names, claims.Items[i].Namespace+"/"+claims.Items[i].Name)
	}
	return nil, apierrors.NewForbidden(gr, pool.GetName(), errors.Errorf(
		"%d IPAddressClaims still use this pool (%s): delete them first, so that their addresses are released in the IPAM-API",
		len(claims.Items), strings.Join(names, ", ")))
}

func (w *Pool) addresses(ctx context.Context, pool ipamv1alpha1.Pool) (int, string, error) {
	list := &ipamv1.IPAddressList{}
	if err := w.Client.List(ctx, list, w.listOptions(pool, index.AddressPoolRef)...); err != nil {
		return 0, "", errors.Wrap(err, "listing the pool's IPAddresses")
	}
	if len(list.Items) == 0 {
		return 0, "", nil
	}
	return len(list.Items), list.Items[0].Namespace + "/" + list.Items[0].Name, nil
}

func (w *Pool) listOptions(pool ipamv1alpha1.Pool, field string) []client.ListOption {
	opts := []client.ListOption{client.MatchingFields{field: index.PoolRefValue(w.Kind, pool.GetName())}}
	if pool.GetNamespace() != "" {
		opts = append(opts, client.InNamespace(pool.GetNamespace()))
	}
	return opts
}
