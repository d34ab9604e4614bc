package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

// The Services flavour (release asset ipam-components-workload.yaml), installed the way
// the README says on a cluster without Cluster API: a LoadBalancer Service gets an
// address registered under the IPAM-operator's identity (the Service's name), the
// Service webhook refuses a bad annotation, and deleting the Service releases it.
func TestWorkloadFlavour(t *testing.T) {
	g := newG(t)
	ctx := context.Background()
	w, err := localcluster.StartControlPlane(workDir, "workload", paths)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(w.Stop)

	// cert-manager's CRDs (its Certificate and Issuer are in the flavour), then the flavour
	// rendered with its variables.
	certManager, err := filepath.Glob(filepath.Join(paths.Repository, "cert-manager", "*", "cert-manager.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(certManager).To(HaveLen(1))
	crds, err := os.ReadFile(certManager[0])
	g.Expect(err).NotTo(HaveOccurred())
	_, err = w.Apply(ctx, string(crds))
	g.Expect(err).NotTo(HaveOccurred())
	flavour, err := w.GenerateYAML(ctx, map[string]string{"VITISTACK_IPAM_API_URL": ipamAPI.URL, "VITISTACK_LOG_LEVEL": "2"},
		filepath.Join(paths.Repository, "ipam-vitistack", paths.Version, "ipam-components-workload.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() error { // until the CRDs just created are served
		_, err := w.Apply(ctx, flavour)
		return err
	}).Should(Succeed())

	// CAPI's IPAM CRDs come with it, serving v1beta2 only (no conversion webhook needed).
	crd := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(w.Client.Get(ctx, client.ObjectKey{Name: "ipaddressclaims.ipam.cluster.x-k8s.io"}, crd)).To(Succeed())
	g.Expect(crd.Spec.Versions).To(HaveLen(1))
	g.Expect(crd.Spec.Versions[0].Name).To(Equal("v1beta2"))

	mgr, err := w.StartManager(ctx, nil)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(mgr.Stop)
	g.Expect(mgr.Logs()).To(ContainSubstring("Registering webhook"))
	g.Expect(mgr.Logs()).To(ContainSubstring("/validate--v1-service"))

	g.Expect(w.Client.Create(ctx, &ipamv1alpha1.GlobalVitistackIPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "hnet-private-ipv4"},
		Spec:       ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4},
	})).To(Succeed())
	ns := newNamespace(t, w, "apps")
	svc := func(name string, annotations map[string]string) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
		}
	}

	// A bad annotation is refused at admission, naming it.
	err = w.Client.Create(ctx, svc("bad", map[string]string{ipamv1alpha1.ZoneAnnotation: "nowhere"}))
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring(ipamv1alpha1.ZoneAnnotation))

	web := svc("web", map[string]string{ipamv1alpha1.ZoneAnnotation: "hnet-private"})
	g.Expect(w.Client.Create(ctx, web)).To(Succeed())
	var address string
	g.Eventually(func(g Gomega) {
		got := &corev1.Service{}
		g.Expect(w.Client.Get(ctx, client.ObjectKeyFromObject(web), got)).To(Succeed())
		address = got.Annotations["metallb.io/loadBalancerIPs"]
		g.Expect(address).To(HavePrefix("10."))
	}).Should(Succeed())
	holders := activeHolders(t, address)
	g.Expect(holders).To(HaveLen(1))
	g.Expect(holders[0].ServiceName).To(Equal("web"))
	g.Expect(holders[0].NamespaceID).To(Equal(uidOf(t, w, ns)))
	g.Expect(holders[0].ClusterID).To(Equal(uidOf(t, w, "kube-system")))

	deleteAndWait(t, w, web)
	g.Expect(activeHolders(t, address)).To(BeEmpty(), "deleting the Service did not release %s", address)
	g.Expect(rbacRefusal.FindString(mgr.Logs())).To(BeEmpty(), "the manager was refused a request by RBAC; see %s", mgr.LogFile)
}
