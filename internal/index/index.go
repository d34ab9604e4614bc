package index

import (
	"context"
	"crypto/sha256"
	"encoding/base64"

	"github.com/pkg/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	toolscache "k8s.io/client-go/tools/cache"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
)

// Field indexes on the manager's cache.
const (
	// ClaimPoolRef indexes IPAddressClaims by PoolRefValue of spec.poolRef.
	ClaimPoolRef = "vitistack.spec.poolRef"
	// AddressPoolRef indexes IPAddresses by PoolRefValue of spec.poolRef.
	AddressPoolRef = "vitistack.spec.poolRef"
	// ClaimRegistration indexes IPAddressClaims by the bucket of the holder key of their
	// record (look up with ListByRegistration).
	ClaimRegistration = "vitistack.registration"
	// AddressRegistration indexes IPAddresses by the bucket of the holder key of their
	// record (look up with ListByRegistration).
	AddressRegistration = "vitistack.registration"
	// ClaimHost indexes IPAddressClaims by the bucket of the record.HostKey their record
	// names (look up with ListByHost).
	ClaimHost = "vitistack.host"
	// AddressHost indexes IPAddresses by the bucket of the record.HostKey of their record
	// (look up with ListByHost).
	AddressHost = "vitistack.host"
	// ClaimSecret indexes IPAddressClaims by the Secrets (namespace/name) their record
	// names: the owner and a rotation's target.
	ClaimSecret = "vitistack.secret"
	// AddressSecret indexes IPAddresses by the Secret (namespace/name) that owns them.
	AddressSecret = "vitistack.secret"
	// ClaimCABundle indexes IPAddressClaims by the CA bundle their record names
	// (CABundleValue).
	ClaimCABundle = "vitistack.caBundle"
	// AddressCABundle indexes IPAddresses by the CA bundle their record names
	// (CABundleValue).
	AddressCABundle = "vitistack.caBundle"
	// ClaimWaiting indexes unbound, live IPAddressClaims whose pool had no room for
	// them, by PoolRefValue: the claims a freed address wakes.
	ClaimWaiting = "vitistack.waiting"
	// ClaimSubnetOutsideZone indexes IPAddressClaims that found their pool's subnet
	// outside its zone, by PoolRefValue: the pool is not Ready while any exists.
	ClaimSubnetOutsideZone = "vitistack.subnetOutsideZone"
)

// ListByRegistration lists into list (an IPAddressClaimList or IPAddressList) the
// IPAddressClaims or IPAddresses whose record has the holder key
// (record.Registration.Key).
func ListByRegistration(ctx context.Context, c client.Reader, list client.ObjectList, key string) error {
	return listByKey(ctx, c, list, ClaimRegistration, key, (*record.Registration).Key)
}

// ListByHost lists into list (an IPAddressClaimList or IPAddressList) the
// IPAddressClaims or IPAddresses whose record names the address of hostKey
// (record.Registration.HostKey).
func ListByHost(ctx context.Context, c client.Reader, list client.ObjectList, hostKey string) error {
	return listByKey(ctx, c, list, ClaimHost, hostKey, (*record.Registration).HostKey)
}

// listByKey lists the bucket of want by field (the same for claims and IPAddresses) and
// keeps the objects whose record's keyOf is want, as deep copies. The bucket's other
// objects are read from the cache without copying them.
func listByKey(ctx context.Context, c client.Reader, list client.ObjectList, field, want string, keyOf func(*record.Registration) string) error {
	if err := c.List(ctx, list, client.MatchingFields{field: bucket(want)}, client.UnsafeDisableDeepCopy); err != nil {
		return err
	}
	matches := func(r *record.Registration) bool { return r != nil && keyOf(r) == want }
	switch l := list.(type) {
	case *ipamv1.IPAddressClaimList:
		l.Items = keep(l.Items, func(o *ipamv1.IPAddressClaim) bool { return matches(claimRecord(o)) })
	case *ipamv1.IPAddressList:
		l.Items = keep(l.Items, func(o *ipamv1.IPAddress) bool { return matches(addressRecord(o)) })
	default:
		return errors.Errorf("%T is not indexed by %s", list, field)
	}
	return nil
}

// keep returns deep copies of the items ok accepts (the items may share their maps and
// slices with the cache).
func keep[T any, P interface {
	*T
	DeepCopyInto(*T)
}](items []T, ok func(P) bool) []T {
	var out []T
	for i := range items {
		if ok(P(&items[i])) {
			var c T
			P(&items[i]).DeepCopyInto(&c)
			out = append(out, c)
		}
	}
	return out
}

// bucket is the index value of a key that is (nearly) one object's own, such as a
// holder key of endpoint, zone, family and identity: the first 12 bits of its SHA-256
// digest, two base64 characters. The cache keeps a set of object keys per index value;
// a value per object would be a set per object (about 250 bytes each: 10 MB for the
// four such indexes of 10,000 bound claims). In 4,096 buckets a few objects share each
// set, and a lookup (ListByRegistration, ListByHost) keeps those whose key it asked for.
func bucket(key string) string {
	sum := sha256.Sum256([]byte(key))
	return base64.RawURLEncoding.EncodeToString(sum[:2])[:2]
}

// Count returns how many objects of obj's kind the field index of the cache maps to
// value, in namespace ("" for all): from the informer's index, without listing (and
// copying) the objects. ok is false when the cache does not expose its informers'
// indexes (a cache of several namespaces): then count with a List.
func Count(ctx context.Context, c cache.Cache, obj client.Object, field, namespace, value string) (n int, ok bool, err error) {
	inf, err := c.GetInformer(ctx, obj, cache.BlockUntilSynced(false))
	if err != nil {
		return 0, false, err
	}
	indexed, ok := inf.(interface{ GetIndexer() toolscache.Indexer })
	if !ok {
		return 0, false, nil
	}
	key := allNamespacesKey(value)
	if namespace != "" {
		key = namespace + "/" + value
	}
	// ByIndex, not IndexKeys: that sorts the keys, under the store's lock.
	objs, err := indexed.GetIndexer().ByIndex(fieldIndexName(field), key)
	return len(objs), err == nil, err
}

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

// SecretValue is the index value of a Secret.
func SecretValue(ref record.ObjectRef) string { return ref.ObjectKey().String() }

type indexer struct {
	obj   client.Object
	field string
	what  string
	fn    client.IndexerFunc
	// clusterWide indexes are only ever looked up across all namespaces: the cache keeps
	// one entry per value instead of controller-runtime's two (see Setup).
	clusterWide bool
}

func claimRecord(o client.Object) *record.Registration {
	r, err := record.OnClaim(o.GetAnnotations())
	if err != nil {
		return nil
	}
	return r
}

func addressRecord(o client.Object) *record.Registration {
	r, err := record.OnAddress(o.GetLabels(), o.GetAnnotations())
	if err != nil {
		return nil
	}
	return r
}

func readyReason(c *ipamv1.IPAddressClaim) string {
	if cond := meta.FindStatusCondition(c.Status.Conditions, ipamv1.IPAddressClaimReadyCondition); cond != nil {
		return cond.Reason
	}
	return ""
}

var indexers = []indexer{
	{&ipamv1.IPAddressClaim{}, ClaimPoolRef, "IPAddressClaims by pool", func(o client.Object) []string {
		return poolRefValues(o.(*ipamv1.IPAddressClaim).Spec.PoolRef)
	}, false},
	{&ipamv1.IPAddressClaim{}, ClaimRegistration, "IPAddressClaims by registration", func(o client.Object) []string {
		if r := claimRecord(o); r != nil {
			return []string{bucket(r.Key())}
		}
		return nil
	}, true},
	{&ipamv1.IPAddressClaim{}, ClaimHost, "IPAddressClaims by address", func(o client.Object) []string {
		if r := claimRecord(o); r != nil && r.HostKey() != "" {
			return []string{bucket(r.HostKey())}
		}
		return nil
	}, true},
	{&ipamv1.IPAddressClaim{}, ClaimSecret, "IPAddressClaims by secret", func(o client.Object) []string {
		r := claimRecord(o)
		if r == nil {
			return nil
		}
		var out []string
		for _, s := range r.Secrets() {
			out = append(out, SecretValue(s))
		}
		return out
	}, false},
	{&ipamv1.IPAddressClaim{}, ClaimCABundle, "IPAddressClaims by CA bundle", func(o client.Object) []string {
		if r := claimRecord(o); r != nil && r.CABundle.Name != "" {
			return []string{CABundleValue(r.CABundle)}
		}
		return nil
	}, false},
	{&ipamv1.IPAddressClaim{}, ClaimWaiting, "IPAddressClaims waiting for room", func(o client.Object) []string {
		c := o.(*ipamv1.IPAddressClaim)
		if c.Status.AddressRef.Name != "" || !c.DeletionTimestamp.IsZero() || readyReason(c) != ipamv1.IPAddressClaimReadyPoolExhaustedReason {
			return nil
		}
		return poolRefValues(c.Spec.PoolRef)
	}, false},
	{&ipamv1.IPAddressClaim{}, ClaimSubnetOutsideZone, "IPAddressClaims that found the subnet outside the zone", func(o client.Object) []string {
		c := o.(*ipamv1.IPAddressClaim)
		if readyReason(c) != ipamv1alpha1.ClaimReadySubnetOutsideZoneReason {
			return nil
		}
		return poolRefValues(c.Spec.PoolRef)
	}, false},
	{&ipamv1.IPAddress{}, AddressPoolRef, "IPAddresses by pool", func(o client.Object) []string {
		return poolRefValues(o.(*ipamv1.IPAddress).Spec.PoolRef)
	}, false},
	{&ipamv1.IPAddress{}, AddressRegistration, "IPAddresses by registration", func(o client.Object) []string {
		if r := addressRecord(o); r != nil {
			return []string{bucket(r.Key())}
		}
		return nil
	}, true},
	{&ipamv1.IPAddress{}, AddressHost, "IPAddresses by address", func(o client.Object) []string {
		if r := addressRecord(o); r != nil {
			return []string{bucket(r.HostKey())}
		}
		return nil
	}, true},
	{&ipamv1.IPAddress{}, AddressSecret, "IPAddresses by secret", func(o client.Object) []string {
		if r := addressRecord(o); r != nil {
			return []string{SecretValue(r.Secret)}
		}
		return nil
	}, false},
	{&ipamv1.IPAddress{}, AddressCABundle, "IPAddresses by CA bundle", func(o client.Object) []string {
		if r := addressRecord(o); r != nil && r.CABundle.Name != "" {
			return []string{CABundleValue(r.CABundle)}
		}
		return nil
	}, false},
}

// CABundleValue is the ClaimCABundle and AddressCABundle value of a CA bundle: its kind
// (ConfigMap unless Secret), namespace and name.
func CABundleValue(ref record.ObjectRef) string {
	return ref.BundleKind() + "/" + ref.Namespace + "/" + ref.Name
}

// Setup registers the field indexes on the manager's cache.
//
// controller-runtime's IndexField keeps every value of a namespaced object twice: under
// the object's namespace and under all namespaces. The bucket indexes (by registration
// and by address) are only looked up across all namespaces (ListByRegistration,
// ListByHost), so they are added to the informer directly with the all-namespaces key
// alone, in the form controller-runtime's cache reader looks up.
func Setup(ctx context.Context, mgr ctrl.Manager) error {
	c := mgr.GetCache()
	for _, i := range indexers {
		if !i.clusterWide {
			if err := c.IndexField(ctx, i.obj, i.field, i.fn); err != nil {
				return errors.Wrapf(err, "indexing %s", i.what)
			}
			continue
		}
		inf, err := c.GetInformer(ctx, i.obj, cache.BlockUntilSynced(false))
		if err != nil {
			return errors.Wrapf(err, "indexing %s", i.what)
		}
		if err := inf.AddIndexers(toolscache.Indexers{fieldIndexName(i.field): clusterWideValues(i.fn)}); err != nil {
			return errors.Wrapf(err, "indexing %s", i.what)
		}
	}
	return nil
}

// fieldIndexName and allNamespacesKey are how controller-runtime's cache reader names a
// field index and the value it looks up for a List without a namespace (with one, it
// is namespace/value; sigs.k8s.io/controller-runtime/pkg/cache/internal:
// FieldIndexName, KeyToNamespacedKey).
// The envtest suites list by both bucket indexes, so a change there fails them.
func fieldIndexName(field string) string { return "field:" + field }

func allNamespacesKey(value string) string { return "__all_namespaces/" + value }

// clusterWideValues is fn as an informer index function that emits only the
// all-namespaces key of each value.
func clusterWideValues(fn client.IndexerFunc) toolscache.IndexFunc {
	return func(o any) ([]string, error) {
		obj, ok := o.(client.Object)
		if !ok {
			return nil, errors.Errorf("object of type %T is not an Object", o)
		}
		vals := fn(obj)
		for i := range vals {
			vals[i] = allNamespacesKey(vals[i])
		}
		return vals, nil
	}
}

// Each calls fn for every index, so a fake client can be given the same ones.
func Each(fn func(obj client.Object, field string, extract client.IndexerFunc)) {
	for _, i := range indexers {
		fn(i.obj, i.field, i.fn)
	}
}

// ListPools lists the pools of both kinds, VitistackIPPools first.
func ListPools(ctx context.Context, c client.Reader, opts ...client.ListOption) ([]ipamv1alpha1.Pool, error) {
	local := &ipamv1alpha1.VitistackIPPoolList{}
	global := &ipamv1alpha1.GlobalVitistackIPPoolList{}
	if err := c.List(ctx, local, opts...); err != nil {
		return nil, err
	}
	if err := c.List(ctx, global, opts...); err != nil {
		return nil, err
	}
	out := make([]ipamv1alpha1.Pool, 0, len(local.Items)+len(global.Items))
	for i := range local.Items {
		out = append(out, &local.Items[i])
	}
	for i := range global.Items {
		out = append(out, &global.Items[i])
	}
	return out, nil
}
