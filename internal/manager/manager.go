package manager

import (
	"context"
	"time"

	"github.com/pkg/errors"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/controllers/claim"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/controllers/pool"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/controllers/secret"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/controllers/service"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/metrics"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/note"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/webhooks"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// ProviderNamespace is where clusterctl installs the provider.
const ProviderNamespace = "capi-ipam-vitistack-system"

// NewScheme returns a scheme with every type the provider reads or writes.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(clusterv1.AddToScheme(s))
	utilruntime.Must(ipamv1.AddToScheme(s))
	utilruntime.Must(ipamv1alpha1.AddToScheme(s))
	return s
}

// ControllerConfig is the settings every controller of the provider shares: client-go's
// rate-limited work queue, not controller-runtime's priority queue. The priority queue of
// controller-runtime v0.24 can keep its lock for ever when it is shut down while it hands
// an item to a worker that has just left (kubernetes-sigs/controller-runtime#3538, fixed
// in v0.25); every later Add or Done then waits on it (a worker's last Done, an
// informer's event handler), and the manager never stops. CI met it again and again.
// What the priority queue adds, re-listed objects waiting behind new work after a
// restart, is not worth a Pod that cannot stop.
func ControllerConfig() config.Controller {
	return config.Controller{UsePriorityQueue: ptr.To(false)}
}

// CacheOptions is the manager's cache: every object without its managedFields (the
// provider never reads them, and copying them cost a tenth of its CPU), all namespaces
// or only watchNamespace. Of core/v1 Events it holds only MetalLB's controller's with
// reason AllocationFailed (its refusals, which the Service controller relays; only it
// watches Events, so without it none are cached), not the provider's own warnings of
// that reason.
func CacheOptions(watchNamespace string) cache.Options {
	o := cache.Options{DefaultTransform: cacheTransform(), ByObject: map[client.Object]cache.ByObject{
		&corev1.Event{}: {Field: fields.SelectorFromSet(fields.Set{
			"reason": service.MetalLBAllocationFailedReason, "source": service.MetalLBController,
		})},
	}}
	if watchNamespace != "" {
		o.DefaultNamespaces = map[string]cache.Config{watchNamespace: {}}
	}
	return o
}

// Options are the provider's own flags (the manager's generic ones are in cmd/manager).
type Options struct {
	IPAMAPIURL              string
	IPAMAPITimeout          time.Duration
	IPAMAPIQuarantine       time.Duration
	ClusterID               string
	DefaultSecretNamespace  string
	DefaultSecretName       string
	MaxConcurrentReconciles int
	PoolProbeInterval       time.Duration
	SubnetRecheckInterval   time.Duration
	SecretRecheckInterval   time.Duration
	WatchFilter             string
	EnableWebhooks          bool

	// The Service controller (LoadBalancer Services, the IPAM-operator's successor).
	EnableServiceController bool
	LoadBalancerClass       string
	ExcludedNamespaces      []string
	DefaultZone             string

	// Clients replaces the IPAM-API client factory (tests); nil means the real one.
	Clients registrar.ClientFactory
	// Clock replaces the wall clock of registration attempt times (tests jump it); nil
	// means the host's.
	Clock clock.PassiveClock
	// Monotonic replaces the clock of the process's own waits (the simulation steps it);
	// nil means the host's monotonic clock.
	Monotonic clock.Clock
}

// AddFlags registers the provider's flags.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.IPAMAPIURL, "ipam-api-url", "",
		"Base URL of the vitistack IPAM-API, for example https://ipam-api.vitistack.io (a trailing /v2 is accepted). Pools may override it with spec.endpoint.")
	fs.DurationVar(&o.IPAMAPITimeout, "ipam-api-timeout", ipamapi.DefaultTimeout,
		"Deadline of every IPAM-API request.")
	fs.DurationVar(&o.IPAMAPIQuarantine, "ipam-api-quarantine", DefaultQuarantine,
		"How long after sending a request that got no answer the provider still counts on the IPAM-API carrying it out, and sends nothing else for "+
			"that identity or address: the real IPAM-API finishes a stalled request up to about 30 s after it arrived (its MongoDB driver's server "+
			"selection timeout), so keep this well above 30 s plus --ipam-api-timeout.")
	fs.StringVar(&o.ClusterID, "cluster-id", ClusterIDKubeSystemUID,
		"cluster_id sent to the IPAM-API for pools without spec.clusterID. "+ClusterIDKubeSystemUID+" (or empty): the UID of the kube-system Namespace (what the IPAM-operator used).")
	fs.StringVar(&o.DefaultSecretNamespace, "default-secret-namespace", "",
		"Namespace of the default IPAM-API secret, created on first use. Empty: ipam-system (the IPAM-operator's) with --enable-service-controller, else "+ProviderNamespace+".")
	fs.StringVar(&o.DefaultSecretName, "default-secret-name", "default",
		"Name of the default IPAM-API secret (an Opaque Secret with key \"secret\").")
	fs.IntVar(&o.MaxConcurrentReconciles, "max-concurrent-reconciles", 64,
		"How many IPAddressClaims are reconciled in parallel. Different claims are different IPAM-API identities, which it allocates safely in parallel; "+
			"a worker waiting for the IPAM-API costs nothing, so this bounds claims/s to about workers / IPAM-API latency (64 workers: over 300 claims/s at 200 ms).")
	fs.DurationVar(&o.PoolProbeInterval, "pool-probe-interval", 5*time.Minute,
		"How often each pool's Ready condition is checked against the IPAM-API when nothing changes.")
	fs.DurationVar(&o.SubnetRecheckInterval, "subnet-recheck-interval", time.Minute,
		"Subnet mode: how long an address found held by someone else in the IPAM-API is skipped before it is tried again (a released address stays held until the IPAM-API's sweeper frees it).")
	fs.DurationVar(&o.SecretRecheckInterval, "secret-recheck-interval", time.Minute,
		"How often a claim the IPAM-API refused for a reason only a user can fix (wrong secret, zone, address) looks at its Secret again (a change of the claim or its pool is seen at once), "+
			"and how often the Secret protector looks at each Secret it protects, or that a pool names but that does not exist yet: a value changed in place shows on the claims bound under it, "+
			"and a delete of a Secret that only a pool names goes through, within this time.")
	fs.StringVar(&o.WatchFilter, "watch-filter", "",
		"Only reconcile objects whose cluster.x-k8s.io/watch-filter label has this value.")
	fs.BoolVar(&o.EnableWebhooks, "enable-webhooks", true,
		"Serve the validating webhooks (turn off only for local runs without certificates).")
	fs.BoolVar(&o.EnableServiceController, "enable-service-controller", false,
		"Give Services of type LoadBalancer addresses from GlobalVitistackIPPools (the IPAM-operator's successor).")
	fs.StringVar(&o.LoadBalancerClass, "load-balancer-class", "",
		"Serve only Services with this spec.loadBalancerClass; empty: Services without a class (like MetalLB's default).")
	fs.StringSliceVar(&o.ExcludedNamespaces, "excluded-namespaces", DefaultExcludedNamespaces(),
		"Namespaces whose Services are never served.")
	fs.StringVar(&o.DefaultZone, "default-zone", "hnet-private",
		"Zone of Services without the ipam.vitistack.io/zone annotation.")
}

// DefaultQuarantine is --ipam-api-quarantine's default: a margin of 20 s over the
// longest the real IPAM-API was seen to take to carry out a stalled request (29.4 s
// after it was sent) plus the default request timeout (10 s).
const DefaultQuarantine = time.Minute

// DefaultExcludedNamespaces are the namespaces whose Services are never served unless
// --excluded-namespaces says otherwise: Kubernetes' own and the provider's.
func DefaultExcludedNamespaces() []string {
	return []string{"kube-system", "kube-public", "kube-node-lease", ProviderNamespace}
}

// ServiceDefaultSecretNamespace is where the IPAM-operator kept its default secret;
// with the Service controller on it is the default of --default-secret-namespace, so
// that Services the operator managed keep their addresses.
const ServiceDefaultSecretNamespace = "ipam-system"

// ClusterIDKubeSystemUID is the --cluster-id value (the default) that sends the UID of
// the kube-system Namespace. clusterctl cannot substitute an empty default, so the
// components default ${VITISTACK_CLUSTER_ID} to this word.
const ClusterIDKubeSystemUID = "kube-system-uid"

// ResolveDefaults fills what depends on other flags: the default secret's namespace is
// ipam-system when the Service controller is on, else the provider's namespace; the
// cluster ID kube-system-uid becomes empty (the controllers read the UID).
func (o *Options) ResolveDefaults() {
	if o.ClusterID == ClusterIDKubeSystemUID {
		o.ClusterID = ""
	}
	if o.DefaultSecretNamespace == "" {
		o.DefaultSecretNamespace = ProviderNamespace
		if o.EnableServiceController {
			o.DefaultSecretNamespace = ServiceDefaultSecretNamespace
		}
	}
	if o.DefaultSecretName == "" {
		o.DefaultSecretName = "default"
	}
}

// Validate checks the options.
func (o *Options) Validate() error {
	if o.IPAMAPIURL != "" {
		if _, err := ipamapi.ParseEndpoint(o.IPAMAPIURL); err != nil {
			return errors.Wrap(err, "--ipam-api-url")
		}
	}
	if o.IPAMAPIQuarantine != 0 && o.IPAMAPIQuarantine <= o.IPAMAPITimeout {
		return errors.Errorf("--ipam-api-quarantine (%s) must be longer than --ipam-api-timeout (%s): an unanswered request may be carried out "+
			"after the provider gave up on it", o.IPAMAPIQuarantine, o.IPAMAPITimeout)
	}
	if o.MaxConcurrentReconciles < 1 {
		return errors.New("--max-concurrent-reconciles must be at least 1")
	}
	if o.DefaultSecretNamespace == "" || o.DefaultSecretName == "" {
		return errors.New("--default-secret-namespace and --default-secret-name must not be empty")
	}
	return nil
}

// Setup adds the indexes, controllers and webhooks to mgr.
func Setup(ctx context.Context, mgr ctrl.Manager, o Options) error {
	o.ResolveDefaults()
	if err := o.Validate(); err != nil {
		return err
	}
	if err := index.Setup(ctx, mgr); err != nil {
		return err
	}
	clients := o.Clients
	if clients == nil {
		clients = &registrar.CachingClientFactory{Timeout: o.IPAMAPITimeout}
	}
	reg := registrar.New(mgr.GetClient(), mgr.GetAPIReader(), clients, registrar.Config{
		DefaultEndpoint:         o.IPAMAPIURL,
		ClusterID:               o.ClusterID,
		DefaultSecret:           types.NamespacedName{Namespace: o.DefaultSecretNamespace, Name: o.DefaultSecretName},
		RequestTimeout:          o.IPAMAPITimeout,
		QuarantineTime:          o.IPAMAPIQuarantine,
		MaxConcurrentReconciles: o.MaxConcurrentReconciles,
		PoolProbeInterval:       o.PoolProbeInterval,
		SubnetRecheckInterval:   o.SubnetRecheckInterval,
		SecretRecheckInterval:   o.SecretRecheckInterval,
		WatchFilterValue:        o.WatchFilter,
		Clock:                   o.Clock,
		Monotonic:               o.Monotonic,
	})
	// The Secrets and CA bundles protected, listed for every new leader: claims protect
	// the Secrets they register under (registrar.Secrets.Protect) as the protector does.
	ledger := &secret.Ledger{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(),
		Key: types.NamespacedName{Namespace: o.DefaultSecretNamespace, Name: secret.LedgerName}}
	reg.Secrets.Ledger = ledger
	if err := mgr.Add(stateMetrics(mgr, reg.InFlight, o.Clock)); err != nil {
		return errors.Wrap(err, "adding the state metrics")
	}
	if err := (&claim.Reconciler{Registrar: reg, Recorder: note.Capped(mgr.GetEventRecorder("vitistack-ipam"))}).SetupWithManager(ctx, mgr); err != nil {
		return errors.Wrap(err, "setting up the IPAddressClaim controller")
	}
	if err := (&secret.Protector{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Secrets: reg.Secrets, Wake: reg.Wake,
		Resync: o.SecretRecheckInterval, Ledger: ledger,
	}).SetupWithManager(ctx, mgr); err != nil {
		return errors.Wrap(err, "setting up the Secret protector")
	}
	if err := (&secret.CABundles{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Ledger: ledger}).SetupWithManager(ctx, mgr); err != nil {
		return errors.Wrap(err, "setting up the CA bundle protector")
	}
	for _, kind := range []string{ipamv1alpha1.VitistackIPPoolKind, ipamv1alpha1.GlobalVitistackIPPoolKind} {
		if err := (&pool.Reconciler{
			Registrar: reg, Kind: kind, Recorder: note.Capped(mgr.GetEventRecorder("vitistack-ipam")),
		}).SetupWithManager(ctx, mgr); err != nil {
			return errors.Wrapf(err, "setting up the %s controller", kind)
		}
		if o.EnableWebhooks {
			if err := (&webhooks.Pool{Client: mgr.GetClient(), Kind: kind}).SetupWithManager(mgr); err != nil {
				return errors.Wrapf(err, "setting up the %s webhook", kind)
			}
		}
	}
	if o.EnableServiceController {
		if err := (&service.Reconciler{
			Client:             mgr.GetClient(),
			WatchFilterValue:   o.WatchFilter,
			Recorder:           note.Capped(mgr.GetEventRecorder("vitistack-ipam-services")),
			LoadBalancerClass:  o.LoadBalancerClass,
			ExcludedNamespaces: o.ExcludedNamespaces,
			DefaultZone:        o.DefaultZone,
		}).SetupWithManager(ctx, mgr); err != nil {
			return errors.Wrap(err, "setting up the Service controller")
		}
		if o.EnableWebhooks {
			if err := (&webhooks.Service{
				Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), LoadBalancerClass: o.LoadBalancerClass,
				ExcludedNamespaces: o.ExcludedNamespaces, DefaultZone: o.DefaultZone,
			}).SetupWithManager(mgr); err != nil {
				return errors.Wrap(err, "setting up the Service webhook")
			}
		}
	}
	return nil
}

// stateMetrics serves the metrics of pools, claims and registrations from this
// process's cache and in-flight table while it leads (a runnable that needs the
// lease): a standby exports none, and lists nothing it does not watch.
func stateMetrics(mgr ctrl.Manager, inFlight *registrar.InFlight, clk clock.PassiveClock) manager.RunnableFunc {
	src := &metrics.Sources{Reader: mgr.GetClient(), Registrations: inFlight.Pending}
	if clk != nil {
		src.Now = clk.Now
	}
	return func(ctx context.Context) error {
		stop := metrics.Serve(src)
		<-ctx.Done()
		stop()
		return nil
	}
}
