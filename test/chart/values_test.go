package chart

import (
	"encoding/json"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const deployment = "Deployment %s/capi-ipam-vitistack-controller-manager"

// managerOf returns the manager container of the rendered Deployment in ns.
func managerOf(g Gomega, objs map[string]*unstructured.Unstructured, ns string) (*unstructured.Unstructured, map[string]any) {
	d := objs["Deployment "+ns+"/capi-ipam-vitistack-controller-manager"]
	g.Expect(d).NotTo(BeNil(), deployment, ns)
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	g.Expect(containers).To(HaveLen(1))
	return d, containers[0].(map[string]any)
}

// webhooksOf returns the webhooks of every ValidatingWebhookConfiguration rendered.
func webhooksOf(objs map[string]*unstructured.Unstructured) []map[string]any {
	var out []map[string]any
	for _, o := range objs {
		if o.GetKind() != "ValidatingWebhookConfiguration" {
			continue
		}
		hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
		for _, h := range hooks {
			out = append(out, h.(map[string]any))
		}
	}
	return out
}

// Every value lands where it should: the manager's arguments, replicas, image and
// resources; an existing certificate Secret and its CA instead of cert-manager; the
// namespaces excluded from the Service webhook as from the controller; the
// observability objects.
func TestChartValuesLandWhereTheyShould(t *testing.T) {
	g := NewWithT(t)
	const ns = "vitistack"
	objs, err := render(t, ns,
		"replicas=3", "ipamAPI.url=https://ipam.example.org:8443", "clusterID=c-42", "defaultZone=inet",
		"excludedNamespaces={kube-system,platform}", "logLevel=2", "maxConcurrentReconciles=16",
		"image.repository=registry.example.org/mirror/ipam", "image.tag=v0.2.1", "image.pullPolicy=Always",
		"resources.limits.memory=512Mi", "webhook.certManager.enabled=false", "webhook.existingCertSecret=my-cert",
		"webhook.caBundle=Q0E=", "observability.prometheusRule=true", "observability.grafanaDashboard=true")
	g.Expect(err).NotTo(HaveOccurred())

	d, manager := managerOf(g, objs, ns)
	replicas, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas")
	g.Expect(replicas).To(BeEquivalentTo(3))
	g.Expect(manager["args"]).To(Equal([]any{"--leader-elect", "--diagnostics-address=:8443",
		"--ipam-api-url=https://ipam.example.org:8443", "--cluster-id=c-42", "--max-concurrent-reconciles=16",
		"--default-zone=inet", "--excluded-namespaces=kube-system,platform", "--v=2", "--enable-service-controller"}))
	g.Expect(manager["image"]).To(Equal("registry.example.org/mirror/ipam:v0.2.1"))
	g.Expect(manager["imagePullPolicy"]).To(Equal("Always"))
	g.Expect(manager["resources"]).To(Equal(map[string]any{
		"limits":   map[string]any{"memory": "512Mi"},
		"requests": map[string]any{"cpu": "10m", "memory": "64Mi"},
	}))
	volumes, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "volumes")
	g.Expect(volumes).To(ConsistOf(HaveKeyWithValue("secret", HaveKeyWithValue("secretName", "my-cert"))))

	for k := range objs {
		g.Expect(k).NotTo(Or(HavePrefix("Certificate "), HavePrefix("Issuer ")), "cert-manager is off")
	}
	hooks := webhooksOf(objs)
	g.Expect(hooks).To(HaveLen(3))
	for _, h := range hooks {
		g.Expect(h["clientConfig"]).To(HaveKeyWithValue("caBundle", "Q0E="), "%v", h["name"])
		g.Expect(h["clientConfig"]).To(HaveKeyWithValue("service", HaveKeyWithValue("namespace", ns)), "%v", h["name"])
		if h["name"] == "validation.service.ipam.vitistack.io" {
			g.Expect(h["namespaceSelector"]).To(HaveKeyWithValue("matchExpressions",
				ConsistOf(HaveKeyWithValue("values", []any{"kube-system", "platform"}))))
		}
	}
	for k, o := range objs {
		if o.GetKind() == "ValidatingWebhookConfiguration" {
			g.Expect(o.GetAnnotations()).NotTo(HaveKey("cert-manager.io/inject-ca-from"), k)
		}
	}

	g.Expect(keys(objs)).To(ContainElement("PrometheusRule " + ns + "/ipam-vitistack"))
	dashboard := objs["ConfigMap "+ns+"/capi-ipam-vitistack-dashboard"]
	g.Expect(dashboard).NotTo(BeNil())
	g.Expect(dashboard.GetLabels()).To(HaveKeyWithValue("grafana_dashboard", "1"))
	data, _, _ := unstructured.NestedString(dashboard.Object, "data", "vitistack-ipam.json")
	var board struct {
		Title  string `json:"title"`
		Panels []any  `json:"panels"`
	}
	g.Expect(json.Unmarshal([]byte(data), &board)).To(Succeed())
	g.Expect(board.Panels).NotTo(BeEmpty())
}

// In a namespace of its own, with the default values, the chart excludes that
// namespace (not the release manifests' one) from the Service controller and its
// webhook, and its certificate names the webhook Service there.
func TestChartInAnotherNamespace(t *testing.T) {
	g := NewWithT(t)
	const ns = "vitistack"
	objs, err := render(t, ns, "leaderElection=false")
	g.Expect(err).NotTo(HaveOccurred())
	_, manager := managerOf(g, objs, ns)
	g.Expect(manager["args"]).To(ContainElement("--excluded-namespaces=kube-system,kube-public,kube-node-lease,vitistack"))
	g.Expect(manager["args"]).NotTo(ContainElement("--leader-elect"))
	for _, h := range webhooksOf(objs) {
		if h["name"] == "validation.service.ipam.vitistack.io" {
			g.Expect(h["namespaceSelector"]).To(HaveKeyWithValue("matchExpressions",
				ConsistOf(HaveKeyWithValue("values", []any{"kube-system", "kube-public", "kube-node-lease", ns}))))
		}
	}
	cert := objs["Certificate "+ns+"/capi-ipam-vitistack-serving-cert"]
	g.Expect(cert).NotTo(BeNil())
	names, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	g.Expect(names).To(ContainElement("capi-ipam-vitistack-webhook-service.vitistack.svc"))
	for k, o := range objs {
		if o.GetKind() == "ValidatingWebhookConfiguration" {
			g.Expect(o.GetAnnotations()).To(HaveKeyWithValue("cert-manager.io/inject-ca-from", ns+"/capi-ipam-vitistack-serving-cert"), k)
		}
	}

	// An issuer of the user's instead of the chart's self-signed one.
	objs, err = render(t, ns, "webhook.certManager.issuerRef.kind=ClusterIssuer", "webhook.certManager.issuerRef.name=corp-ca")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(keys(objs)).NotTo(ContainElement("Issuer " + ns + "/capi-ipam-vitistack-selfsigned-issuer"))
	ref, _, _ := unstructured.NestedStringMap(objs["Certificate "+ns+"/capi-ipam-vitistack-serving-cert"].Object, "spec", "issuerRef")
	g.Expect(ref).To(Equal(map[string]string{"kind": "ClusterIssuer", "name": "corp-ca"}))
}

// values.schema.json refuses bad values before anything is installed, naming the value.
func TestChartRefusesBadValues(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want string
	}{
		{[]string{"replicas=two"}, "at '/replicas': got string, want integer"},
		{[]string{"replicas=0"}, "at '/replicas': minimum: got 0, want 1"},
		{[]string{"flavour=both"}, "at '/flavour'"},
		{[]string{"ipamAPI.url=ipam.example.org"}, "at '/ipamAPI/url'"},
		{[]string{"defaultZone=nowhere"}, "at '/defaultZone'"},
		{[]string{"replica=2"}, "additional properties 'replica' not allowed"},
		{[]string{"webhook.certManager.enabled=false"}, "at '/webhook/existingCertSecret': minLength: got 0, want 1"},
		{[]string{"webhook.certManager.issuerRef.kind=Secret"}, "at '/webhook/certManager/issuerRef/kind'"},
	} {
		_, err := render(t, providerNamespace, c.set...)
		NewWithT(t).Expect(err).To(MatchError(And(ContainSubstring("values don't meet the specifications of the schema"),
			ContainSubstring(c.want))), "--set %v", c.set)
	}
}
