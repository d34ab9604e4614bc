package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
)

// helmRun runs the pinned Helm (E2E_HELM) against w.
func helmRun(t *testing.T, w *localcluster.ControlPlane, args ...string) string {
	t.Helper()
	out, err := w.Helm(args...)
	newG(t).Expect(err).NotTo(HaveOccurred(), "helm %s:\n%s", strings.Join(args, " "), out)
	return out
}

// The Helm chart's life on a real control plane, as Argo CD or a user drives it:
// installed (the workload install), the manager run with the Deployment's arguments and
// as its ServiceAccount, a LoadBalancer Service and a claim get addresses the IPAM-API
// registered; upgraded with other values (replicas, a flag), rolled back, each time the
// manager restarted from the Deployment as a rollout would, and nothing is registered
// again; the Service and the claim deleted release their addresses; uninstalled,
// nothing of the release is left but what it keeps on purpose (the CRDs, the default
// secret's namespace) and what the user owns.
func TestHelmChartInstallUpgradeRollbackUninstall(t *testing.T) {
	onOwn.enter(t)
	g := newG(t)
	ctx := context.Background()
	w := newControlPlane(t, "helm", nil)
	installCertManagerCRDs(t, w)
	chart := filepath.Join("..", "..", "charts", "cluster-api-ipam-provider-vitistack")
	const ns = manager.ProviderNamespace
	helmRun(t, w, "install", "ipam", chart, "--namespace", ns, "--create-namespace",
		"--set", "ipamAPI.url="+simOf(w).URL, "--set", "logLevel=2")

	deploymentArgs := func() (int32, []string) {
		d := &appsv1.Deployment{}
		g.Expect(w.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: localcluster.DeploymentName}, d)).To(Succeed())
		return *d.Spec.Replicas, d.Spec.Template.Spec.Containers[0].Args
	}
	replicas, args := deploymentArgs()
	g.Expect(replicas).To(BeEquivalentTo(1))
	g.Expect(args).To(ContainElements("--ipam-api-url="+simOf(w).URL, "--v=2", "--enable-service-controller"))
	mgr, err := w.StartManager(ctx, nil)
	g.Expect(err).NotTo(HaveOccurred())
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			mgr.Stop()
		}
	})
	// A rollout: the manager started again from the Deployment as it is now.
	rollout := func() {
		t.Helper()
		mgr.Stop()
		mgr, err = w.StartManager(ctx, nil)
		g.Expect(err).NotTo(HaveOccurred())
	}

	newGlobalPool(t, w, "hnet-private-ipv4", "hnet-private", ipamv1alpha1.IPv4)
	apps := newNamespace(t, w, "apps")
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: apps, Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
	}
	g.Expect(w.Client.Create(ctx, svc)).To(Succeed())
	var svcAddress string
	g.Eventually(func() string {
		got := &corev1.Service{}
		g.Expect(w.Client.Get(ctx, client.ObjectKeyFromObject(svc), got)).To(Succeed())
		svcAddress = got.Annotations["metallb.io/loadBalancerIPs"]
		return svcAddress
	}).ShouldNot(BeEmpty())
	claim := newClaim(t, w, apps, "vip", ipamv1alpha1.GlobalVitistackIPPoolKind, "hnet-private-ipv4", nil)
	claimAddress := boundAddress(t, w, claim).Spec.Address
	for _, a := range []string{svcAddress, claimAddress} {
		g.Expect(activeHolders(t, w, a)).To(HaveLen(1), "%s is registered", a)
	}

	// Upgraded with other values; then rolled back.
	// (The local rig routes the webhooks to the manager process; Helm writes them as the
	// chart has them, naming the webhook Service.)
	g.Expect(w.UnrouteWebhooks(ctx)).To(Succeed())
	helmRun(t, w, "upgrade", "ipam", chart, "--namespace", ns, "--reuse-values", "--set", "replicas=2", "--set", "logLevel=1")
	replicas, args = deploymentArgs()
	g.Expect(replicas).To(BeEquivalentTo(2))
	g.Expect(args).To(ContainElement("--v=1"))
	rollout()
	// The upgraded manager reconciles both claims (the Service's and the other) and
	// sends nothing for them.
	g.Eventually(func() float64 {
		return metricSum(t, mgr, "controller_runtime_reconcile_total", map[string]string{"controller": "ipaddressclaim", "result": "success"})
	}).Should(BeNumerically(">=", 2))
	g.Expect(metricSum(t, mgr, "vitistack_ipam_api_requests_total", map[string]string{"operation": "register"})).To(BeZero(),
		"the upgraded manager registered bound claims again")
	g.Expect(helmRun(t, w, "history", "ipam", "--namespace", ns)).To(ContainSubstring("Upgrade complete"))
	g.Expect(w.UnrouteWebhooks(ctx)).To(Succeed())
	helmRun(t, w, "rollback", "ipam", "1", "--namespace", ns)
	replicas, args = deploymentArgs()
	g.Expect(replicas).To(BeEquivalentTo(1))
	g.Expect(args).To(ContainElement("--v=2"))
	rollout()
	// Through both, the addresses stayed where they were, and the managers started
	// anew sent nothing for them: the rolled-back one registers the new claim alone,
	// once it has reconciled all three.
	claim2 := newClaim(t, w, apps, "vip-2", ipamv1alpha1.GlobalVitistackIPPoolKind, "hnet-private-ipv4", nil)
	boundAddress(t, w, claim2)
	g.Eventually(func() float64 {
		return metricSum(t, mgr, "controller_runtime_reconcile_total", map[string]string{"controller": "ipaddressclaim", "result": "success"})
	}).Should(BeNumerically(">=", 3))
	g.Expect(metricSum(t, mgr, "vitistack_ipam_api_requests_total", map[string]string{"operation": "register"})).To(Equal(1.0),
		"registrations sent again after the upgrade or the rollback")
	for _, a := range []string{svcAddress, claimAddress} {
		g.Expect(activeHolders(t, w, a)).To(HaveLen(1), "%s is still registered, once", a)
	}
	got := &corev1.Service{}
	g.Expect(w.Client.Get(ctx, client.ObjectKeyFromObject(svc), got)).To(Succeed())
	g.Expect(got.Annotations).To(HaveKeyWithValue("metallb.io/loadBalancerIPs", svcAddress))

	// Deleted, the Service and the claims release their addresses.
	released := []string{svcAddress, claimAddress, boundAddress(t, w, claim2).Spec.Address}
	deleteAndWait(t, w, svc)
	deleteAndWait(t, w, claim)
	deleteAndWait(t, w, claim2)
	for _, a := range released {
		g.Expect(activeHolders(t, w, a)).To(BeEmpty(), "%s is released", a)
	}
	settledAccounts(t, w, map[string]bool{uidOf(t, w, apps): true})

	// Uninstalled: the release's objects go, the CRDs (and so the pools) and the default
	// secret's namespace stay.
	mgr.Stop()
	stopped = true
	helmRun(t, w, "uninstall", "ipam", "--namespace", ns)
	for _, o := range []client.Object{
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: localcluster.DeploymentName}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "capi-ipam-vitistack-manager"}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "capi-ipam-vitistack-webhook-service"}},
	} {
		g.Expect(apierrors.IsNotFound(w.Client.Get(ctx, client.ObjectKeyFromObject(o), o))).To(BeTrue(), "%T %s is left", o, o.GetName())
	}
	for _, gvk := range []schema.GroupVersionKind{
		admissionv1.SchemeGroupVersion.WithKind("ValidatingWebhookConfigurationList"),
		rbacv1.SchemeGroupVersion.WithKind("ClusterRoleList"),
		rbacv1.SchemeGroupVersion.WithKind("ClusterRoleBindingList"),
	} {
		left := &metav1.PartialObjectMetadataList{}
		left.SetGroupVersionKind(gvk)
		g.Expect(w.Client.List(ctx, left, client.MatchingLabels{localcluster.ProviderLabel: localcluster.ProviderName})).To(Succeed())
		g.Expect(left.Items).To(BeEmpty(), "%s of the release left after uninstall", gvk.Kind)
	}
	for _, crd := range []string{"globalvitistackippools.ipam.vitistack.io", "vitistackippools.ipam.vitistack.io", "ipaddressclaims.ipam.cluster.x-k8s.io"} {
		g.Expect(w.Client.Get(ctx, client.ObjectKey{Name: crd}, &apiextensionsv1.CustomResourceDefinition{})).To(Succeed(), "the CRD %s is kept", crd)
	}
	g.Expect(w.Client.Get(ctx, client.ObjectKey{Name: "hnet-private-ipv4"}, &ipamv1alpha1.GlobalVitistackIPPool{})).To(Succeed(), "the pool is kept")
	g.Expect(w.Client.Get(ctx, client.ObjectKey{Name: "ipam-system"}, &corev1.Namespace{})).To(Succeed(), "the default secret's namespace is kept")
}

// metricSum sums the samples of a counter the manager m exports whose labels have every
// value of labels.
func metricSum(t *testing.T, m *localcluster.Manager, name string, labels map[string]string) float64 {
	t.Helper()
	g := newG(t)
	text, err := localcluster.Get(context.Background(), m.MetricsURL)
	g.Expect(err).NotTo(HaveOccurred())
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	g.Expect(err).NotTo(HaveOccurred())
	sum := 0.0
	for _, sample := range families[name].GetMetric() {
		have := map[string]string{}
		for _, l := range sample.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		if matches(have, labels) {
			sum += sample.GetCounter().GetValue()
		}
	}
	return sum
}

// matches reports whether have has every label of want, with its value.
func matches(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}
