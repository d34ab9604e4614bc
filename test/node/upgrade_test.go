package node

import (
	"context"
	"os"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// helm upgrade with another value rolls the Deployment out, Pod by Pod, and helm
// rollback rolls it back; the new Pods take over the bound claim and register nothing
// again.
func TestHelmUpgradeAndRollbackRollThePods(t *testing.T) {
	g := newG(t)
	ctx := context.Background()
	api := installChart(t)
	newPool(t, "node-upgrade-ipv4")
	claim, address := bind(t, "kept", "node-upgrade-ipv4")
	registrations := func() int {
		stats, err := api.Stats(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		return stats.Count(sim.RouteRegister, 201) + stats.Count(sim.RouteRegister, 200)
	}
	g.Expect(registrations()).To(Equal(1))

	helm(t, "upgrade", release, chart, "--namespace", ns, "--reuse-values", "--set", "logLevel=1", "--wait", "--timeout", "3m")
	g.Expect(podArgs(t)).To(ContainElement("--v=1"), "the upgraded Deployment's Pod runs")
	helm(t, "rollback", release, "1", "--namespace", ns, "--wait", "--timeout", "3m")
	g.Expect(podArgs(t)).To(ContainElement("--v=0"), "the rolled-back Deployment's Pod runs")

	got := &ipamv1.IPAddressClaim{}
	g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), got)).To(Succeed())
	g.Expect(got.Status.AddressRef.Name).To(Equal(address.Name))
	// The last Pod took over the claim (it releases it), and no Pod registered it again.
	deleteAndWait(t, claim)
	g.Expect(liveHolders(t, api, address.Spec.Address)).To(BeEmpty())
	g.Expect(registrations()).To(Equal(1), "the new Pods registered the bound claim again")
}

// The chart's management flavour on a cluster with Cluster API core's CRDs, installed in
// a namespace of the user's choice (not the clusterctl install's): the manager keeps
// the default secret in the release's namespace, where the chart gives it the right to,
// so a pool without a secretRef works there. It runs last (Go runs a package's tests in
// the order of its files): Cluster API's CRDs replace the workload flavour's, which a
// later workload install could not take back (helmInstall refuses to try).
func TestTheManagementFlavourKeepsTheDefaultSecretInItsNamespace(t *testing.T) {
	g := newG(t)
	ctx := context.Background()
	applyCAPICoreCRDs(t)
	installChart(t, "cluster=management")
	newPool(t, "node-management-ipv4")
	claim, _ := bind(t, "mgmt", "node-management-ipv4")
	secret := &corev1.Secret{}
	g.Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "default"}, secret)).To(Succeed(),
		"the default secret is in the release's namespace")
	g.Expect(secret.Finalizers).To(ContainElement("ipam.vitistack.io/secret-in-use"))
	deleteAndWait(t, claim)
}

// applyCAPICoreCRDs applies the CRDs of Cluster API core's components from the offline
// clusterctl repository, as clusterctl init would, without its controller.
func applyCAPICoreCRDs(t *testing.T) {
	t.Helper()
	g := newG(t)
	core, err := os.ReadFile(paths.Repository + "/cluster-api/" + capiVersion(t) + "/core-components.yaml")
	g.Expect(err).NotTo(HaveOccurred())
	var crds []string
	for _, doc := range strings.Split(string(core), "\n---\n") {
		if strings.Contains(doc, "\nkind: CustomResourceDefinition\n") || strings.HasPrefix(doc, "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n") {
			crds = append(crds, doc)
		}
	}
	g.Expect(crds).NotTo(BeEmpty())
	_, err = cp.Apply(context.Background(), strings.Join(crds, "\n---\n"))
	g.Expect(err).NotTo(HaveOccurred())
	capiCoreCRDs = true
}

// capiCoreCRDs: Cluster API core's CRDs replaced the workload flavour's.
var capiCoreCRDs bool

// capiVersion is the Cluster API version of the offline repository (its only one).
func capiVersion(t *testing.T) string {
	t.Helper()
	entries, err := os.ReadDir(paths.Repository + "/cluster-api")
	newG(t).Expect(err).NotTo(HaveOccurred())
	newG(t).Expect(entries).To(HaveLen(1))
	return entries[0].Name()
}

// podArgs are the manager container's arguments in the Deployment's one ready Pod,
// once it has only that one.
func podArgs(t *testing.T) []string {
	t.Helper()
	var args []string
	newG(t).Eventually(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(cp.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: localcluster.DeploymentName}, d)).To(Succeed())
		pods := managerPods(t)
		g.Expect(pods).To(HaveLen(1))
		ready := false
		for _, c := range pods[0].Status.Conditions {
			ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
		}
		g.Expect(ready).To(BeTrue())
		args = pods[0].Spec.Containers[0].Args
	}).Should(Succeed())
	return args
}
