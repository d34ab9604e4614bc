package node

// The tests on a cluster with Cluster API core's CRDs run last (Go runs a package's
// tests in the order of its files, and of the tests in a file): Cluster API's CRDs
// replace the workload flavour's, which a later workload install could not take back
// (helmInstall refuses to try).

import (
	"context"
	"os"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
)

// The chart's management flavour on a cluster with Cluster API core's CRDs and
// cert-manager, installed in a namespace of the user's choice (not the clusterctl
// install's): cert-manager issues its webhook's certificate there, and the manager keeps
// the default secret in the release's namespace, where the chart gives it the right to,
// so a pool without a secretRef works there.
func TestTheManagementFlavourKeepsTheDefaultSecretInItsNamespace(t *testing.T) {
	g := newG(t)
	ctx := context.Background()
	applyCAPICoreCRDs(t)
	installCertManager(t)
	installChart(t, "cluster=management", withCertManager)
	issuedAndInjected(t, ns)
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
		if strings.Contains(doc, "\nkind: CustomResourceDefinition\n") {
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

// `clusterctl init --ipam vitistack` on a cluster with cert-manager, as a user installs
// the provider on a management cluster: the Deployment's Pod becomes Ready through its
// probes, cert-manager issues the webhook's certificate and its cainjector injects the
// CA, the pool webhook refuses a bad pool through the Service, and a claim binds and
// releases. Then `clusterctl delete --ipam vitistack` removes what init installed for
// the provider and keeps what operations.md says it keeps: the namespace with the
// default secret, and the CRDs.
//
// Cluster API's own controllers (core and kubeadm, which a first init installs too) do
// not run: their images are not built here. A ResourceQuota of no Pods in their
// namespaces keeps the node from trying to pull them, and init removes their webhook
// configurations, as on the other suites' control planes without nodes.
func TestClusterctlInitAndDeleteWithCertManager(t *testing.T) {
	g := newG(t)
	ctx := context.Background()
	installCertManager(t)
	g.Expect(cp.NoClusterAPIPods(ctx)).To(Succeed())
	api := startSim(t)
	out, err := cp.Init(ctx, map[string]string{"VITISTACK_IPAM_API_URL": api.URL})
	capiCoreCRDs = true
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(ContainSubstring("Skipping installing cert-manager as it is already installed"))

	providerRuns(t, paths.Version)
	webhooks := issuedAndInjected(t, pns)
	refusesABadPool(t, pns)
	pool := "node-clusterctl-ipv4"
	newPool(t, pool)
	ensureNamespace(t, ns) // the claim's
	claim, address := bind(t, "clusterctl", pool)
	g.Expect(liveHolders(t, api, address.Spec.Address)).To(HaveLen(1))
	// operations.md's order: what holds addresses, then the pools, then the provider.
	deleteAndWait(t, claim)
	g.Expect(liveHolders(t, api, address.Spec.Address)).To(BeEmpty())
	deleteAndWait(t, globalPool(pool))

	clusterctlDelete(t, webhooks)
	// Kept: the namespace with the default secret, and the CRDs.
	g.Expect(cp.Client.Get(ctx, client.ObjectKey{Name: pns}, &corev1.Namespace{})).To(Succeed())
	g.Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: pns, Name: "default"}, &corev1.Secret{})).To(Succeed())
	for _, name := range []string{"vitistackippools.ipam.vitistack.io", "globalvitistackippools.ipam.vitistack.io"} {
		g.Expect(cp.Client.Get(ctx, client.ObjectKey{Name: name}, &apiextensionsv1.CustomResourceDefinition{})).To(Succeed(), name)
	}
}

// The previous release (v0.1.0: its image and its manifests) installed with `clusterctl
// init` on the node, a claim bound under it, then `clusterctl upgrade apply` to the
// build under test, with the same variables, as operations.md says: the Deployment
// rolls to the new image, whose Pod becomes Ready with the certificate cert-manager
// issued; the claim keeps its address and nothing is registered again; a new claim
// binds; deleted, both are released; `clusterctl delete` removes the provider.
func TestClusterctlUpgradeFromThePreviousReleaseOnTheNode(t *testing.T) {
	g := newG(t)
	ctx := context.Background()
	installCertManager(t)
	g.Expect(cp.NoClusterAPIPods(ctx)).To(Succeed())
	previous, err := cp.UseUpgradeRepository()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { cp.ClusterctlConfig = paths.ClusterctlConfig() })
	api := startSim(t)
	vars := map[string]string{"VITISTACK_IPAM_API_URL": api.URL}
	// clusterctl checks cert-manager with objects in a namespace of its own, which it
	// deletes after: an init while the last one's is still going would find it wanting.
	g.Eventually(func(g Gomega) {
		n := &corev1.Namespace{}
		err := cp.Client.Get(ctx, client.ObjectKey{Name: "cert-manager-test"}, n)
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the namespace of clusterctl's cert-manager check is gone: %v", n.Status)
	}).Should(Succeed())
	_, err = cp.InitVersion(ctx, vars, previous)
	capiCoreCRDs = true
	g.Expect(err).NotTo(HaveOccurred())
	providerRuns(t, previous)
	pool := "node-upgrade-clusterctl-ipv4"
	newPool(t, pool)
	ensureNamespace(t, ns)
	claim, address := bind(t, "kept-by-upgrade", pool)
	g.Expect(registrations(t, api)).To(Equal(1))

	out, err := cp.Clusterctl(ctx, vars, "upgrade", "apply", "--ipam", pns+"/vitistack:"+paths.Version, "--kubeconfig", cp.Kubeconfig)
	g.Expect(err).NotTo(HaveOccurred())
	providerRuns(t, paths.Version)
	webhooks := issuedAndInjected(t, pns)
	refusesABadPool(t, pns)
	got := &ipamv1.IPAddressClaim{}
	g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), got)).To(Succeed())
	g.Expect(got.Status.AddressRef.Name).To(Equal(address.Name), "clusterctl upgrade:\n%s", out)
	// A new claim binds under the new version.
	fresh, _ := bind(t, "after-upgrade", pool)
	g.Expect(registrations(t, api)).To(Equal(2), "the new Pod registered the bound claim again")
	// Released a minute after v0.1.0 registered it, not at once: v0.1.0's IPAddress does
	// not show which request recorded on the claim it answers, so the new version waits
	// out --ipam-api-quarantine from that request (a claim bound longer ago goes at once).
	deleteAndWait(t, claim)
	g.Expect(liveHolders(t, api, address.Spec.Address)).To(BeEmpty())
	deleteAndWait(t, fresh)
	deleteAndWait(t, globalPool(pool))
	clusterctlDelete(t, webhooks)
}

// pns is the namespace clusterctl installs the provider in.
const pns = manager.ProviderNamespace

// providerRuns waits until clusterctl's Deployment of the provider runs one Pod, of
// version's image, Ready through its probes, and no other.
func providerRuns(t *testing.T, version string) {
	t.Helper()
	newG(t).Eventually(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(cp.Client.Get(context.Background(), client.ObjectKey{Namespace: pns, Name: localcluster.DeploymentName}, d)).To(Succeed())
		g.Expect(d.Spec.Template.Spec.Containers[0].Image).To(HaveSuffix(":" + version))
		g.Expect(d.Status.Replicas).To(BeEquivalentTo(1), "one Pod of %s", version)
		g.Expect(localcluster.RolledOut(d)).To(Succeed(), "the Pod of %s, Ready through its probes", version)
	}).Should(Succeed())
}

// issuedAndInjected: cert-manager issued the webhook's certificate in namespace, and
// every webhook configuration that asks for its CA has it. It returns them.
func issuedAndInjected(t *testing.T, namespace string) []admissionv1.ValidatingWebhookConfiguration {
	t.Helper()
	g := newG(t)
	secret := servingCert(t, namespace)
	webhooks := injectedWebhooks(t, namespace)
	g.Expect(webhooks).NotTo(BeEmpty())
	for _, w := range webhooks {
		for _, hook := range w.Webhooks {
			g.Expect(string(hook.ClientConfig.CABundle)).To(Equal(string(secret.Data["ca.crt"])),
				"%s: the CA cert-manager issued the served certificate with", hook.Name)
		}
	}
	return webhooks
}

// clusterctlDelete runs `clusterctl delete --ipam vitistack` and waits until the
// Deployment is gone; the webhook configurations are gone too.
func clusterctlDelete(t *testing.T, webhooks []admissionv1.ValidatingWebhookConfiguration) {
	t.Helper()
	g := newG(t)
	ctx := context.Background()
	out, err := cp.Clusterctl(ctx, nil, "delete", "--ipam", "vitistack", "--kubeconfig", cp.Kubeconfig)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKey{Namespace: pns, Name: localcluster.DeploymentName}, &appsv1.Deployment{}))
	}).Should(BeTrue(), "clusterctl delete removes the Deployment:\n%s", out)
	for _, w := range webhooks {
		g.Expect(apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKeyFromObject(&w), &w))).To(BeTrue(), "%s is removed", w.Name)
	}
}

// globalPool is the GlobalVitistackIPPool name, to delete.
func globalPool(name string) *ipamv1alpha1.GlobalVitistackIPPool {
	return &ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: name}}
}
