package registrar

import (
	"context"
	"fmt"
	"sync"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// Registrar is shared by the controllers: the cached client, the Secrets, the IPAM-API
// clients, the in-flight table and the configuration.
type Registrar struct {
	// Client is the manager's (cached) client.
	Client client.Client
	// Reader reads uncached (the kube-system Namespace).
	Reader client.Reader
	// Secrets reads secrets and CA bundles and creates the default secret.
	Secrets *Secrets
	// Clients gives the IPAM-API client of an endpoint.
	Clients ClientFactory
	// Config is the manager's configuration.
	Config Config
	// InFlight keeps requests for one identity or address from overlapping.
	InFlight *InFlight
	// Wake brings claims to the claim controller from outside its own watches: the
	// Secret protector wakes those of a Secret whose value it found changed, or back as
	// it was.
	Wake *Queue

	clusterIDMu   sync.Mutex
	kubeSystemUID string
}

// New builds a Registrar.
func New(c client.Client, reader client.Reader, clients ClientFactory, cfg Config) *Registrar {
	secrets := &Secrets{Reader: reader, Writer: c, Default: cfg.DefaultSecret}
	return &Registrar{
		Client:   c,
		Reader:   reader,
		Secrets:  secrets,
		Clients:  clients,
		Config:   cfg,
		InFlight: &InFlight{Reader: c, Quarantine: cfg.Quarantine(), Clock: cfg.Clock, Monotonic: cfg.Monotonic},
		Wake:     &Queue{},
	}
}

// ConfigError is a pool or flag setting that makes registration impossible; a user
// must change the pool (or the flags).
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return e.Msg }

// ForPool is the registration a claim of pool gets before the claim's own annotations
// and identity are applied: endpoint, CA bundle, zone, family, secret, retention,
// cleanup, and the cluster_id the pool or the flags give.
func (r *Registrar) ForPool(ctx context.Context, pool ipamv1alpha1.Pool) (*record.Registration, error) {
	spec := pool.PoolSpec()
	reg := &record.Registration{
		Endpoint:            r.Config.DefaultEndpoint,
		Zone:                spec.Zone,
		Family:              APIFamily(spec.IPFamily),
		DenyExternalCleanup: spec.DenyExternalCleanup,
		RetentionPeriodDays: int(ptr.Deref(spec.RetentionPeriodDays, 0)),
		Phase:               record.PhasePending,
	}
	if spec.Endpoint != "" {
		reg.Endpoint = spec.Endpoint
	}
	reg.Endpoint = ipamapi.NormalizeEndpoint(reg.Endpoint)
	if reg.Endpoint == "" {
		return nil, &ConfigError{Msg: "no IPAM-API endpoint: set spec.endpoint on the pool or --ipam-api-url on the manager"}
	}
	if ref := spec.CABundleRef; ref != nil {
		reg.CABundle = record.ObjectRef{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name, Key: ref.Key}
		if pool.GetNamespace() != "" {
			reg.CABundle.Namespace = pool.GetNamespace()
		}
	}
	reg.Secret = PoolSecret(pool, r.Config.DefaultSecret)
	reg.Identity.ClusterID = spec.ClusterID
	if reg.Identity.ClusterID == "" {
		id, err := r.ClusterID(ctx)
		if err != nil {
			return nil, err
		}
		reg.Identity.ClusterID = id
	}
	return reg, nil
}

// PoolSecret is the Secret key a pool's claims register under unless a claim names
// another: the pool's spec.secretRef (in the pool's namespace for a VitistackIPPool;
// key "secret" unless given), else the key "secret" of the default Secret def.
func PoolSecret(pool ipamv1alpha1.Pool, def types.NamespacedName) record.ObjectRef {
	ref := pool.PoolSpec().SecretRef
	if ref == nil {
		return defaultRef(def)
	}
	out := record.ObjectRef{Namespace: ref.Namespace, Name: ref.Name, Key: ref.Key}
	if pool.GetNamespace() != "" {
		out.Namespace = pool.GetNamespace()
	}
	if out.Key == "" {
		out.Key = record.DefaultSecretKey
	}
	return out
}

// DefaultSecretRef is the provider's default secret.
func (r *Registrar) DefaultSecretRef() record.ObjectRef { return defaultRef(r.Config.DefaultSecret) }

// defaultRef is the key of the default Secret def.
func defaultRef(def types.NamespacedName) record.ObjectRef {
	return record.ObjectRef{Namespace: def.Namespace, Name: def.Name, Key: record.DefaultSecretKey}
}

// API gives the IPAM-API client for a registration's endpoint and CA bundle.
func (r *Registrar) API(ctx context.Context, reg *record.Registration) (ipamapi.Client, error) {
	return r.api(ctx, reg, false)
}

// APIToRegister is API for a new registration: its CA bundle must be protected by then
// (ErrCABundleNotProtected, wrapped, until it is), so that it outlives the registration.
func (r *Registrar) APIToRegister(ctx context.Context, reg *record.Registration) (ipamapi.Client, error) {
	return r.api(ctx, reg, true)
}

func (r *Registrar) api(ctx context.Context, reg *record.Registration, protected bool) (ipamapi.Client, error) {
	ca, ok, err := r.Secrets.caBundle(ctx, reg.CABundle)
	if err != nil {
		return nil, &ConfigError{Msg: err.Error() + "; fix the pool's spec.caBundleRef"}
	}
	if protected && !ok {
		return nil, errors.Wrapf(ErrCABundleNotProtected, "waiting for %s %s/%s to be protected (finalizer %s) before anything is registered through it",
			reg.CABundle.BundleKind(), reg.CABundle.Namespace, reg.CABundle.Name, ipamv1alpha1.CABundleInUseFinalizer)
	}
	api, err := r.Clients.For(reg.Endpoint, ca)
	if err != nil {
		return nil, &ConfigError{Msg: fmt.Sprintf("IPAM-API endpoint %s: %v", reg.Endpoint, err)}
	}
	return api, nil
}

// ClusterID is the cluster_id when neither claim nor pool nor flag gives one: the UID
// of the kube-system Namespace, as the IPAM-operator used.
func (r *Registrar) ClusterID(ctx context.Context) (string, error) {
	if r.Config.ClusterID != "" {
		return r.Config.ClusterID, nil
	}
	r.clusterIDMu.Lock()
	defer r.clusterIDMu.Unlock()
	if r.kubeSystemUID == "" {
		ns := &corev1.Namespace{}
		if err := r.Reader.Get(ctx, types.NamespacedName{Name: metav1.NamespaceSystem}, ns); err != nil {
			return "", errors.Wrap(err, "reading the kube-system Namespace for the cluster_id")
		}
		r.kubeSystemUID = string(ns.UID)
	}
	return r.kubeSystemUID, nil
}

// APIFamily is the IPAM-API's name of a pool's family.
func APIFamily(f ipamv1alpha1.IPFamily) ipamapi.Family {
	if f == ipamv1alpha1.IPv6 {
		return ipamapi.FamilyIPv6
	}
	return ipamapi.FamilyIPv4
}
