package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// `clusterctl move` takes a Cluster with its pool, secret, claims and addresses to a
// second management cluster: the addresses stay the same and stay held in the IPAM-API
// (nothing is released or registered anew), and the new management cluster releases
// them when the Cluster is deleted there. Then `clusterctl delete --ipam vitistack`
// removes the provider but keeps the CRDs and the user's objects.
func TestClusterctlMove(t *testing.T) {
	onA.enter(t)
	g := newG(t)
	ctx := context.Background()

	// The second management cluster, with an image override in its clusterctl.yaml.
	b := newControlPlane(t, "b", ipamAPI)
	repoConfig, err := os.ReadFile(paths.ClusterctlConfig())
	g.Expect(err).NotTo(HaveOccurred())
	b.ClusterctlConfig = filepath.Join(b.Dir, "clusterctl.yaml")
	g.Expect(os.WriteFile(b.ClusterctlConfig, append(repoConfig,
		"images:\n  ipam-vitistack:\n    repository: registry.example.org/mirror\n"...), 0o600)).To(Succeed())
	_, err = b.Init(ctx, providerVars(simOf(b)))
	g.Expect(err).NotTo(HaveOccurred())
	dep := &appsv1.Deployment{}
	g.Expect(b.Client.Get(ctx, client.ObjectKey{Namespace: manager.ProviderNamespace, Name: localcluster.DeploymentName}, dep)).To(Succeed())
	g.Expect(dep.Spec.Template.Spec.Containers[0].Image).To(Equal("registry.example.org/mirror/cluster-api-ipam-provider-vitistack:" + paths.Version))
	bMgr, err := b.StartManager(ctx, nil)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(bMgr.Stop)

	// On a: a Cluster with its own pool and secret (labelled for move), and three claims.
	ns := newNamespace(t, a, "move")
	newSecret(t, a, ns, "ipam", "move-test-secret")
	pool := &ipamv1alpha1.VitistackIPPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nodes"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4, Prefix: ptr.To[int32](24), Gateway: "10.250.0.1",
			SecretRef: &ipamv1alpha1.SecretReference{Name: "ipam"}},
	}
	g.Expect(a.Client.Create(ctx, pool)).To(Succeed())
	cluster := newCluster(t, a, ns, "moved", false)
	before := map[string]string{}         // claim -> address
	held := map[string]sim.Registration{} // address -> registration
	for _, name := range []string{"moved-cp-0", "moved-cp-1", "moved-md-0"} {
		addr := boundAddress(t, a, newClaim(t, a, ns, name, "VitistackIPPool", "nodes", cluster))
		before[name] = addr.Spec.Address
		reg, ok := registrationOf(t, a, addr.Spec.Address)
		g.Expect(ok).To(BeTrue())
		held[addr.Spec.Address] = reg
	}
	aLogBefore := len(logsOf(t, aMgr))
	// The positive control of the check below: a logged each registration, in the form it
	// looks for.
	for name := range before {
		g.Expect(logsOf(t, aMgr)[:aLogBefore]).To(MatchRegexp(sentFor("Registered", ns, name)), "manager a's log of the registration of %s", name)
	}

	out, err := a.Clusterctl(ctx, nil, "move", "--kubeconfig", a.Kubeconfig, "--to-kubeconfig", b.Kubeconfig, "--namespace", ns)
	g.Expect(err).NotTo(HaveOccurred())
	t.Log(out)

	// Gone from a, without a release.
	for name := range before {
		g.Expect(apierrors.IsNotFound(a.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &ipamv1.IPAddressClaim{}))).To(BeTrue(), "claim %s is still on a", name)
	}
	g.Expect(apierrors.IsNotFound(a.Client.Get(ctx, client.ObjectKeyFromObject(pool), &ipamv1alpha1.VitistackIPPool{}))).To(BeTrue())

	// On b: the same addresses, bound and Ready, with b's manager running.
	for name, address := range before {
		claim := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		addr := boundAddress(t, b, claim)
		g.Expect(addr.Spec.Address).To(Equal(address), "claim %s", name)
		g.Expect(addr.Spec.Gateway).To(Equal("10.250.0.1"))
		g.Expect(addr.Spec.Prefix).To(HaveValue(Equal(int32(24))))
		readyReason(t, b, claim, metav1.ConditionTrue, ipamv1alpha1.ClaimReadyAllocatedReason)
	}
	movedCluster := &clusterv1.Cluster{}
	g.Expect(b.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "moved"}, movedCluster)).To(Succeed())
	g.Expect(ptr.Deref(movedCluster.Spec.Paused, false)).To(BeFalse(), "clusterctl move leaves the Cluster unpaused on b")

	// Neither manager registered or released them again (both log each at --v=2), and
	// the IPAM-API holds every address as before: same identity and secret, not released.
	for name := range before {
		for who, log := range map[string]string{"a": logsOf(t, aMgr)[aLogBefore:], "b": logsOf(t, bMgr)} {
			g.Expect(log).NotTo(MatchRegexp(sentFor("(Registered|Released)", ns, name)),
				"manager %s sent a request for %s during the move", who, name)
		}
	}
	for address, reg := range held {
		now, ok := registrationOf(t, a, address)
		g.Expect(ok).To(BeTrue())
		g.Expect(now).To(Equal(reg), "%s changed in the IPAM-API", address)
	}

	// b releases them when the Cluster is deleted there (garbage collector).
	deleteAndWait(t, b, movedCluster)
	for address := range held {
		g.Eventually(func() []sim.Holder { return activeHolders(t, a, address) }).Should(BeEmpty(), "%s is still held", address)
	}
	for name := range before {
		g.Expect(logsOf(t, bMgr)).To(MatchRegexp(sentFor("Released", ns, name)), "manager b's log of the release of %s", name)
	}

	// b's manager ran as its ServiceAccount too. It stops before clusterctl delete takes
	// its Deployment and RBAC away.
	g.Expect(rbacRefusal.FindString(logsOf(t, bMgr))).To(BeEmpty(), "manager b was refused a request by RBAC; see %s", bMgr.LogFile)
	bMgr.Stop()

	// clusterctl delete: the provider goes; its CRDs, its namespace and pools stay.
	out, err = b.Clusterctl(ctx, nil, "delete", "--ipam", "vitistack", "--kubeconfig", b.Kubeconfig)
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(apierrors.IsNotFound(b.Client.Get(ctx, client.ObjectKeyFromObject(dep), &appsv1.Deployment{}))).To(BeTrue(), "the Deployment is still there")
	vwcs := &admissionv1.ValidatingWebhookConfigurationList{}
	g.Expect(b.Client.List(ctx, vwcs, client.MatchingLabels{localcluster.ProviderLabel: localcluster.ProviderName})).To(Succeed())
	g.Expect(vwcs.Items).To(BeEmpty())
	g.Expect(b.Client.Get(ctx, client.ObjectKey{Name: "vitistackippools.ipam.vitistack.io"}, &apiextensionsv1.CustomResourceDefinition{})).To(Succeed())
	g.Expect(b.Client.Get(ctx, client.ObjectKey{Name: manager.ProviderNamespace}, &corev1.Namespace{})).To(Succeed())
	g.Expect(b.Client.Get(ctx, client.ObjectKeyFromObject(pool), &ipamv1alpha1.VitistackIPPool{})).To(Succeed())
	out, err = b.Clusterctl(ctx, nil, "upgrade", "plan", "--kubeconfig", b.Kubeconfig)
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).NotTo(ContainSubstring("ipam-vitistack"))
}

// sentFor matches a manager's log line (at --v=2) of a request sent for a claim: what
// is "Registered" or "Released" (a regexp).
func sentFor(what, namespace, claim string) string {
	return what + ` address in the IPAM-API.*IPAddressClaim="` + namespace + "/" + claim + `"`
}
