package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
	for _, v := range []string{"VITISTACK_IPAM_API_URL", "VITISTACK_CLUSTER_ID", "VITISTACK_DEFAULT_ZONE", "VITISTACK_LOG_LEVEL", "VITISTACK_MAX_CONCURRENT_RECONCILES"} {
		g.Expect(out).To(ContainSubstring("  - "+v), "clusterctl generate provider --describe:\n%s", out)
	}
	g.Expect(out).To(ContainSubstring("  - " + paths.Image))

	// Nothing to upgrade to: the repository holds this version only.
	out, err = a.Clusterctl(ctx, nil, "upgrade", "plan", "--kubeconfig", a.Kubeconfig)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(MatchRegexp(`ipam-vitistack\s+capi-ipam-vitistack-system\s+IPAMProvider\s+` + paths.Version + `\s+Already up to date`))
}
