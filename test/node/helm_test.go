package node

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

// The chart as a user without cert-manager installs it: the webhook's certificate from
// a Secret of the user's (webhook.existingCertSecret) and the CA that signed it. The
// shipped image runs in a Pod that becomes Ready through its probes, as 65532 with a
// read-only root filesystem and GOMEMLIMIT from its memory limit; kube-apiserver calls
// the pool webhook through its Service and the certificate, which refuses a bad pool;
// a claim binds to an address the IPAM-API registered, and deleted, releases it.
func TestTheChartRunsTheImageWithTheUsersCertificate(t *testing.T) {
	g := newG(t)
	ctx := context.Background()
	api := installChart(t)

	// Ready through its probes (helm --wait waited for the Deployment to be available).
	d := &appsv1.Deployment{}
	g.Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: localcluster.DeploymentName}, d)).To(Succeed())
	g.Expect(d.Status.ReadyReplicas).To(BeEquivalentTo(1))
	pods := managerPods(t)
	g.Expect(pods).To(HaveLen(1))
	pod := pods[0]
	g.Expect(pod.Spec.Containers[0].Image).To(Equal(paths.Image))

	// The process, as the machine sees it: the manager of the image, as 65532, on a
	// read-only root.
	pid := processOf(t, "--ipam-api-url="+api.URL)
	status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(status)).To(MatchRegexp(`(?m)^Uid:\s+65532\s+65532\s+65532\s+65532$`))
	g.Expect(string(status)).To(MatchRegexp(`(?m)^Gid:\s+65532\s+65532\s+65532\s+65532$`))
	mounts, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "mountinfo"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(mounts)).To(MatchRegexp(`(?m)^\S+ \S+ \S+ \S+ / ro[, ]`), "the root filesystem is read-only")
	// GOMEMLIMIT: 90 % of the chart's 256Mi limit, which the manager read from its cgroup.
	cs, err := kubernetes.NewForConfig(cp.Config)
	g.Expect(err).NotTo(HaveOccurred())
	logs, err := cs.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "manager"}).DoRaw(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(regexp.MustCompile(`Starting manager.*goMemLimit\W{1,3}230MiB`).Match(logs)).To(BeTrue(),
		"the manager's start-up line names GOMEMLIMIT 230MiB:\n%s", firstLines(logs, 20))

	// The pool webhook, through the Service and the user's certificate, refuses a bad pool.
	refusesABadPool(t, ns)

	// A claim binds to an address the IPAM-API registered; deleted, it releases it.
	newPool(t, "node-private-ipv4")
	claim, address := bind(t, "vip", "node-private-ipv4")
	g.Expect(liveHolders(t, api, address.Spec.Address)).To(HaveLen(1))
	deleteAndWait(t, claim)
	g.Expect(liveHolders(t, api, address.Spec.Address)).To(BeEmpty())
}

// Two replicas, as operations.md sizes them for fail-over: deleting the leader's Pod
// hands the lease to the other within the lease's duration (the leader gives it up as
// it stops), and no claim is registered twice, before, during or after. A request the
// leader sent as it stopped, its answer lost, is waited out by the next leader for
// --ipam-api-quarantine before it is sent again (up to a minute by default; here
// shortQuarantine).
func TestDeletingTheLeadersPodHandsOverLeadership(t *testing.T) {
	g := newG(t)
	ctx := context.Background()
	api := installChart(t, "replicas=2", shortQuarantine)
	g.Expect(managerPods(t)).To(HaveLen(2))
	newPool(t, "node-failover-ipv4")
	_, before := bind(t, "before", "node-failover-ipv4")

	lease := &coordinationv1.Lease{}
	key := client.ObjectKey{Namespace: ns, Name: "controller-leader-election-capi-ipam-vitistack"}
	g.Eventually(func(g Gomega) {
		g.Expect(cp.Client.Get(ctx, key, lease)).To(Succeed())
		g.Expect(lease.Spec.HolderIdentity).NotTo(BeNil())
	}).Should(Succeed())
	leader := strings.SplitN(*lease.Spec.HolderIdentity, "_", 2)[0]
	g.Expect(leader).To(BeElementOf(podNames(managerPods(t))))
	duration := time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second

	deleted := time.Now()
	g.Expect(cp.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leader}})).To(Succeed())
	// A claim made while the leader goes is bound, by one or the other.
	_, during := bind(t, "during", "node-failover-ipv4")
	var next string
	g.Eventually(func(g Gomega) {
		g.Expect(cp.Client.Get(ctx, key, lease)).To(Succeed())
		g.Expect(lease.Spec.HolderIdentity).NotTo(BeNil())
		next = strings.SplitN(*lease.Spec.HolderIdentity, "_", 2)[0]
		g.Expect(next).NotTo(Equal(leader))
		g.Expect(lease.Spec.AcquireTime).NotTo(BeNil())
	}).Should(Succeed())
	acquired := lease.Spec.AcquireTime.Time
	// The lease's times are kube-apiserver's clock's, which is this machine's.
	g.Expect(acquired.Sub(deleted)).To(BeNumerically("<", duration),
		"the lease moved from %s to %s %s after the delete; its duration is %s", leader, next, acquired.Sub(deleted), duration)
	_, after := bind(t, "after", "node-failover-ipv4")

	for _, a := range []*ipamv1.IPAddress{before, during, after} {
		g.Expect(liveHolders(t, api, a.Spec.Address)).To(HaveLen(1), "%s is registered once", a.Spec.Address)
	}
	g.Expect(registrations(t, api)).To(Equal(3), "one registration for each claim")
	stats, err := api.Stats(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(stats.OverlappingRegistrations).To(BeZero())
}

// Uninstalled before what holds addresses is deleted (operations.md: the provider goes
// last), nothing is released: a claim deleted then stays with its finalizer, and its
// address stays registered. Installed again, with the same IPAM-API and default
// secret, the provider releases it and the claim goes: nothing is left stuck for good,
// and no address is leaked.
//
// The new leader waits out --ipam-api-quarantine before it releases what it did not
// see live: the installs set a short one through extraArgs (shortQuarantine), as a
// user may for another flag.
func TestAClaimDeletedAfterUninstallIsReleasedByTheNextInstall(t *testing.T) {
	g := newG(t)
	ctx := context.Background()
	api := installChart(t, shortQuarantine)
	newPool(t, "node-uninstall-ipv4")
	claim, address := bind(t, "orphan", "node-uninstall-ipv4")

	helm(t, "uninstall", release, "--namespace", ns, "--wait")
	// No manager Pod at all, not even one terminating: nothing can release the claim.
	g.Eventually(func() []corev1.Pod { return allManagerPods(t) }).Should(BeEmpty())
	g.Expect(cp.Client.Delete(ctx, claim)).To(Succeed())
	// Deleted with no manager: it stays, finalized, and the address stays registered.
	got := &ipamv1.IPAddressClaim{}
	g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), got)).To(Succeed())
	g.Expect(got.DeletionTimestamp).NotTo(BeNil())
	g.Expect(got.Finalizers).To(ContainElement("ipam.cluster.x-k8s.io/ReleaseAddress"))
	g.Expect(liveHolders(t, api, address.Spec.Address)).To(HaveLen(1))

	// Installed again with the same IPAM-API: the claim is released and goes.
	helmInstall(t, api, shortQuarantine)
	g.Expect(podArgs(t)).To(ContainElement("--ipam-api-quarantine=5s"))
	g.Eventually(func() bool {
		return apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), got))
	}).Should(BeTrue(), "the deleted claim is released and goes once the provider is back")
	g.Expect(liveHolders(t, api, address.Spec.Address)).To(BeEmpty())
	deleteAndWait(t, &ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: "node-uninstall-ipv4"}})
}

// managerPods are the manager's Pods that are not being deleted.
func managerPods(t *testing.T) []corev1.Pod {
	t.Helper()
	var live []corev1.Pod
	for _, p := range allManagerPods(t) {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	return live
}

func podNames(pods []corev1.Pod) []string {
	names := make([]string, 0, len(pods))
	for _, p := range pods {
		names = append(names, p.Name)
	}
	return names
}
