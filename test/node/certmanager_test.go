package node

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
)

// withCertManager is the chart's value that has cert-manager issue the webhook's
// certificate (its default; helmInstall otherwise brings a certificate of its own).
const withCertManager = "webhook.certManager.enabled=true"

// The chart as it installs by default, on a cluster with cert-manager: cert-manager's
// controller issues the webhook's certificate from the chart's self-signed Issuer, its
// cainjector puts the CA into both webhook configurations, and kube-apiserver, trusting
// it, calls the webhook through its Service: a bad pool is refused; a claim binds.
func TestCertManagerIssuesTheChartsWebhookCertificate(t *testing.T) {
	g := newG(t)
	installCertManager(t)
	installChart(t, withCertManager)

	g.Expect(issuedAndInjected(t, ns)).To(HaveLen(2), "the pool's and the Service's webhook configurations")
	refusesABadPool(t, ns)
	newPool(t, "node-cert-manager-ipv4")
	claim, _ := bind(t, "issued", "node-cert-manager-ipv4")
	deleteAndWait(t, claim)
}

// installCertManager installs cert-manager (InstallCertManager) once for the suite.
func installCertManager(t *testing.T) {
	t.Helper()
	if certManagerInstalled {
		return
	}
	newG(t).Expect(cp.InstallCertManager(context.Background())).To(Succeed())
	certManagerInstalled = true
}

// certManagerInstalled: installCertManager installed it; it stays for the suite.
var certManagerInstalled bool

// servingCert waits until cert-manager has issued the webhook's certificate in
// namespace (its Certificate Ready) and returns the Secret it wrote.
func servingCert(t *testing.T, namespace string) *corev1.Secret {
	t.Helper()
	g := newG(t)
	ctx := context.Background()
	cert := &unstructured.Unstructured{}
	cert.SetAPIVersion("cert-manager.io/v1")
	cert.SetKind("Certificate")
	g.Eventually(func(g Gomega) {
		g.Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "capi-ipam-vitistack-serving-cert"}, cert)).To(Succeed())
		conditions, _, _ := unstructured.NestedSlice(cert.Object, "status", "conditions")
		g.Expect(conditions).To(ContainElement(And(HaveKeyWithValue("type", "Ready"), HaveKeyWithValue("status", "True"))))
	}).Should(Succeed(), "cert-manager issues the webhook's certificate")
	name, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	secret := &corev1.Secret{}
	g.Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, secret)).To(Succeed())
	return secret
}

// injectedWebhooks are the webhook configurations that ask cert-manager for the CA of
// the serving certificate in namespace, once every one of them has it.
func injectedWebhooks(t *testing.T, namespace string) []admissionv1.ValidatingWebhookConfiguration {
	t.Helper()
	var ours []admissionv1.ValidatingWebhookConfiguration
	newG(t).Eventually(func(g Gomega) {
		list := &admissionv1.ValidatingWebhookConfigurationList{}
		g.Expect(cp.Client.List(context.Background(), list)).To(Succeed())
		ours = nil
		for _, w := range list.Items {
			if w.Annotations["cert-manager.io/inject-ca-from"] != namespace+"/capi-ipam-vitistack-serving-cert" {
				continue
			}
			for _, hook := range w.Webhooks {
				g.Expect(hook.ClientConfig.CABundle).NotTo(BeEmpty(), "cert-manager's cainjector fills %s", hook.Name)
			}
			ours = append(ours, w)
		}
		g.Expect(ours).NotTo(BeEmpty())
	}).Should(Succeed())
	return ours
}

// refusesABadPool: kube-apiserver calls the pool webhook of the provider installed in
// namespace, through its Service and certificate, and the webhook refuses a pool whose
// excluded range is backwards, naming the field and the fix.
func refusesABadPool(t *testing.T, namespace string) {
	t.Helper()
	bad := &ipamv1alpha1.VitistackIPPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "bad"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4,
			Subnet: "192.0.2.0/24", ExcludedAddresses: []string{"192.0.2.20-192.0.2.10"}},
	}
	// Until the Service's endpoints list the Ready Pod (a moment after the Deployment
	// says it is available), kube-apiserver finds no endpoint to call.
	newG(t).Eventually(func(g Gomega) {
		err := cp.Client.Create(context.Background(), bad)
		g.Expect(err).To(HaveOccurred())
		g.Expect(err.Error()).To(And(ContainSubstring("spec.excludedAddresses"), ContainSubstring("lowest first")))
	}).Should(Succeed())
}
