package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/testenv"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// The workload install (release asset ipam-components-workload.yaml) taking over from
// the IPAM-operator, as docs/migrating-from-ipam-operator.md says, on a cluster without
// Cluster API: a Service the operator gave an address keeps it, and the address MetalLB
// reads from it, and the external IP MetalLB's controller announces, never change or go
// on the way; a new LoadBalancer Service gets an address
// registered under the IPAM-operator's identity (the Service's name); the Service webhook
// refuses a bad annotation; deleting the Services releases their addresses.
func TestWorkloadFlavourTakesOverFromTheIPAMOperator(t *testing.T) {
	onOwn.enter(t)
	g := newG(t)
	ctx := context.Background()
	w := newControlPlane(t, "workload", nil)

	// What the IPAM-operator leaves behind: its default secret in ipam-system, and a
	// Service with the annotations it filled in, its address registered under the
	// operator's identity and secret, and handed to MetalLB.
	const operatorSecret = "OperatorDefaultSecret0123456789a"
	g.Expect(w.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ipam-system"}})).To(Succeed())
	g.Expect(w.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ipam-system", Name: "default"},
		StringData: map[string]string{"secret": operatorSecret}})).To(Succeed())
	ns := newNamespace(t, w, "apps")
	api, err := ipamapi.NewClient(simOf(w).URL, ipamapi.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	operatorIdentity := ipamapi.Identity{ServiceName: "legacy", NamespaceID: uidOf(t, w, ns), ClusterID: uidOf(t, w, "kube-system")}
	res, err := api.Register(ctx, ipamapi.Request{Secret: operatorSecret, Zone: "hnet-private", Family: ipamapi.FamilyIPv4, Identity: operatorIdentity})
	g.Expect(err).NotTo(HaveOccurred())
	kept := strings.TrimSuffix(res.Address, "/32")
	svc := func(name string, annotations map[string]string) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
		}
	}
	legacy := svc("legacy", map[string]string{
		ipamv1alpha1.AddressesAnnotation:           kept,
		ipamv1alpha1.AllowLocalSharedIPAnnotation:  "pre-shared-key-sa4OuI3e0oQ8Z1xYvB7nK2mP5rT9wL3c",
		ipamv1alpha1.DenyExternalCleanupAnnotation: "false",
		ipamv1alpha1.IPFamilyAnnotation:            "ipv4",
		ipamv1alpha1.RetentionPeriodDaysAnnotation: "0",
		ipamv1alpha1.SecretAnnotation:              "default",
		ipamv1alpha1.ZoneAnnotation:                "hnet-private",
		"metallb.io/loadBalancerIPs":               kept,
		"metallb.io/allow-shared-ip":               "pre-shared-key-sa4OuI3e0oQ8Z1xYvB7nK2mP5rT9wL3c",
	})
	g.Expect(w.Client.Create(ctx, legacy)).To(Succeed())
	// MetalLB announces it, as it did under the IPAM-operator.
	metallb, err := w.StartMetalLB(ctx, localcluster.StandInPools())
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(metallb.Stop)
	g.Eventually(func() []string { return announcedNow(t, w, legacy) }).Should(Equal([]string{kept}))
	// Every version of the Service from now until the provider has taken it over.
	g.Expect(w.Client.Get(ctx, client.ObjectKeyFromObject(legacy), legacy)).To(Succeed())
	versions, err := testenv.WatchVersions(ctx, w.Config, &corev1.ServiceList{}, legacy)
	g.Expect(err).NotTo(HaveOccurred())

	installWorkloadFlavour(t, w)

	mgr, err := w.StartManager(ctx, nil)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(mgr.Stop)
	g.Expect(logsOf(t, mgr)).To(ContainSubstring("Registering webhook"))
	g.Expect(logsOf(t, mgr)).To(ContainSubstring("/validate--v1-service"))

	// The pool comes after the Service was looked at and found none, twice: once when
	// the provider took it (its finalizer), once for that write; after that only the
	// pool's arrival can bring it back (the order the migration guide gives: the manager
	// first, then the pools).
	g.Eventually(func() int {
		n := 0
		for _, e := range eventsOf(t, w, legacy) {
			if e.Reason == ipamv1alpha1.EventNoPoolReason {
				n += max(1, int(e.Count))
				if e.Series != nil {
					n += int(e.Series.Count) - 1
				}
			}
		}
		return n
	}).Should(BeNumerically(">=", 2))
	g.Expect(w.Client.Create(ctx, &ipamv1alpha1.GlobalVitistackIPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "hnet-private-ipv4"},
		Spec:       ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4},
	})).To(Succeed())
	// The operator's Service is taken over (the provider's finalizer and a bound claim),
	// and MetalLB's annotation never said anything but the address it had.
	g.Eventually(func(g Gomega) {
		claims := &ipamv1.IPAddressClaimList{}
		g.Expect(w.Client.List(ctx, claims, client.InNamespace(ns), client.MatchingLabels{ipamv1alpha1.ServiceNameLabel: "legacy"})).To(Succeed())
		g.Expect(claims.Items).To(ConsistOf(HaveField("Status.AddressRef.Name", Not(BeEmpty()))))
		g.Expect(versions.Seen()).To(ContainElement(HaveField("Finalizers", ContainElement(ipamv1alpha1.ServiceFinalizer))),
			"the watch has not seen the provider's finalizer on the Service")
	}).Should(Succeed())
	for _, v := range versions.Stop() {
		g.Expect(v.Annotations).To(HaveKeyWithValue("metallb.io/loadBalancerIPs", kept),
			"version %s of the Service would have had MetalLB announce another address, or none", v.ResourceVersion)
		g.Expect(v.Status.LoadBalancer.Ingress).To(ConsistOf(HaveField("IP", kept)),
			"version %s of the Service: MetalLB announced another address, or none", v.ResourceVersion)
	}
	holders := activeHolders(t, w, kept)
	g.Expect(holders).To(HaveLen(1), "the operator's registration, not a second one")
	g.Expect(holders[0].ServiceName).To(Equal("legacy"))
	g.Expect(holders[0].NamespaceID).To(Equal(operatorIdentity.NamespaceID))
	g.Expect(holders[0].ClusterID).To(Equal(operatorIdentity.ClusterID))

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
		g.Expect(got.Status.LoadBalancer.Ingress).To(ConsistOf(HaveField("IP", address)), "MetalLB announces the address handed to it")
	}).Should(Succeed())
	holders = activeHolders(t, w, address)
	g.Expect(holders).To(HaveLen(1))
	g.Expect(holders[0].ServiceName).To(Equal("web"))
	g.Expect(holders[0].NamespaceID).To(Equal(uidOf(t, w, ns)))
	g.Expect(holders[0].ClusterID).To(Equal(uidOf(t, w, "kube-system")))

	deleteAndWait(t, w, web)
	g.Expect(activeHolders(t, w, address)).To(BeEmpty(), "deleting the Service did not release %s", address)
	deleteAndWait(t, w, legacy)
	g.Expect(activeHolders(t, w, kept)).To(BeEmpty(), "deleting the operator's Service did not release %s", kept)
	g.Expect(rbacRefusal.FindString(logsOf(t, mgr))).To(BeEmpty(), "the manager was refused a request by RBAC; see %s", mgr.LogFile)
}

// installCertManagerCRDs installs cert-manager's CRDs (the provider's Certificate and
// Issuer need them; cert-manager itself never runs here: the managers serve with the
// control plane's own certificate).
func installCertManagerCRDs(t *testing.T, w *localcluster.ControlPlane) {
	t.Helper()
	g := newG(t)
	certManager, err := filepath.Glob(filepath.Join(paths.Repository, "cert-manager", "*", "cert-manager.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(certManager).To(HaveLen(1))
	crds, err := os.ReadFile(certManager[0])
	g.Expect(err).NotTo(HaveOccurred())
	_, err = w.Apply(context.Background(), string(crds))
	g.Expect(err).NotTo(HaveOccurred())
}

// installWorkloadFlavour installs the workload install (release asset
// ipam-components-workload.yaml) on w as docs/services.md says: cert-manager's CRDs (its
// Certificate and Issuer are in it), then the install rendered with its
// variables. CAPI's IPAM CRDs come with it, serving v1beta2 only (no conversion
// webhook needed).
func installWorkloadFlavour(t *testing.T, w *localcluster.ControlPlane) {
	t.Helper()
	g := newG(t)
	ctx := context.Background()
	installCertManagerCRDs(t, w)
	flavour, err := w.GenerateYAML(ctx, map[string]string{"VITISTACK_IPAM_API_URL": simOf(w).URL, "VITISTACK_LOG_LEVEL": "2"},
		filepath.Join(paths.Repository, "ipam-vitistack", paths.Version, "ipam-components-workload.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() error { // until the CRDs just created are served
		_, err := w.Apply(ctx, flavour)
		return err
	}).Should(Succeed())
	crd := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(w.Client.Get(ctx, client.ObjectKey{Name: "ipaddressclaims.ipam.cluster.x-k8s.io"}, crd)).To(Succeed())
	g.Expect(crd.Spec.Versions).To(HaveLen(1))
	g.Expect(crd.Spec.Versions[0].Name).To(Equal("v1beta2"))
}
