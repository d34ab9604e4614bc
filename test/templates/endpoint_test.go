package templates

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The infrastructure providers' own cluster objects, as their cluster templates write
// them (CAPV's cluster-template.yaml, CAPM3's cluster-template-cluster.yaml): where the
// provider reads the control-plane endpoint.
const infraClusters = `apiVersion: infrastructure.cluster.x-k8s.io/v1beta1
kind: VSphereCluster
metadata:
  name: ${CLUSTER_NAME}
  namespace: ${NAMESPACE}
spec:
  controlPlaneEndpoint:
    host: ${CONTROL_PLANE_ENDPOINT_IP}
    port: 6443
  identityRef:
    kind: Secret
    name: ${CLUSTER_NAME}
  server: '${VSPHERE_SERVER}'
  thumbprint: '${VSPHERE_TLS_THUMBPRINT}'
---
apiVersion: infrastructure.cluster.x-k8s.io/v1beta1
kind: Metal3Cluster
metadata:
  name: ${CLUSTER_NAME}
  namespace: ${NAMESPACE}
spec:
  controlPlaneEndpoint:
    host: ${CLUSTER_APIENDPOINT_HOST}
    port: ${CLUSTER_APIENDPOINT_PORT}
  noCloudProvider: true
`

// A workload cluster's control-plane endpoint from its node pool, the way
// templates/control-plane-endpoint.yaml says, with the provider's controllers and the
// IPAM-API stand-in running: the claim, naming no Cluster, is bound to an address of the
// node network that the IPAM-API holds for it; rendered with that address, the node
// overlays exclude it from the pool and the infrastructure providers' cluster objects,
// applied for real against their CRDs, carry it as spec.controlPlaneEndpoint.host; the
// nodes' own claims never get it; deleting the claim releases it.
func TestControlPlaneEndpointFromTheNodePool(t *testing.T) {
	requireEnv(t)
	g := NewWithT(t)
	const ns = "tpl-endpoint"
	ensureNamespace(t, ns)
	vars := map[string]string{"CLUSTER_NAME": clusterName, "NAMESPACE": ns, "NODE_SUBNET": nodeVars["NODE_SUBNET"], "NODE_GATEWAY": nodeVars["NODE_GATEWAY"]}
	createForReal(t, render(t, "control-plane-endpoint.yaml", ns, vars))

	// kubectl wait --for=condition=Ready, then the IPAddress's spec.address.
	claim := &ipamv1.IPAddressClaim{}
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: clusterName + "-control-plane-endpoint"}, claim)).To(Succeed())
		g.Expect(claim.Status.Conditions).To(ContainElement(And(HaveField("Type", ipamv1.IPAddressClaimReadyCondition), HaveField("Status", BeEquivalentTo("True")))))
	}).WithTimeout(30 * time.Second).Should(Succeed())
	address := &ipamv1.IPAddress{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: claim.Status.AddressRef.Name}, address)).To(Succeed())
	endpoint := address.Spec.Address
	a := netip.MustParseAddr(endpoint)
	g.Expect(netip.MustParsePrefix(nodeVars["NODE_SUBNET"]).Contains(a)).To(BeTrue(), "%s is in the node network", endpoint)
	g.Expect(endpoint).NotTo(Equal(nodeVars["NODE_GATEWAY"]))
	holders := env.Sim.Holders(endpoint + "/32")
	g.Expect(holders).To(HaveLen(1))
	g.Expect(holders[0].ServiceName).To(Equal(clusterName + "-control-plane-endpoint"))

	// The cluster rendered with it: the node overlays, and the infrastructure providers'
	// cluster objects.
	withEndpoint := with(nodeVars, map[string]string{"CONTROL_PLANE_ENDPOINT_IP": endpoint})
	metal3 := render(t, "cluster-template-metal3-nodes.yaml", ns, with(caseFor(t, "cluster-template-metal3-nodes.yaml").vars, withEndpoint))
	createForReal(t, metal3)
	g.Expect(metal3[0].Object["spec"]).To(HaveKeyWithValue("excludedAddresses", ConsistOf(endpoint)))
	file := filepath.Join(t.TempDir(), "infra-clusters.yaml")
	g.Expect(os.WriteFile(file, []byte(infraClusters), 0o600)).To(Succeed())
	out, err := runClusterctl(t, []string{"generate", "yaml", "--from", file}, map[string]string{
		"CLUSTER_NAME": clusterName, "NAMESPACE": ns, "CONTROL_PLANE_ENDPOINT_IP": endpoint, "VSPHERE_SERVER": "vcenter.example.org",
		"VSPHERE_TLS_THUMBPRINT": "", "CLUSTER_APIENDPOINT_HOST": endpoint, "CLUSTER_APIENDPOINT_PORT": "6443",
	})
	g.Expect(err).NotTo(HaveOccurred())
	infra := decode(t, out)
	g.Expect(refs(infra)).To(Equal([]string{"VSphereCluster " + ns + "/" + clusterName, "Metal3Cluster " + ns + "/" + clusterName}))
	createForReal(t, infra)
	for _, o := range infra {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(o.GroupVersionKind())
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(o), got)).To(Succeed())
		host, _, _ := unstructured.NestedString(got.Object, "spec", "controlPlaneEndpoint", "host")
		g.Expect(host).To(Equal(endpoint), "%s's spec.controlPlaneEndpoint.host", ref(o))
	}

	// The nodes' claims (as CAPV or CAPM3 make them) get other addresses; the endpoint
	// stays bound.
	for _, name := range []string{"c1-node-0", "c1-node-1"} {
		node := &ipamv1.IPAddressClaim{}
		node.Namespace, node.Name = ns, name
		node.Spec.PoolRef = claim.Spec.PoolRef
		g.Expect(env.Client.Create(ctx, node)).To(Succeed())
		g.Eventually(func(g Gomega) {
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(node), node)).To(Succeed())
			g.Expect(node.Status.AddressRef.Name).NotTo(BeEmpty())
		}).WithTimeout(30 * time.Second).Should(Succeed())
		got := &ipamv1.IPAddress{}
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: node.Status.AddressRef.Name}, got)).To(Succeed())
		g.Expect(got.Spec.Address).NotTo(Equal(endpoint), "node claim %s", name)
		g.Expect(env.Client.Delete(ctx, node)).To(Succeed())
	}
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(claim), claim)).To(Succeed())
	g.Expect(claim.Status.AddressRef.Name).To(Equal(address.Name))

	// Deleted after the cluster, the claim releases the address.
	g.Expect(env.Client.Delete(ctx, claim)).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(claim), claim))
	}).
		WithTimeout(30 * time.Second).Should(BeTrue())
	g.Expect(env.Sim.Holders(endpoint + "/32")).To(ConsistOf(HaveField("ExpiresAt", Not(BeNil()))))
}
