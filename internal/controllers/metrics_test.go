package controllers_test

import (
	"testing"

	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/metrics"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// series is the sum of the series of metric name whose labels include want, as the
// manager's metrics endpoint serves them (the same registry), and whether there is one.
func series(t *testing.T, name string, want map[string]string) (sum float64, found bool) {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if hasLabels(m, want) {
				sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
				found = true
			}
		}
	}
	return sum, found
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
			n++
		}
	}
	return n == len(want)
}

// What an operator's dashboard shows of one namespace: its pools' readiness and use,
// its claims bound and waiting (with why, and for how long), and the IPAM-API requests
// that got them there.
func TestMetricsShowPoolsAndClaims(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	newPool(t, ns.Name, "routed", routedPool("inet", ipamv1alpha1.IPv4))
	newPool(t, ns.Name, "nowhere", routedPool("nowhere", ipamv1alpha1.IPv4))
	pool := func(name string) map[string]string {
		return map[string]string{"pool_kind": ipamv1alpha1.VitistackIPPoolKind, "pool_namespace": ns.Name, "pool": name}
	}
	with := func(m map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	registered, _ := series(t, "vitistack_ipam_api_requests_total", map[string]string{"operation": "register", "outcome": "success"})

	bound := []*ipamv1.IPAddressClaim{newClaim(t, ns.Name, "a", "routed", nil), newClaim(t, ns.Name, "b", "routed", nil),
		newClaim(t, ns.Name, "c", "routed", nil)}
	waiting := newClaim(t, ns.Name, "w", "nowhere", nil)
	for _, c := range bound {
		boundAddress(t, c)
	}
	readyCondition(t, waiting, "False", "PoolNotReady")

	g.Eventually(func(g Gomega) {
		v, ok := series(t, "vitistack_ipam_pool_ready", pool("routed"))
		g.Expect(ok).To(BeTrue(), "no vitistack_ipam_pool_ready for the routed pool")
		g.Expect(v).To(Equal(1.0))
		v, ok = series(t, "vitistack_ipam_pool_ready", pool("nowhere"))
		g.Expect(ok).To(BeTrue())
		g.Expect(v).To(Equal(0.0))
		v, _ = series(t, "vitistack_ipam_pool_addresses_in_use", pool("routed"))
		g.Expect(v).To(Equal(3.0))
		v, _ = series(t, "vitistack_ipam_claims", with(pool("routed"), "state", "bound", "reason", ipamv1alpha1.ClaimReadyAllocatedReason))
		g.Expect(v).To(Equal(3.0))
		v, _ = series(t, "vitistack_ipam_claims", with(pool("nowhere"), "state", "waiting", "reason", "PoolNotReady"))
		g.Expect(v).To(Equal(1.0))
		v, ok = series(t, "vitistack_ipam_claim_oldest_waiting_seconds", pool("nowhere"))
		g.Expect(ok).To(BeTrue())
		g.Expect(v).To(BeNumerically(">", 0))
		_, ok = series(t, "vitistack_ipam_claim_oldest_waiting_seconds", pool("routed"))
		g.Expect(ok).To(BeFalse(), "a pool without a waiting claim has an oldest waiting claim")
	}, eventually, poll).Should(Succeed())
	now, _ := series(t, "vitistack_ipam_api_requests_total", map[string]string{"operation": "register", "outcome": "success"})
	g.Expect(now - registered).To(BeNumerically(">=", 3))
}

// A registration whose answer was lost shows as quarantined for its IPAM-API host,
// from the manager's in-flight table, until it can no longer be carried out; then the
// claim is bound.
func TestMetricsShowAQuarantinedRegistration(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	api, url, stop := env.ExtraSim()
	t.Cleanup(stop)
	spec := routedPool("inet", ipamv1alpha1.IPv4)
	spec.Endpoint = url
	poolReady(t, newPool(t, ns.Name, "lossy", spec), metav1.ConditionTrue, ipamv1alpha1.PoolReadyReason, "")
	g.Expect(api.DropNext(sim.DropAfter, 1)).To(Succeed())
	c := newClaim(t, ns.Name, "lost", "lossy", nil)
	host := map[string]string{"host": metrics.Host(url)}
	g.Eventually(func() float64 { v, _ := series(t, "vitistack_ipam_api_registrations_quarantined", host); return v },
		eventually, poll).Should(Equal(1.0))
	boundAddress(t, c)
	v, _ := series(t, "vitistack_ipam_api_registrations_quarantined", host)
	g.Expect(v).To(BeZero())
	g.Expect(api.Stats().DroppedAfter).To(Equal(1))
}
