package e2e

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

// IPAM-API secret values never show in the manager's log, events, conditions, objects
// or metrics, nor in the stand-in's log, through allocation, a refused address (wrong
// secret), a rotation and the release.
func TestSecretValuesNeverLeak(t *testing.T) {
	onA.enter(t)
	g := newG(t)
	ctx := context.Background()
	ns := newNamespace(t, a, "secrets")
	values := map[string]string{"owner": canary("owner"), "intruder": canary("intruder"), "rotated": canary("rotated")}
	for name, v := range values {
		newSecret(t, a, ns, name, v)
	}
	g.Expect(a.Client.Create(ctx, &ipamv1alpha1.VitistackIPPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"},
		Spec:       ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4, SecretRef: &ipamv1alpha1.SecretReference{Name: "owner"}},
	})).To(Succeed())

	// Both declare one share key, so the provider lets the intruder ask the IPAM-API,
	// which refuses the wrong secret.
	owner := &ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owner", Annotations: map[string]string{ipamv1alpha1.AllowLocalSharedIPAnnotation: "both"}},
		Spec:       ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: "VitistackIPPool", Name: "pool"}},
	}
	g.Expect(a.Client.Create(ctx, owner)).To(Succeed())
	addr := boundAddress(t, a, owner)

	// Another claim asks for the same address with another secret: refused, visibly.
	intruder := &ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "intruder", Annotations: map[string]string{
			ipamv1alpha1.AddressesAnnotation: addr.Spec.Address, ipamv1alpha1.SecretAnnotation: "intruder",
			ipamv1alpha1.AllowLocalSharedIPAnnotation: "both"}},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: "VitistackIPPool", Name: "pool"}},
	}
	g.Expect(a.Client.Create(ctx, intruder)).To(Succeed())
	readyReason(t, a, intruder, metav1.ConditionFalse, ipamv1alpha1.ClaimReadyAddressTakenReason)
	g.Eventually(func() []corev1.Event { return eventsOf(t, a, intruder) }).Should(
		ContainElement(HaveField("Reason", ipamv1alpha1.ClaimReadyAddressTakenReason)))

	// The owner rotates to another secret.
	g.Eventually(func(g Gomega) {
		c := &ipamv1.IPAddressClaim{}
		g.Expect(a.Client.Get(ctx, client.ObjectKeyFromObject(owner), c)).To(Succeed())
		c.Annotations = map[string]string{ipamv1alpha1.SecretAnnotation: "rotated", ipamv1alpha1.AllowLocalSharedIPAnnotation: "both"}
		g.Expect(a.Client.Update(ctx, c)).To(Succeed())
	}).Should(Succeed())
	g.Eventually(func(g Gomega) {
		c := &ipamv1.IPAddressClaim{}
		g.Expect(a.Client.Get(ctx, client.ObjectKeyFromObject(owner), c)).To(Succeed())
		g.Expect(c.Status.Conditions).To(ContainElement(And(HaveField("Type", ipamv1alpha1.ClaimSecretRotatedCondition), HaveField("Status", metav1.ConditionTrue))))
	}).Should(Succeed())

	// Everything a user or an operator can read, while the objects exist and after.
	all := []string{values["owner"], values["intruder"], values["rotated"]}
	g.Expect(canariesFound(t, a, []*localcluster.Manager{aMgr}, all)).To(BeEmpty(), "a secret value shows while the claims exist")
	deleteAndWait(t, a, intruder)
	deleteAndWait(t, a, owner)
	g.Expect(activeHolders(t, a, addr.Spec.Address)).To(BeEmpty())

	metrics, err := localcluster.Get(ctx, aMgr.MetricsURL)
	g.Expect(err).NotTo(HaveOccurred())
	// The provider's own metrics: each request by what it was for and how it ended, and
	// the pool's readiness.
	for _, series := range []string{
		`vitistack_ipam_api_requests_total\{host="127\.0\.0\.1:\d+",operation="register",outcome="success"\} [1-9]`,
		`vitistack_ipam_api_requests_total\{host="127\.0\.0\.1:\d+",operation="rotate",outcome="success"\} [1-9]`,
		`vitistack_ipam_api_requests_total\{host="127\.0\.0\.1:\d+",operation="probe",outcome="not_held"\} [1-9]`,
		`vitistack_ipam_api_request_duration_seconds_count\{host="127\.0\.0\.1:\d+",operation="release",outcome="success"\} [1-9]`,
		`vitistack_ipam_pool_ready\{pool="[^"]+",pool_kind="VitistackIPPool",pool_namespace="[^"]+"\} 1`,
	} {
		g.Expect(metrics).To(MatchRegexp(series))
	}
	// The pool controllers are built with Cluster API's builder, which counts their reconciles.
	g.Expect(metrics).To(MatchRegexp(`capi_reconcile_total\{controller="VitistackIPPool",result="[a-z_]+"\} [1-9]`))
	g.Expect(logsOf(t, aMgr)).To(ContainSubstring("intruder"), "the manager logged nothing about the refused claim (log level 2)")
	g.Expect(canariesFound(t, a, []*localcluster.Manager{aMgr}, all)).To(BeEmpty(), "a secret value shows after the claims are gone")
}
