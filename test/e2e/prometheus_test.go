package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/yaml"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// A real Prometheus scrapes the manager and evaluates the shipped alert rules, with
// their windows scaled from minutes to seconds: it sees claims bind and the requests
// that bound them; when the IPAM-API fails every registration, the error alert fires
// for its host; when it recovers, the claims bind and the alert resolves. A pool of an
// unknown zone fires the pool alert, with its labels, until it is deleted.
func TestPrometheusSeesAllocationAndTheErrorAlert(t *testing.T) {
	onA.enter(t)
	g := newG(t)
	ctx := context.Background()
	metricsURL, err := url.Parse(aMgr.MetricsURL)
	g.Expect(err).NotTo(HaveOccurred())
	prom, err := localcluster.StartPrometheus(t.TempDir(), paths, scaledRules(t), metricsURL.Host)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(prom.Stop)
	query := func(expr string) func() (float64, error) {
		return func() (float64, error) { v, _, err := prom.Query(ctx, expr); return v, err }
	}

	ns := newNamespace(t, a, "prometheus")
	g.Expect(a.Client.Create(ctx, &ipamv1alpha1.VitistackIPPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"},
		Spec:       ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4},
	})).To(Succeed())
	// The baseline is read from the manager itself (a scrape), not from Prometheus,
	// which may not have scraped it yet.
	registered := metricSum(t, aMgr, "vitistack_ipam_api_requests_total", map[string]string{"operation": "register", "outcome": "success"})
	var claims []*ipamv1.IPAddressClaim
	for i := range 3 {
		claims = append(claims, newClaim(t, a, ns, fmt.Sprintf("bound-%d", i), ipamv1alpha1.VitistackIPPoolKind, "pool", nil))
	}
	for _, c := range claims {
		boundAddress(t, a, c)
	}
	g.Eventually(query(fmt.Sprintf(`sum(vitistack_ipam_claims{pool_namespace=%q,state="bound"})`, ns))).Should(Equal(3.0))
	g.Eventually(query(fmt.Sprintf(`vitistack_ipam_pool_ready{pool_namespace=%q,pool="pool"}`, ns))).Should(Equal(1.0))
	g.Eventually(query(`sum(vitistack_ipam_api_requests_total{operation="register",outcome="success"})`)).Should(
		BeNumerically(">=", registered+3))

	// The IPAM-API answers every registration with a 503: the claims made now wait, and
	// the error ratio of its host fires the alert.
	g.Expect(ipamAPI.SetFaults(ctx, sim.Faults{ErrorRate: 1, ErrorStatus: 503, ErrorBody: `{"message":"service unavailable"}`,
		Routes: []sim.Route{sim.RouteRegister}})).To(Succeed())
	t.Cleanup(func() { _ = ipamAPI.SetFaults(context.Background(), sim.Faults{}) })
	var waiting []*ipamv1.IPAddressClaim
	for i := range 3 {
		waiting = append(waiting, newClaim(t, a, ns, fmt.Sprintf("waiting-%d", i), ipamv1alpha1.VitistackIPPoolKind, "pool", nil))
	}
	api, err := url.Parse(ipamAPI.URL)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() ([]model.LabelSet, error) { return prom.Firing(ctx, "VitistackIPAMAPIErrors") }).
		WithTimeout(2 * timeout).Should(ContainElement(HaveKeyWithValue(model.LabelName("host"), model.LabelValue(api.Host))))
	g.Eventually(query(fmt.Sprintf(`sum(vitistack_ipam_claims{pool_namespace=%q,state="waiting"})`, ns))).Should(Equal(3.0))

	// It recovers: the waiting claims bind, and the alert resolves.
	g.Expect(ipamAPI.SetFaults(ctx, sim.Faults{})).To(Succeed())
	for _, c := range waiting {
		boundAddress(t, a, c)
	}
	g.Eventually(func() ([]model.LabelSet, error) { return prom.Firing(ctx, "VitistackIPAMAPIErrors") }).
		WithTimeout(2 * timeout).Should(BeEmpty())
	g.Eventually(query(fmt.Sprintf(`sum(vitistack_ipam_claims{pool_namespace=%q,state="bound"})`, ns))).Should(Equal(6.0))

	for _, c := range append(claims, waiting...) {
		deleteAndWait(t, a, c)
	}
	g.Eventually(query(fmt.Sprintf(`count(vitistack_ipam_claims{pool_namespace=%q}) or vector(0)`, ns))).Should(BeZero())

	// A second alert: a pool of a zone the IPAM-API does not know is not Ready, and the
	// pool alert fires for it alone; deleted, the alert resolves.
	g.Expect(a.Client.Create(ctx, &ipamv1alpha1.VitistackIPPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nowhere"},
		Spec:       ipamv1alpha1.VitistackIPPoolSpec{Zone: "nowhere", IPFamily: ipamv1alpha1.IPv4},
	})).To(Succeed())
	thisPool := func(pool string) []model.LabelSet {
		return []model.LabelSet{{"alertname": "VitistackIPAMPoolNotReady", "severity": "warning",
			"pool_kind": model.LabelValue(ipamv1alpha1.VitistackIPPoolKind), "pool_namespace": model.LabelValue(ns), "pool": model.LabelValue(pool)}}
	}
	poolAlerts := func() ([]model.LabelSet, error) {
		firing, err := prom.Firing(ctx, "VitistackIPAMPoolNotReady")
		var ours []model.LabelSet
		for _, l := range firing {
			if string(l["pool_namespace"]) == ns {
				ours = append(ours, l)
			}
		}
		return ours, err
	}
	g.Eventually(poolAlerts).WithTimeout(2 * timeout).Should(Equal(thisPool("nowhere")))
	deleteAndWait(t, a, &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nowhere"}})
	g.Eventually(poolAlerts).WithTimeout(2 * timeout).Should(BeEmpty())
}

// scaledRules is the spec of config/observability/prometheusrule.yaml, a Prometheus
// rules file, with its windows scaled from minutes to seconds (rate windows of 15 s,
// "for" of 5 s) so that an end-to-end test sees its alerts fire and resolve.
func scaledRules(t *testing.T) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "observability", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		t.Fatal(err)
	}
	rules, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	rules = regexp.MustCompile(`\[\d+m\]`).ReplaceAll(rules, []byte("[15s]"))
	return regexp.MustCompile(`(?m)^(\s*for: )\d+m$`).ReplaceAll(rules, []byte("${1}5s"))
}
