package metrics

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
)

// Sources is what the state metrics are computed from at each scrape.
type Sources struct {
	// Reader lists pools and claims: the leading manager's cache.
	Reader client.Reader
	// Registrations counts, by IPAM-API host, the registrations in flight and those
	// quarantined (their answer was lost; no other goes out for the identity or the
	// address until the request has certainly ended).
	Registrations func() map[string]Pending
	// Now is the clock of ages (nil: the host's).
	Now func() time.Time
}

// Pending is what Sources.Registrations counts for one IPAM-API host.
type Pending struct{ InFlight, Quarantined int }

var current atomic.Pointer[Sources]

// Serve computes the state metrics from src until stop is called: a manager calls it
// once it leads (a standby exports none).
func Serve(src *Sources) (stop func()) {
	current.Store(src)
	return func() { current.CompareAndSwap(src, nil) }
}

var poolLabels = []string{"pool_kind", "pool_namespace", "pool"}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	poolInfo = desc("vitistack_ipam_pool_info", "A pool's zone, IP family and mode (routed or subnet); always 1.",
		append(poolLabels, "zone", "ip_family", "mode")...)
	poolReady = desc("vitistack_ipam_pool_ready", "Whether the pool's Ready condition is True (1) or not (0).", poolLabels...)
	poolInUse = desc("vitistack_ipam_pool_addresses_in_use", "IPAddresses allocated from the pool (status.addressesInUse).", poolLabels...)
	poolSize  = desc("vitistack_ipam_pool_addresses_capacity",
		"Addresses a subnet-mode pool may hand out (status.subnetSize); routed pools have none.", poolLabels...)
	claims = desc("vitistack_ipam_claims",
		"Claims of the provider's pools by state (bound, waiting: not bound yet, releasing: deleted, address not released yet) "+
			"and the reason of their Ready condition (None without one).", append(poolLabels, "state", "reason")...)
	oldestWaiting = desc("vitistack_ipam_claim_oldest_waiting_seconds",
		"Age of the pool's oldest claim that is waiting (not bound, not deleted); pools without one have none.", poolLabels...)
	inFlight = desc("vitistack_ipam_api_registrations_in_flight",
		"Registrations and releases sent to the IPAM-API and not answered yet, by IPAM-API host.", "host")
	quarantined = desc("vitistack_ipam_api_registrations_quarantined",
		"Identities whose last registration or release ended without an answer, held back until it has certainly ended, by IPAM-API host.", "host")
)

// state is the collector of the metrics computed at each scrape.
type state struct{}

// Describe implements prometheus.Collector.
func (*state) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolInfo, poolReady, poolInUse, poolSize, claims, oldestWaiting, inFlight, quarantined} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A list that fails leaves its metrics out of
// this scrape (the rest of the scrape, controller-runtime's metrics too, still goes).
func (*state) Collect(ch chan<- prometheus.Metric) {
	src := current.Load()
	if src == nil {
		return
	}
	now := time.Now()
	if src.Now != nil {
		now = src.Now()
	}
	if src.Registrations != nil {
		for host, p := range src.Registrations() {
			ch <- prometheus.MustNewConstMetric(inFlight, prometheus.GaugeValue, float64(p.InFlight), host)
			ch <- prometheus.MustNewConstMetric(quarantined, prometheus.GaugeValue, float64(p.Quarantined), host)
		}
	}
	if src.Reader == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	collectPools(ctx, src.Reader, ch)
	collectClaims(ctx, src.Reader, now, ch)
}

func collectPools(ctx context.Context, r client.Reader, ch chan<- prometheus.Metric) {
	local := &ipamv1alpha1.VitistackIPPoolList{}
	global := &ipamv1alpha1.GlobalVitistackIPPoolList{}
	if r.List(ctx, local, client.UnsafeDisableDeepCopy) != nil || r.List(ctx, global, client.UnsafeDisableDeepCopy) != nil {
		return
	}
	for i := range local.Items {
		collectPool(ch, ipamv1alpha1.VitistackIPPoolKind, &local.Items[i])
	}
	for i := range global.Items {
		collectPool(ch, ipamv1alpha1.GlobalVitistackIPPoolKind, &global.Items[i])
	}
}

func collectPool(ch chan<- prometheus.Metric, kind string, p ipamv1alpha1.Pool) {
	labels := []string{kind, p.GetNamespace(), p.GetName()}
	spec, st := p.PoolSpec(), p.PoolStatus()
	mode := "routed"
	if spec.Subnet != "" {
		mode = "subnet"
	}
	ch <- prometheus.MustNewConstMetric(poolInfo, prometheus.GaugeValue, 1, append(labels, spec.Zone, string(spec.IPFamily), mode)...)
	ready := 0.0
	if meta.IsStatusConditionTrue(st.Conditions, ipamv1alpha1.PoolReadyCondition) {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(poolReady, prometheus.GaugeValue, ready, labels...)
	if st.AddressesInUse != nil {
		ch <- prometheus.MustNewConstMetric(poolInUse, prometheus.GaugeValue, float64(*st.AddressesInUse), labels...)
	}
	if spec.Subnet != "" && st.SubnetSize != nil {
		ch <- prometheus.MustNewConstMetric(poolSize, prometheus.GaugeValue, float64(*st.SubnetSize), labels...)
	}
}

type poolKey struct{ kind, namespace, name string }

type claimKey struct {
	pool          poolKey
	state, reason string
}

// collectClaims counts the cache's claims. Without deep copies a list still copies each
// claim's top-level struct: about 25 MB for 50,000 claims, for the moment of a scrape.
func collectClaims(ctx context.Context, r client.Reader, now time.Time, ch chan<- prometheus.Metric) {
	list := &ipamv1.IPAddressClaimList{}
	if r.List(ctx, list, client.UnsafeDisableDeepCopy) != nil {
		return
	}
	counts := map[claimKey]int{}
	oldest := map[poolKey]time.Time{}
	for i := range list.Items {
		c := &list.Items[i]
		ref := c.Spec.PoolRef
		if ref.APIGroup != ipamv1alpha1.GroupVersion.Group ||
			ref.Kind != ipamv1alpha1.VitistackIPPoolKind && ref.Kind != ipamv1alpha1.GlobalVitistackIPPoolKind {
			continue
		}
		pool := poolKey{kind: ref.Kind, name: ref.Name}
		if ref.Kind == ipamv1alpha1.VitistackIPPoolKind {
			pool.namespace = c.Namespace
		}
		k := claimKey{pool: pool, state: "waiting", reason: "None"}
		switch {
		case !c.DeletionTimestamp.IsZero():
			k.state = "releasing"
		case c.Status.AddressRef.Name != "":
			k.state = "bound"
		default:
			if t, ok := oldest[pool]; !ok || c.CreationTimestamp.Time.Before(t) {
				oldest[pool] = c.CreationTimestamp.Time
			}
		}
		if cond := meta.FindStatusCondition(c.Status.Conditions, ipamv1.IPAddressClaimReadyCondition); cond != nil {
			k.reason = cond.Reason
		}
		counts[k]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(claims, prometheus.GaugeValue, float64(n), k.pool.kind, k.pool.namespace, k.pool.name, k.state, k.reason)
	}
	for p, t := range oldest {
		ch <- prometheus.MustNewConstMetric(oldestWaiting, prometheus.GaugeValue, max(now.Sub(t).Seconds(), 0), p.kind, p.namespace, p.name)
	}
}
