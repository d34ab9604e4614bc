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
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

// linkPool is the part of the node's link the IPAM-API stand-in hands out, and MetalLB's
// pool covers (autoAssign false, as the provider's users set it).
const linkPool = "10.250.0.128/25"

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
	g.Expect(os.WriteFile(zones, []byte(`{"zones":[{"name":"hnet-private","ipv4":["`+linkPool+`"],"ipv6":[]}]}`), 0o600)).To(Succeed())
	api := startSim(t, "--zones", zones)
	helmInstall(t, api)
	installMetalLB(t)
	newPool(t, "node-link-ipv4")

	const apps = "apps"
	g.Expect(client.IgnoreAlreadyExists(cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: apps}}))).To(Succeed())
	labels := map[string]string{"app": "echo"}
	backend := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: apps, Name: "echo"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "echo", Image: localcluster.PauseImage, ImagePullPolicy: corev1.PullNever,
					Command: []string{"/pause", "--answer", ":8080"},
					Ports:   []corev1.ContainerPort{{ContainerPort: 8080}},
				}}},
			},
		},
	}
	g.Expect(cp.Client.Create(ctx, backend)).To(Succeed())
	t.Cleanup(func() { deleteAndWait(t, backend) })
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: apps, Name: "echo"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: labels,
			Ports: []corev1.ServicePort{{Name: "echo", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
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
	_, link, _ := net.ParseCIDR(linkPool)
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

// installMetalLB applies MetalLB's manifest (its images imported with the node's), waits
// until its controller and speaker are ready, and gives it the pool of the node's link
// with an L2Advertisement, through its webhook.
func installMetalLB(t *testing.T) {
	t.Helper()
	g := newG(t)
	ctx := context.Background()
	manifest, err := os.ReadFile(os.Getenv("E2E_METALLB_MANIFEST"))
	g.Expect(err).NotTo(HaveOccurred(), "E2E_METALLB_MANIFEST: run through 'make test-node'")
	_, err = cp.Apply(ctx, string(manifest))
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: localcluster.MetalLBNamespace, Name: "controller"}, d)).To(Succeed())
		g.Expect(d.Status.AvailableReplicas).To(BeEquivalentTo(1))
		ds := &appsv1.DaemonSet{}
		g.Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: localcluster.MetalLBNamespace, Name: "speaker"}, ds)).To(Succeed())
		g.Expect(ds.Status.NumberReady).To(BeEquivalentTo(1))
	}).Should(Succeed(), "MetalLB's controller and speaker are ready")
	pools := "---\napiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: node-link, namespace: metallb-system}\n" +
		"spec: {addresses: [" + linkPool + "], autoAssign: false}\n" +
		"---\napiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata: {name: node-link, namespace: metallb-system}\n" +
		"spec: {ipAddressPools: [node-link]}\n"
	// Through MetalLB's webhook, once its controller has written its certificate.
	g.Eventually(func() error { _, err := cp.Apply(ctx, pools); return err }).Should(Succeed())
}
