package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/metrics"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

func claimOf(name, kind, pool string, created time.Time) *ipamv1.IPAddressClaim {
	return &ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name, CreationTimestamp: metav1.NewTime(created)},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{
			APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: kind, Name: pool}},
	}
}

func ready(reason string, status metav1.ConditionStatus) []metav1.Condition {
	return []metav1.Condition{{Type: "Ready", Status: status, Reason: reason, LastTransitionTime: metav1.Now()}}
}

// Pools and claims as a scrape shows them: each pool's readiness, use and capacity;
// claims counted by pool, state and reason; the age of each pool's oldest waiting
// claim; other providers' claims left out.
func TestStateMetrics(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	routed := &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "routed"},
		Spec:   ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4},
		Status: ipamv1alpha1.VitistackIPPoolStatus{Conditions: ready("Ready", metav1.ConditionTrue), AddressesInUse: ptr.To[int32](2)}}
	subnet := &ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: "nodes"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4, Subnet: "10.0.0.0/29", Gateway: "10.0.0.1"},
		Status: ipamv1alpha1.VitistackIPPoolStatus{Conditions: ready("ZoneRejected", metav1.ConditionFalse),
			AddressesInUse: ptr.To[int32](5), SubnetSize: ptr.To[int64](5)}}
	bound := claimOf("a", ipamv1alpha1.VitistackIPPoolKind, "routed", now.Add(-time.Hour))
	bound.Status.AddressRef.Name = "a"
	bound.Status.Conditions = ready("Allocated", metav1.ConditionTrue)
	bound2 := bound.DeepCopy()
	bound2.Name = "b"
	releasing := bound.DeepCopy()
	releasing.Name, releasing.Finalizers = "c", []string{"x"}
	releasing.DeletionTimestamp = &metav1.Time{Time: now}
	waiting := claimOf("d", ipamv1alpha1.GlobalVitistackIPPoolKind, "nodes", now.Add(-90*time.Second))
	waiting.Status.Conditions = ready("PoolExhausted", metav1.ConditionFalse)
	newer := claimOf("e", ipamv1alpha1.GlobalVitistackIPPoolKind, "nodes", now.Add(-5*time.Second))
	others := claimOf("f", "InClusterIPPool", "other", now.Add(-time.Hour))
	others.Spec.PoolRef.APIGroup = "ipam.cluster.x-k8s.io"

	scheme := runtime.NewScheme()
	must(t, ipamv1.AddToScheme(scheme))
	must(t, ipamv1alpha1.AddToScheme(scheme))
	c := fake.NewClientBuilder().WithScheme(scheme).
		WithObjects(routed, subnet, bound, bound2, releasing, waiting, newer, others).Build()
	stop := metrics.Serve(&metrics.Sources{Reader: c, Now: func() time.Time { return now },
		Registrations: func() map[string]metrics.Pending {
			return map[string]metrics.Pending{"ipam.example:443": {InFlight: 2, Quarantined: 1}}
		}})
	defer stop()

	want := `
# HELP vitistack_ipam_claims Claims of the provider's pools by state (bound, waiting: not bound yet, releasing: deleted, address not released yet) and the reason of their Ready condition (None without one).
# TYPE vitistack_ipam_claims gauge
vitistack_ipam_claims{pool="nodes",pool_kind="GlobalVitistackIPPool",pool_namespace="",reason="None",state="waiting"} 1
vitistack_ipam_claims{pool="nodes",pool_kind="GlobalVitistackIPPool",pool_namespace="",reason="PoolExhausted",state="waiting"} 1
vitistack_ipam_claims{pool="routed",pool_kind="VitistackIPPool",pool_namespace="apps",reason="Allocated",state="bound"} 2
vitistack_ipam_claims{pool="routed",pool_kind="VitistackIPPool",pool_namespace="apps",reason="Allocated",state="releasing"} 1
# HELP vitistack_ipam_claim_oldest_waiting_seconds Age of the pool's oldest claim that is waiting (not bound, not deleted); pools without one have none.
# TYPE vitistack_ipam_claim_oldest_waiting_seconds gauge
vitistack_ipam_claim_oldest_waiting_seconds{pool="nodes",pool_kind="GlobalVitistackIPPool",pool_namespace=""} 90
# HELP vitistack_ipam_pool_ready Whether the pool's Ready condition is True (1) or not (0).
# TYPE vitistack_ipam_pool_ready gauge
vitistack_ipam_pool_ready{pool="nodes",pool_kind="GlobalVitistackIPPool",pool_namespace=""} 0
vitistack_ipam_pool_ready{pool="routed",pool_kind="VitistackIPPool",pool_namespace="apps"} 1
# HELP vitistack_ipam_pool_addresses_in_use IPAddresses allocated from the pool (status.addressesInUse).
# TYPE vitistack_ipam_pool_addresses_in_use gauge
vitistack_ipam_pool_addresses_in_use{pool="nodes",pool_kind="GlobalVitistackIPPool",pool_namespace=""} 5
vitistack_ipam_pool_addresses_in_use{pool="routed",pool_kind="VitistackIPPool",pool_namespace="apps"} 2
# HELP vitistack_ipam_pool_addresses_capacity Addresses a subnet-mode pool may hand out (status.subnetSize); routed pools have none.
# TYPE vitistack_ipam_pool_addresses_capacity gauge
vitistack_ipam_pool_addresses_capacity{pool="nodes",pool_kind="GlobalVitistackIPPool",pool_namespace=""} 5
# HELP vitistack_ipam_pool_info A pool's zone, IP family and mode (routed or subnet); always 1.
# TYPE vitistack_ipam_pool_info gauge
vitistack_ipam_pool_info{ip_family="IPv4",mode="routed",pool="routed",pool_kind="VitistackIPPool",pool_namespace="apps",zone="inet"} 1
vitistack_ipam_pool_info{ip_family="IPv4",mode="subnet",pool="nodes",pool_kind="GlobalVitistackIPPool",pool_namespace="",zone="hnet-private"} 1
# HELP vitistack_ipam_api_registrations_in_flight Registrations and releases sent to the IPAM-API and not answered yet, by IPAM-API host.
# TYPE vitistack_ipam_api_registrations_in_flight gauge
vitistack_ipam_api_registrations_in_flight{host="ipam.example:443"} 2
# HELP vitistack_ipam_api_registrations_quarantined Identities whose last registration or release ended without an answer, held back until it has certainly ended, by IPAM-API host.
# TYPE vitistack_ipam_api_registrations_quarantined gauge
vitistack_ipam_api_registrations_quarantined{host="ipam.example:443"} 1
`
	state := metrics.Collectors[2]
	if err := testutil.CollectAndCompare(state, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}

	// A standby (nothing served) exports none of them.
	stop()
	if n := testutil.CollectAndCount(state); n != 0 {
		t.Fatalf("%d state metrics without a leading manager, want none", n)
	}
}

// Each request is counted and timed by what it was for, the IPAM-API's host (never the
// user information of its URL) and its outcome.
func TestRequestMetrics(t *testing.T) {
	requests, durations := metrics.Collectors[0].(*prometheus.CounterVec), metrics.Collectors[1].(*prometheus.HistogramVec)
	requests.Reset()
	durations.Reset()
	observe := metrics.RequestObserver("https://user:password@ipam.example:8443/v2")
	observe(ipamapi.OpRegister, nil, 20*time.Millisecond)
	observe(ipamapi.OpRotate, &ipamapi.Error{Class: ipamapi.ClassRotationRefused}, time.Second)
	observe(ipamapi.OpRelease, &ipamapi.Error{Class: ipamapi.ClassBackendFailing}, time.Second)
	for _, c := range []struct {
		op, outcome string
	}{{"register", "success"}, {"rotate", "rotation_refused"}, {"release", "backend_failing"}} {
		if n := testutil.ToFloat64(requests.WithLabelValues(c.op, "ipam.example:8443", c.outcome)); n != 1 {
			t.Errorf("requests_total{operation=%q,outcome=%q} = %v, want 1", c.op, c.outcome, n)
		}
	}
	if n := testutil.CollectAndCount(durations); n != 3 {
		t.Errorf("%d duration series, want 3", n)
	}
	out, err := testutil.CollectAndFormat(requests, expfmt.TypeTextPlain)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "password") || strings.Contains(string(out), "user") {
		t.Errorf("the endpoint's user information is in a label:\n%s", out)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
