package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
)

// What `clusterctl init --ipam vitistack` leaves in the cluster: the inventory entry,
// the namespace, the CRDs (move-hierarchy), labelled components, and a Deployment whose
// arguments carry the variables it was given.
func TestInit(t *testing.T) {
	onA.enter(t)
	g := newG(t)
	ctx := context.Background()
	c := a.Client
	g.Expect(initOut).To(ContainSubstring(`Installing provider="ipam-vitistack" version="` + paths.Version + `" targetNamespace="capi-ipam-vitistack-system"`))

	providers := &unstructured.UnstructuredList{}
	providers.SetGroupVersionKind(schema.GroupVersionKind{Group: "clusterctl.cluster.x-k8s.io", Version: "v1alpha3", Kind: "ProviderList"})
	g.Expect(c.List(ctx, providers)).To(Succeed())
	var ours []unstructured.Unstructured
	for _, p := range providers.Items {
		if p.GetName() == localcluster.ProviderName {
			ours = append(ours, p)
		}
	}
	g.Expect(ours).To(HaveLen(1), "inventory: %v", providers.Items)
	g.Expect(ours[0].GetNamespace()).To(Equal(manager.ProviderNamespace))
	g.Expect(ours[0].Object).To(HaveKeyWithValue("type", "IPAMProvider"))
	g.Expect(ours[0].Object).To(HaveKeyWithValue("providerName", "vitistack"))
	g.Expect(ours[0].Object).To(HaveKeyWithValue("version", paths.Version))
	// The first init installed the Cluster API this provider is built on (go.mod).
	goList, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "sigs.k8s.io/cluster-api").Output()
	g.Expect(err).NotTo(HaveOccurred())
	capi := strings.TrimSpace(string(goList))
	g.Expect(capi).To(HavePrefix("v1."))
	clusterctlVersion, err := a.Clusterctl(ctx, nil, "version", "-o", "short")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(strings.TrimSpace(clusterctlVersion)).To(Equal(capi), "clusterctl is not of the Cluster API in go.mod")
	var core []string
	for _, p := range providers.Items {
		if p.Object["providerName"] == "cluster-api" {
			core = append(core, fmt.Sprint(p.Object["version"]))
		}
	}
	g.Expect(core).To(Equal([]string{capi}), "core Cluster API in the inventory")

	installed := map[string]string{localcluster.ProviderLabel: localcluster.ProviderName, "clusterctl.cluster.x-k8s.io": ""}
	ns := &corev1.Namespace{}
	g.Expect(c.Get(ctx, client.ObjectKey{Name: manager.ProviderNamespace}, ns)).To(Succeed())
	g.Expect(ns.Labels).To(SatisfyAll(HaveKeyWithValue(localcluster.ProviderLabel, localcluster.ProviderName), HaveKey("clusterctl.cluster.x-k8s.io")))

	for _, name := range []string{"vitistackippools.ipam.vitistack.io", "globalvitistackippools.ipam.vitistack.io"} {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		g.Expect(c.Get(ctx, client.ObjectKey{Name: name}, crd)).To(Succeed())
		g.Expect(crd.Labels).To(SatisfyAll(HaveKeyWithValue(localcluster.ProviderLabel, localcluster.ProviderName),
			HaveKey("clusterctl.cluster.x-k8s.io/move-hierarchy")), name)
		established := false
		for _, cond := range crd.Status.Conditions {
			established = established || (cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue)
		}
		g.Expect(established).To(BeTrue(), "%s is not established", name)
	}

	// Every kind of component is there, with the provider's labels.
	for _, list := range []client.ObjectList{
		&appsv1.DeploymentList{}, &corev1.ServiceList{}, &corev1.ServiceAccountList{},
		&rbacv1.ClusterRoleList{}, &rbacv1.ClusterRoleBindingList{}, &rbacv1.RoleList{}, &rbacv1.RoleBindingList{},
	} {
		g.Expect(c.List(ctx, list, client.MatchingLabels(installed))).To(Succeed())
		g.Expect(meta.LenList(list)).To(BeNumerically(">=", 1), "%T", list)
	}

	dep := &appsv1.Deployment{}
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: manager.ProviderNamespace, Name: localcluster.DeploymentName}, dep)).To(Succeed())
	g.Expect(dep.Spec.Template.Spec.Containers).To(HaveLen(1))
	ctr := dep.Spec.Template.Spec.Containers[0]
	g.Expect(ctr.Image).To(Equal(paths.Image))
	g.Expect(ctr.Args).To(ContainElements(
		"--ipam-api-url="+ipamAPI.URL,   // given
		"--max-concurrent-reconciles=5", // given
		"--cluster-id=kube-system-uid",  // default
		"--default-zone=hnet-private",   // default
	))

	// The variables a user can set, as clusterctl describes them.
	out, err := a.Clusterctl(ctx, nil, "generate", "provider", "--ipam", "vitistack", "--describe")
	g.Expect(err).NotTo(HaveOccurred())
	for _, v := range []string{"VITISTACK_IPAM_API_URL", "VITISTACK_CLUSTER_ID", "VITISTACK_DEFAULT_ZONE", "VITISTACK_LOG_LEVEL", "VITISTACK_MAX_CONCURRENT_RECONCILES",
		"VITISTACK_SERVICES"} {
		g.Expect(out).To(ContainSubstring("  - "+v), "clusterctl generate provider --describe:\n%s", out)
	}
	g.Expect(out).To(ContainSubstring("  - " + paths.Image))

	// Nothing to upgrade to: the repository holds this version only.
	out, err = a.Clusterctl(ctx, nil, "upgrade", "plan", "--kubeconfig", a.Kubeconfig)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(MatchRegexp(`ipam-vitistack\s+capi-ipam-vitistack-system\s+IPAMProvider\s+` + paths.Version + `\s+Already up to date`))
}

// Without VITISTACK_SERVICES, as the suite's clusterctl init installs the provider, the
// management install leaves LoadBalancer Services alone: the manager runs with
// --enable-service-controller=false, and the Service webhook the install ships has its
// match condition service-controller-enabled false, so the API server never calls it. A
// Service with an annotation the webhook would refuse is admitted (a call would be
// refused: the manager serves no Service webhook, and the failure policy is Fail), and
// gets no claim (the manager runs no Service controller).
// It enters no lane: the tests that enter none run before the lanes', on the install as
// clusterctl left it (TestChaosManagerKilled turns the Service webhook on, and removes
// it after).
func TestInitLeavesServicesOff(t *testing.T) {
	g := newG(t)
	ctx := context.Background()
	dep := &appsv1.Deployment{}
	g.Expect(a.Client.Get(ctx, client.ObjectKey{Namespace: manager.ProviderNamespace, Name: localcluster.DeploymentName}, dep)).To(Succeed())
	g.Expect(dep.Spec.Template.Spec.Containers).To(HaveLen(1))
	g.Expect(dep.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--enable-service-controller=false"))

	hooks := &admissionv1.ValidatingWebhookConfiguration{}
	g.Expect(a.Client.Get(ctx, client.ObjectKey{Name: "capi-ipam-vitistack-service-validating-webhook-configuration"}, hooks)).To(Succeed())
	g.Expect(hooks.Labels).To(HaveKeyWithValue(localcluster.ProviderLabel, localcluster.ProviderName))
	g.Expect(hooks.Webhooks).To(ConsistOf(HaveField("Name", "validation.service.ipam.vitistack.io")))
	var conditions []string
	for _, c := range hooks.Webhooks[0].MatchConditions {
		if c.Name == "service-controller-enabled" {
			conditions = append(conditions, c.Expression)
		}
	}
	g.Expect(conditions).To(HaveLen(1), "the Service webhook's match conditions: %v", hooks.Webhooks[0].MatchConditions)
	on, err := constantInList(conditions[0])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(on).To(BeFalse(), "the Service webhook's condition is true without VITISTACK_SERVICES: %s", conditions[0])

	// The manager serves the pools' webhooks and not the Service webhook, which it sets
	// up with the Service controller only.
	metrics, err := localcluster.Get(ctx, aMgr.MetricsURL)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(metrics).To(ContainSubstring(`webhook="/validate-ipam-vitistack-io-v1alpha1-vitistackippool"`))
	g.Expect(metrics).NotTo(ContainSubstring(`webhook="/validate--v1-service"`))

	ns := newNamespace(t, a, "services-off")
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad", Annotations: map[string]string{ipamv1alpha1.IPFamilyAnnotation: "ipv5"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	g.Expect(a.Client.Create(ctx, svc)).To(Succeed(), "the Service webhook was called")
	got := &corev1.Service{}
	g.Expect(a.Client.Get(ctx, client.ObjectKeyFromObject(svc), got)).To(Succeed())
	g.Expect(got.Finalizers).To(BeEmpty())
	claims := &ipamv1.IPAddressClaimList{}
	g.Expect(a.Client.List(ctx, claims, client.InNamespace(ns))).To(Succeed())
	g.Expect(claims.Items).To(BeEmpty())
	deleteAndWait(t, a, svc)
}

// inList is a CEL expression that tells whether a constant is in a list of constants,
// the form of the Service webhook's service-controller-enabled condition once clusterctl
// has rendered it: "false" in ["1", "t", "true"].
var inList = regexp.MustCompile(`^\s*"([^"]*)"\s+in\s+\[(.*)\]\s*$`)

// constantInList evaluates such an expression, as the API server's CEL does.
func constantInList(expr string) (bool, error) {
	m := inList.FindStringSubmatch(expr)
	if m == nil {
		return false, fmt.Errorf("not of the form \"value\" in [\"a\", ...]: %s", expr)
	}
	var items []string
	for _, item := range strings.Split(m[2], ",") {
		item = strings.TrimSpace(item)
		if len(item) < 2 || item[0] != '"' || item[len(item)-1] != '"' || strings.Contains(item[1:len(item)-1], `"`) {
			return false, fmt.Errorf("not a list of constants: %s", expr)
		}
		items = append(items, item[1:len(item)-1])
	}
	return slices.Contains(items, m[1]), nil
}
