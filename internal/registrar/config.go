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
	// ClusterID is the cluster_id for pools without spec.clusterID ("": kube-system's UID).
	ClusterID string
	// DefaultSecret is the Secret used when neither claim nor pool names one. It is
	// created on first use, in a namespace that must exist.
	DefaultSecret types.NamespacedName
	// RequestTimeout bounds every IPAM-API request.
	RequestTimeout time.Duration
	// QuarantineTime is how long an unanswered request may still be carried out (0: see Quarantine).
	QuarantineTime time.Duration
	// MaxConcurrentReconciles is the number of claims reconciled in parallel.
	MaxConcurrentReconciles int
	// PoolProbeInterval is how often a pool's Ready condition is checked again.
	PoolProbeInterval time.Duration
	// SubnetRecheckInterval is how long a subnet address found held elsewhere is skipped.
	SubnetRecheckInterval time.Duration
	// SecretRecheckInterval is how often a claim refused for a reason only a user can fix looks
	// at its Secret again: Secrets are not watched (claims and pools are).
	SecretRecheckInterval time.Duration
	// Clock is the wall clock of registration attempt times and claims' ages (nil: the host's).
	Clock clock.PassiveClock
	// Monotonic times the process's own waits: how long an unanswered request stays busy,
	// how often waiting claims ask the Secret protector, how long a subnet address found
	// taken is skipped, when a pool is checked again, and the polls for the cache (nil: the
	// host's monotonic clock, which no change of the wall clock moves). The simulation
	// steps it.
	Monotonic clock.Clock
	// WatchFilterValue, if set, limits reconciliation to objects with the
	// cluster.x-k8s.io/watch-filter label of this value.
	WatchFilterValue string
}

// Quarantine is QuarantineTime, else twice the request timeout.
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

// Ticks is Monotonic, else the host's clock.
func (c Config) Ticks() clock.Clock {
	if c.Monotonic != nil {
		return c.Monotonic
	}
	return clock.RealClock{}
}

// OrHost is clk, else (nil) the host's clock: the zero value of a type with a clock field
// runs on the host's.
func OrHost(clk clock.PassiveClock) clock.PassiveClock {
	if clk == nil {
		return clock.RealClock{}
	}
	return clk
}

// ClientFactory gives the IPAM-API client for an endpoint and CA bundle.
type ClientFactory interface {
	For(endpoint string, caBundle []byte) (ipamapi.Client, error)
}

// CachingClientFactory keeps one HTTP client per endpoint and CA bundle, so connections are reused.
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
