package chart

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
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
		"webhook.caBundle=Q0E=", "observability.prometheusRule=true", "observability.grafanaDashboard=true",
		"extraArgs={--ipam-api-timeout=20s,--ipam-api-quarantine=2m}")
	g.Expect(err).NotTo(HaveOccurred())

	d, manager := managerOf(g, objs, ns)
	replicas, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas")
	g.Expect(replicas).To(BeEquivalentTo(3))
	g.Expect(manager["args"]).To(Equal([]any{"--leader-elect", "--diagnostics-address=:8443",
		"--ipam-api-url=https://ipam.example.org:8443", "--cluster-id=c-42", "--max-concurrent-reconciles=16",
		"--default-zone=inet", "--excluded-namespaces=kube-system,platform", "--v=2",
		"--ipam-api-timeout=20s", "--ipam-api-quarantine=2m", "--enable-service-controller"}))
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
		{[]string{"cluster=both"}, "at '/cluster'"},
		{[]string{"ipamAPI.url=ipam.example.org"}, "at '/ipamAPI/url'"},
		{[]string{"defaultZone=nowhere"}, "at '/defaultZone'"},
		{[]string{"replica=2"}, "additional properties 'replica' not allowed"},
		{[]string{"webhook.certManager.enabled=false"}, "at '/webhook/existingCertSecret': minLength: got 0, want 1"},
		// A certificate of the user's with cert-manager on: cert-manager would inject the CA
		// of another certificate than the one served, and every pool write be refused.
		{[]string{"webhook.existingCertSecret=my-cert", "webhook.caBundle=Zm9v"}, "at '/webhook/certManager/enabled'"},
		{[]string{"webhook.certManager.issuerRef.kind=Secret"}, "at '/webhook/certManager/issuerRef/kind'"},
		{[]string{"services.enabled=yes"}, "at '/services/enabled': got string, want boolean"},
		{[]string{"extraArgs={ipam-api-timeout=20s}"}, "at '/extraArgs/0'"},
	} {
		_, err := render(t, providerNamespace, c.set...)
		NewWithT(t).Expect(err).To(MatchError(And(ContainSubstring("values don't meet the specifications of the schema"),
			ContainSubstring(c.want))), "--set %v", c.set)
	}
}

// Without ipamAPI.url the chart refuses to render, for either cluster, and says what to
// set: there is no default IPAM-API (it registers what it is sent without
// authentication, and a trial install must not register in production).
func TestChartRequiresTheIPAMAPIURL(t *testing.T) {
	for _, cluster := range []string{"workload", "management"} {
		g := NewWithT(t)
		_, err := renderWithout(t, providerNamespace, "cluster="+cluster)
		g.Expect(err).To(MatchError(ContainSubstring("set ipamAPI.url to your IPAM-API's URL, e.g. https://ipam-api.example.org")), cluster)
		_, err = renderWithout(t, providerNamespace, "cluster="+cluster, "ipamAPI.url=")
		g.Expect(err).To(MatchError(ContainSubstring("set ipamAPI.url to your IPAM-API's URL")), cluster)
	}
}

// services.enabled turns the management install's Service controller on: its argument,
// its default secret in the release's namespace (where that install lets the manager
// create it), and the condition that lets the Service webhook call the manager, true
// exactly when the controller is on. The workload install serves Services either way.
func TestChartServicesSwitch(t *testing.T) {
	const ns = "vitistack"
	for _, c := range []struct {
		cluster string
		set     []string
		on      bool
	}{
		{"management", nil, false},
		{"management", []string{"services.enabled=false"}, false},
		{"management", []string{"services.enabled=true"}, true},
		{"workload", nil, true},
		{"workload", []string{"services.enabled=false"}, true},
	} {
		g := NewWithT(t)
		what := c.cluster + " " + strings.Join(c.set, " ")
		objs, err := render(t, ns, append([]string{"cluster=" + c.cluster}, c.set...)...)
		g.Expect(err).NotTo(HaveOccurred(), what)
		_, manager := managerOf(g, objs, ns)
		args := manager["args"].([]any)
		var service []any
		for _, a := range args {
			if strings.HasPrefix(a.(string), "--enable-service-controller") {
				service = append(service, a)
			}
		}
		hook := serviceWebhookOf(g, objs)
		g.Expect(hook["failurePolicy"]).To(Equal("Fail"), what)
		if c.cluster == "workload" {
			g.Expect(service).To(Equal([]any{"--enable-service-controller"}), what)
			g.Expect(conditionNames(hook)).To(Equal([]string{"type-loadbalancer"}), what)
			continue
		}
		g.Expect(service).To(Equal([]any{"--enable-service-controller=" + map[bool]string{true: "true", false: "false"}[c.on]}), what)
		g.Expect(args).To(ContainElement("--default-secret-namespace="+ns), what)
		g.Expect(conditionNames(hook)).To(Equal([]string{"service-controller-enabled", "type-loadbalancer"}), what)
		g.Expect(controllerCondition(g, hook)).To(Equal(c.on), what)
	}
}

// serviceWebhookOf returns the Service webhook of the rendered objects.
func serviceWebhookOf(g Gomega, objs map[string]*unstructured.Unstructured) map[string]any {
	for _, h := range webhooksOf(objs) {
		if h["name"] == "validation.service.ipam.vitistack.io" {
			return h
		}
	}
	g.Expect(false).To(BeTrue(), "no Service webhook rendered")
	return nil
}

func conditionNames(hook map[string]any) []string {
	var names []string
	conds, _, _ := unstructured.NestedSlice(hook, "matchConditions")
	for _, c := range conds {
		names = append(names, c.(map[string]any)["name"].(string))
	}
	return names
}

// listMembership is the form of the Service webhook's service-controller-enabled
// condition: "value" in ["a", "b", ...].
var listMembership = regexp.MustCompile(`^"([^"]*)" in \[((?:"[^"]*"(?:, )?)+)\]$`)

// controllerCondition evaluates the webhook's service-controller-enabled condition, a
// constant, as the API server's CEL does.
func controllerCondition(g Gomega, hook map[string]any) bool {
	conds, _, _ := unstructured.NestedSlice(hook, "matchConditions")
	for _, c := range conds {
		if c.(map[string]any)["name"] != "service-controller-enabled" {
			continue
		}
		expr := c.(map[string]any)["expression"].(string)
		m := listMembership.FindStringSubmatch(expr)
		g.Expect(m).NotTo(BeNil(), "the condition is not of the form \"value\" in [...]: %s", expr)
		return slices.Contains(strings.Split(strings.Trim(m[2], `"`), `", "`), m[1])
	}
	g.Expect(false).To(BeTrue(), "the Service webhook has no service-controller-enabled condition")
	return false
}
