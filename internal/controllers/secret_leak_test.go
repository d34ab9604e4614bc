package controllers_test

import (
	"encoding/json"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// No secret value may appear in a log line, an event, an object other than its Secret,
// a condition, or a metric — on success paths and failure paths alike.
func TestSecretValuesNeverLeak(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	const custom = "Leak-Canary-9f8e7d6c5b4a"
	const wrong = "Wrong-Canary-0a1b2c3d4e5f"
	for name, v := range map[string]string{"pool-secret": custom, "wrong": wrong} {
		g.Expect(env.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name}, Data: map[string][]byte{"secret": []byte(v)},
		})).To(Succeed())
	}
	spec := routedPool("inet", ipamv1alpha1.IPv4)
	spec.SecretRef = &ipamv1alpha1.SecretReference{Name: "pool-secret"}
	pool := newPool(t, ns.Name, "canary", spec)

	// Success, release, and a registration that fails with the wrong secret.
	ok := newClaim(t, ns.Name, "ok", pool.Name, map[string]string{"ipam.vitistack.io/addresses": "83.118.171.77"})
	boundAddress(t, ok)
	// A transient failure whose body echoes what it was sent (on a stand-in of its own,
	// so no other test's claim meets the fault).
	api, url, stop := env.ExtraSim()
	t.Cleanup(stop)
	echoSpec := spec
	echoSpec.Endpoint = url
	echoPool := newPool(t, ns.Name, "canary-echo", echoSpec)
	api.SetFaultRoutes(sim.RouteRegister)
	g.Expect(api.FailNext(1, 503, `{"message":"upstream said: `+custom+`"}`)).To(Succeed())
	echo := newClaim(t, ns.Name, "echo", echoPool.Name, nil)
	hasEvent(t, echo, corev1.EventTypeWarning, "IPAMAPIUnreachable", "HTTP 503: upstream said: [redacted]")
	boundAddress(t, echo)
	registerDirect(t, `{"secret":"`+custom+`","zone":"inet","ip_family":"ipv4","address":"83.118.171.78/32",`+
		`"service":{"service_name":"elsewhere","namespace_id":"x","cluster_id":"y"}}`)
	bad := newClaim(t, ns.Name, "bad", pool.Name, map[string]string{
		"ipam.vitistack.io/addresses": "83.118.171.78", "ipam.vitistack.io/secret": "wrong",
	})
	readyCondition(t, bad, metav1.ConditionFalse, "AddressTaken")
	deleteAndWait(t, ok)
	poolReady(t, pool, metav1.ConditionTrue, "Ready", "accepts zone inet")

	canaries := []string{custom, wrong}
	def := &corev1.Secret{}
	if env.Client.Get(ctx, client.ObjectKey{Namespace: "capi-ipam-vitistack-system", Name: "default"}, def) == nil {
		canaries = append(canaries, string(def.Data["secret"])) // when other tests have created it
	}

	var haystacks []string
	haystacks = append(haystacks, env.Logs.String())
	events := &corev1.EventList{}
	g.Expect(env.Client.List(ctx, events)).To(Succeed())
	g.Expect(events.Items).NotTo(BeEmpty())
	haystacks = append(haystacks, mustJSON(t, events))
	for _, list := range []client.ObjectList{
		&ipamv1.IPAddressClaimList{}, &ipamv1.IPAddressList{},
		&ipamv1alpha1.VitistackIPPoolList{}, &ipamv1alpha1.GlobalVitistackIPPoolList{},
	} {
		g.Expect(env.Client.List(ctx, list)).To(Succeed())
		haystacks = append(haystacks, mustJSON(t, list))
	}
	families, err := metrics.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	var m strings.Builder
	for _, f := range families {
		_, _ = expfmt.MetricFamilyToText(&m, f)
	}
	g.Expect(m.String()).To(ContainSubstring("vitistack_ipam_api_request_duration_seconds"))
	haystacks = append(haystacks, m.String())

	g.Expect(haystacks[0]).To(ContainSubstring("Reconciler error"), "the failures were logged, so the logs were really searched")
	for _, h := range haystacks {
		for _, c := range canaries {
			g.Expect(strings.Contains(h, c)).To(BeFalse(), "a secret value leaked into: %.300s", h[max(0, strings.Index(h, c)-200):])
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return string(b)
}
