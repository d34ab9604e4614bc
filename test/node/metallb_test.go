package node

import (
	"bufio"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

// MetalLB's controller and speaker as Pods, from MetalLB's own manifest, in L2 mode: a
// LoadBalancer Service gets an address this provider registered in the IPAM-API, MetalLB
// assigns it, its speaker answers ARP for it on the node's link, and a client host on
// that link reaches a backend Pod at the address through kube-proxy's rules. That is
// "MetalLB announces" on a real node: the client's packets go to no address but the
// Service's and the node's.
func TestMetalLBAnnouncesTheAddressTheProviderRegistered(t *testing.T) {
	g := newG(t)
	ctx := context.Background()
	zones := filepath.Join(testDir(t), "zones.json")
	g.Expect(os.WriteFile(zones, []byte(localcluster.NodeZones), 0o600)).To(Succeed())
	api := startSim(t, "--zones", zones)
	helmInstall(t, api)
	g.Expect(cp.InstallMetalLB(ctx)).To(Succeed())
	newPool(t, "node-link-ipv4")

	const apps = "apps"
	ensureNamespace(t, apps)
	backend, svc := localcluster.EchoApp(apps)
	labels := backend.Spec.Selector.MatchLabels
	g.Expect(cp.Client.Create(ctx, backend)).To(Succeed())
	t.Cleanup(func() { deleteAndWait(t, backend) })
	g.Expect(cp.Client.Create(ctx, svc)).To(Succeed())
	t.Cleanup(func() { deleteAndWait(t, svc) })

	// MetalLB assigns the address the provider registered.
	var address string
	g.Eventually(func(g Gomega) {
		got := &corev1.Service{}
		g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(svc), got)).To(Succeed())
		g.Expect(got.Status.LoadBalancer.Ingress).To(HaveLen(1), "annotations: %v", got.Annotations)
		address = got.Status.LoadBalancer.Ingress[0].IP
	}).Should(Succeed())
	g.Expect(liveHolders(t, api, address)).To(HaveLen(1), "%s is registered in the IPAM-API", address)
	_, link, _ := net.ParseCIDR(localcluster.LinkPool)
	g.Expect(link.Contains(net.ParseIP(address))).To(BeTrue(), "%s is on the node's link", address)

	// The client host reaches a backend Pod at that address: MetalLB's speaker answered
	// its ARP request, kube-proxy forwarded the connection.
	pods := &corev1.PodList{}
	g.Eventually(func(g Gomega) {
		g.Expect(cp.Client.List(ctx, pods, client.InNamespace(apps), client.MatchingLabels(labels))).To(Succeed())
		g.Expect(pods.Items).To(HaveLen(1))
	}).Should(Succeed())
	g.Eventually(func(g Gomega) {
		conn, err := namespaces.DialFromClient(net.JoinHostPort(address, "80"), 2*time.Second)
		g.Expect(err).NotTo(HaveOccurred())
		defer conn.Close()
		g.Expect(conn.SetDeadline(time.Now().Add(2 * time.Second))).To(Succeed())
		line, err := bufio.NewReader(conn).ReadString('\n')
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(strings.TrimSpace(line)).To(Equal(pods.Items[0].Name))
	}).Should(Succeed())
}
