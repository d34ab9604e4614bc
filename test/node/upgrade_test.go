package node

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

// helm upgrade with another value rolls the Deployment out, Pod by Pod, and helm
// rollback rolls it back; the new Pods take over the bound claim and register nothing
// again. An upgrade with a mistake (a flag the manager refuses) leaves the Pod before it
// serving, and its new Pod says why it exits in its status, where kubectl describe pod
// shows it (terminationMessagePolicy FallbackToLogsOnError).
//
// The claim is deleted once the last Pod is Ready, which may be before that Pod leads
// and has seen the claim live: it then waits out --ipam-api-quarantine before it
// releases it (a minute by default). The install sets a short one, which upgrade and
// rollback keep.
func TestHelmUpgradeAndRollbackRollThePods(t *testing.T) {
	g := newG(t)
	ctx := context.Background()
	api := installChart(t, shortQuarantine)
	newPool(t, "node-upgrade-ipv4")
	claim, address := bind(t, "kept", "node-upgrade-ipv4")
	g.Expect(registrations(t, api)).To(Equal(1))

	helm(t, "upgrade", release, chart, "--namespace", ns, "--reuse-values", "--set", "logLevel=1", "--wait", "--timeout", "3m")
	g.Expect(podArgs(t)).To(ContainElement("--v=1"), "the upgraded Deployment's Pod runs")
	serving := managerPods(t)[0].Name

	helm(t, "upgrade", release, chart, "--namespace", ns, "--reuse-values", "--set", "extraArgs={--ipam-api-quarantine=1s}")
	g.Eventually(func(g Gomega) {
		g.Expect(exits(managerPods(t))).To(ContainElement(ContainSubstring("--ipam-api-quarantine (1s) must be longer than --ipam-api-timeout (10s)")))
	}).Should(Succeed(), "the new Pod's status says why it exits")
	pods := managerPods(t)
	g.Expect(podNames(pods)).To(ContainElement(serving))
	for _, p := range pods {
		if p.Name == serving {
			g.Expect(p.Status.ContainerStatuses[0].Ready).To(BeTrue(), "the Pod before the mistake still serves")
		}
	}

	helm(t, "rollback", release, "1", "--namespace", ns, "--wait", "--timeout", "3m")
	g.Expect(podArgs(t)).To(ContainElement("--v=0"), "the rolled-back Deployment's Pod runs")

	got := &ipamv1.IPAddressClaim{}
	g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), got)).To(Succeed())
	g.Expect(got.Status.AddressRef.Name).To(Equal(address.Name))
	// The last Pod took over the claim (it releases it), and no Pod registered it again.
	deleteAndWait(t, claim)
	g.Expect(liveHolders(t, api, address.Spec.Address)).To(BeEmpty())
	g.Expect(registrations(t, api)).To(Equal(1), "the new Pods registered the bound claim again")
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
