package controllers

import (
	"context"

	"github.com/pkg/errors"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
)

// Field indexes on the manager's cache.
const (
	// ClaimPoolRefIndex indexes IPAddressClaims by PoolRefValue of spec.poolRef.
	ClaimPoolRefIndex = "vitistack.spec.poolRef"
	// AddressPoolRefIndex indexes IPAddresses by PoolRefValue of spec.poolRef.
	AddressPoolRefIndex = "vitistack.spec.poolRef"
	// AddressRegistrationIndex indexes IPAddresses by the holder key of their record.
	AddressRegistrationIndex = "vitistack.registration"
	// ClaimRegistrationIndex indexes IPAddressClaims by the holder key of their record.
	ClaimRegistrationIndex = "vitistack.registration"
	// ClaimSecretIndex indexes IPAddressClaims by the Secret their record names.
	ClaimSecretIndex = "vitistack.secret"
)

// PoolRefValue is the index value of a reference to one of this provider's pools.
func PoolRefValue(kind, name string) string {
	return ipamv1alpha1.GroupVersion.Group + "/" + kind + "/" + name
}

func poolRefValues(ref ipamv1.IPPoolReference) []string {
	if ref.APIGroup != ipamv1alpha1.GroupVersion.Group {
		return nil
	}
	return []string{PoolRefValue(ref.Kind, ref.Name)}
}

// SetupIndexes registers the field indexes the controllers and webhooks use.
func SetupIndexes(ctx context.Context, mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &ipamv1.IPAddressClaim{}, ClaimPoolRefIndex, func(o client.Object) []string {
		return poolRefValues(o.(*ipamv1.IPAddressClaim).Spec.PoolRef)
	}); err != nil {
		return errors.Wrap(err, "indexing IPAddressClaims by pool")
	}
	if err := idx.IndexField(ctx, &ipamv1.IPAddressClaim{}, ClaimRegistrationIndex, func(o client.Object) []string {
		if r, err := claimRecord(o.GetAnnotations()); err == nil && r != nil {
			return []string{r.key()}
		}
		return nil
	}); err != nil {
		return errors.Wrap(err, "indexing IPAddressClaims by registration")
	}
	if err := idx.IndexField(ctx, &ipamv1.IPAddressClaim{}, ClaimSecretIndex, func(o client.Object) []string {
		if r, err := claimRecord(o.GetAnnotations()); err == nil && r != nil {
			return []string{secretKey(r.Secret).String()}
		}
		return nil
	}); err != nil {
		return errors.Wrap(err, "indexing IPAddressClaims by secret")
	}
	if err := idx.IndexField(ctx, &ipamv1.IPAddress{}, AddressPoolRefIndex, func(o client.Object) []string {
		return poolRefValues(o.(*ipamv1.IPAddress).Spec.PoolRef)
	}); err != nil {
		return errors.Wrap(err, "indexing IPAddresses by pool")
	}
	if err := idx.IndexField(ctx, &ipamv1.IPAddress{}, AddressRegistrationIndex, func(o client.Object) []string {
		if r, err := recordedOn(o.GetLabels(), o.GetAnnotations()); err == nil && r != nil {
			return []string{r.key()}
		}
		return nil
	}); err != nil {
		return errors.Wrap(err, "indexing IPAddresses by registration")
	}
	return nil
}
