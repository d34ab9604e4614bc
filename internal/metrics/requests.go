package metrics

import (
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// The labels of the request metrics: what the request was for (register, release,
// rotate, probe), the IPAM-API's host[:port], and the outcome (success, or the class of
// the error in snake case: transient, backend_failing, wrong_secret...).
var requestLabels = []string{"operation", "host", "outcome"}

var (
	requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vitistack_ipam_api_requests_total",
		Help: "IPAM-API requests sent, by operation, IPAM-API host and outcome (success or the error's class).",
	}, requestLabels)
	requestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "vitistack_ipam_api_request_duration_seconds",
		Help: "Duration of IPAM-API requests, by operation, IPAM-API host and outcome (success or the error's class).",
		// 2 s is a boundary: the latency alert's p99 above 2 s is exact, not interpolated.
		Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 2.5, 5, 10, 30},
	}, requestLabels)
)

// Collectors are the provider's own metrics, all registered on controller-runtime's
// registry.
var Collectors = []prometheus.Collector{requests, requestDuration, &state{}}

func init() { ctrlmetrics.Registry.MustRegister(Collectors...) }

// RequestObserver is the ipamapi.Options.Observe of the client for endpoint.
func RequestObserver(endpoint string) func(ipamapi.Operation, error, time.Duration) {
	host := Host(endpoint)
	return func(op ipamapi.Operation, err error, d time.Duration) {
		outcome := ipamapi.Outcome(err)
		requests.WithLabelValues(string(op), host, outcome).Inc()
		requestDuration.WithLabelValues(string(op), host, outcome).Observe(d.Seconds())
	}
}

// Host is the host[:port] of an IPAM-API endpoint, its label in metrics (never the user
// information a URL may carry).
func Host(endpoint string) string {
	if u, err := url.Parse(endpoint); err == nil && u.Host != "" {
		return u.Host
	}
	return "unknown"
}
