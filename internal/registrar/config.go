package registrar

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/metrics"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// Config is what the manager's flags give the controllers.
type Config struct {
	// DefaultEndpoint is the IPAM-API base URL for pools without spec.endpoint.
	DefaultEndpoint string
	// ClusterID is the cluster_id for pools without spec.clusterID; empty means the
	// UID of the kube-system Namespace.
	ClusterID string
	// DefaultSecret is the Secret used when neither claim nor pool names one. It is
	// created on first use, in a namespace that must exist.
	DefaultSecret types.NamespacedName
	// RequestTimeout bounds every IPAM-API request.
	RequestTimeout time.Duration
	// QuarantineTime is how long a request whose answer never came may still be carried
	// out by the IPAM-API; zero means twice RequestTimeout (what the manager uses).
	QuarantineTime time.Duration
	// MaxConcurrentReconciles is the number of claims reconciled in parallel.
	MaxConcurrentReconciles int
	// PoolProbeInterval is how often a pool's Ready condition is checked again.
	PoolProbeInterval time.Duration
	// SubnetRecheckInterval is how long a subnet address found held by someone else is
	// skipped before it is tried again.
	SubnetRecheckInterval time.Duration
	// SecretRecheckInterval is how often a claim the IPAM-API refused for a reason only
	// a user can fix looks at its Secret again (Secrets are not watched); a change of
	// the claim or its pool is seen at once.
	SecretRecheckInterval time.Duration
	// Clock is the wall clock of registration attempt times (nil: the host's); tests
	// jump it.
	Clock clock.PassiveClock
	// WatchFilterValue, if set, limits reconciliation to objects with the
	// cluster.x-k8s.io/watch-filter label of this value.
	WatchFilterValue string
}

// Quarantine is how long a registration without an answer may still complete on the
// IPAM-API: QuarantineTime, else twice the request timeout.
func (c Config) Quarantine() time.Duration {
	if c.QuarantineTime > 0 {
		return c.QuarantineTime
	}
	t := c.RequestTimeout
	if t <= 0 {
		t = ipamapi.DefaultTimeout
	}
	return 2 * t
}

// ClientFactory gives the IPAM-API client for an endpoint and CA bundle.
type ClientFactory interface {
	For(endpoint string, caBundle []byte) (ipamapi.Client, error)
}

// CachingClientFactory builds one HTTP client per endpoint and CA bundle and keeps
// it, so connections are reused.
type CachingClientFactory struct {
	// Timeout bounds every request.
	Timeout time.Duration

	mu      sync.Mutex
	clients map[string]ipamapi.Client
}

// For implements ClientFactory.
func (f *CachingClientFactory) For(endpoint string, caBundle []byte) (ipamapi.Client, error) {
	endpoint = ipamapi.NormalizeEndpoint(endpoint)
	sum := sha256.Sum256(caBundle)
	key := endpoint + "\x00" + hex.EncodeToString(sum[:])
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.clients[key]; ok {
		return c, nil
	}
	timeout := f.Timeout
	if timeout <= 0 {
		timeout = ipamapi.DefaultTimeout
	}
	hc, err := ipamapi.NewClient(endpoint, ipamapi.Options{
		Timeout:  timeout,
		CABundle: caBundle,
		Observe:  metrics.RequestObserver(endpoint),
	})
	if err != nil {
		return nil, err
	}
	if f.clients == nil {
		f.clients = map[string]ipamapi.Client{}
	}
	f.clients[key] = hc
	return hc, nil
}
