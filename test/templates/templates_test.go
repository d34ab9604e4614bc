package templates

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/testenv"
)

// templateCase is one file of templates/: the variables it needs, what it renders to,
// and what must exist before its objects are judged.
type templateCase struct {
	file string
	// namespace is the --target-namespace of a cluster template, or the NAMESPACE
	// variable of the others (empty: the template names its namespaces itself).
	namespace string
	// required are the variables without a default, as clusterctl lists them.
	required []string
	// vars are the values rendered with: every required variable, and some optional ones.
	vars map[string]string
	// objects are the rendered objects, in order ("Kind namespace/name").
	objects []string
	// before creates, for real, what admission judges the objects against.
	before func(t *testing.T, objs []*unstructured.Unstructured)
}

// Node network of the cluster templates.
var nodeVars = map[string]string{
	"NODE_SUBNET":               "10.20.30.0/24",
	"NODE_GATEWAY":              "10.20.30.1",
	"CONTROL_PLANE_ENDPOINT_IP": "10.20.30.5",
}

func with(base map[string]string, more map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range []map[string]string{base, more} {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// cases returns the table, one entry per file of templates/.
func cases() []templateCase {
	return []templateCase{
		{
			file: "global-pools.yaml",
			objects: []string{
				"GlobalVitistackIPPool inet-ipv4",
				"GlobalVitistackIPPool inet-ipv6",
				"GlobalVitistackIPPool hnet-private-ipv4",
				"GlobalVitistackIPPool hnet-public-ipv4",
			},
		},
		{
			file:      "cluster-pool.yaml",
			namespace: "tpl-pools",
			vars:      map[string]string{"CLUSTER_NAME": "c1", "NAMESPACE": "tpl-pools"},
			objects:   []string{"VitistackIPPool tpl-pools/c1-ipv4", "VitistackIPPool tpl-pools/c1-ipv6"},
		},
		{
			file: "claims.yaml",
			objects: []string{
				"IPAddressClaim default/example-any",
				"IPAddressClaim default/example-fixed",
				"IPAddressClaim default/example-ipv6",
			},
		},
		{
			file:      "service.yaml",
			namespace: "tpl-service",
			required:  []string{"VITISTACK_SECRET"},
			vars: map[string]string{
				"SERVICE_NAME": "web", "NAMESPACE": "tpl-service",
				"VITISTACK_SECRET": "s3cret: 0123456789abcdef #1", // quoted in the template
			},
			objects: []string{
				"Service tpl-service/web",
				"Secret tpl-service/web-ipam-secret",
				"Service tpl-service/web-anycast",
			},
			// The Service webhook refuses zones and families no GlobalVitistackIPPool
			// serves, and Secrets that do not exist: as a user would, the pools of
			// global-pools.yaml and the template's Secret are applied first.
			before: func(t *testing.T, objs []*unstructured.Unstructured) {
				createForReal(t, render(t, "global-pools.yaml", "", nil))
				createForReal(t, slices.DeleteFunc(slices.Clone(objs), func(o *unstructured.Unstructured) bool {
					return o.GetKind() != "Secret"
				}))
			},
		},
		{
			file:      "control-plane-endpoint.yaml",
			namespace: "tpl-endpoint-dry",
			required:  []string{"NODE_GATEWAY", "NODE_SUBNET"},
			vars:      map[string]string{"CLUSTER_NAME": "c1", "NAMESPACE": "tpl-endpoint-dry", "NODE_SUBNET": "10.20.30.0/24", "NODE_GATEWAY": "10.20.30.1"},
			objects:   []string{"VitistackIPPool tpl-endpoint-dry/c1-nodes", "IPAddressClaim tpl-endpoint-dry/c1-control-plane-endpoint"},
		},
		{
			file:      "cluster-template-vsphere-nodes.yaml",
			namespace: "tpl-vsphere",
			required: []string{
				"CONTROL_PLANE_ENDPOINT_IP", "NODE_GATEWAY", "NODE_SUBNET",
				"VSPHERE_DATACENTER", "VSPHERE_DATASTORE", "VSPHERE_FOLDER", "VSPHERE_NETWORK",
				"VSPHERE_RESOURCE_POOL", "VSPHERE_SERVER", "VSPHERE_TEMPLATE",
			},
			vars: with(nodeVars, map[string]string{
				"VSPHERE_SERVER":        "vcenter.example.org",
				"VSPHERE_DATACENTER":    "dc1",
				"VSPHERE_DATASTORE":     "ds1",
				"VSPHERE_FOLDER":        "vm/c1",
				"VSPHERE_RESOURCE_POOL": "*/Resources",
				"VSPHERE_NETWORK":       "nodes",
				"VSPHERE_TEMPLATE":      "ubuntu-2404-kube-v1.33.4",
			}),
			objects: []string{
				"VitistackIPPool tpl-vsphere/c1-nodes",
				"VSphereMachineTemplate tpl-vsphere/c1",
				"VSphereMachineTemplate tpl-vsphere/c1-worker",
			},
		},
		{
			file:      "cluster-template-metal3-nodes.yaml",
			namespace: "tpl-metal3",
			required:  []string{"CONTROL_PLANE_ENDPOINT_IP", "IMAGE_CHECKSUM", "IMAGE_URL", "NODE_GATEWAY", "NODE_SUBNET"},
			vars: with(nodeVars, map[string]string{
				"IMAGE_URL":      "http://images.example.org/ubuntu-2404-kube-v1.33.4.raw",
				"IMAGE_CHECKSUM": "http://images.example.org/ubuntu-2404-kube-v1.33.4.raw.sha256sum",
				"NODE_NIC":       "eno1",
			}),
			objects: []string{
				"VitistackIPPool tpl-metal3/c1-nodes",
				"Metal3DataTemplate tpl-metal3/c1-controlplane-template",
				"Metal3MachineTemplate tpl-metal3/c1-controlplane",
				"Metal3DataTemplate tpl-metal3/c1-workers-template",
				"Metal3MachineTemplate tpl-metal3/c1-workers",
			},
		},
	}
}

func caseFor(t *testing.T, file string) templateCase {
	t.Helper()
	for _, c := range cases() {
		if c.file == file {
			return c
		}
	}
	t.Fatalf("no case for %s", file)
	return templateCase{}
}

// TestEveryTemplateIsChecked keeps the table complete: a new file in templates/ needs a case.
func TestEveryTemplateIsChecked(t *testing.T) {
	g := NewWithT(t)
	entries, err := os.ReadDir(filepath.Join(testenv.RepoRoot(), "templates"))
	g.Expect(err).NotTo(HaveOccurred())
	var files, covered []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".yaml") {
			files = append(files, e.Name())
		}
	}
	for _, c := range cases() {
		covered = append(covered, c.file)
	}
	g.Expect(covered).To(ConsistOf(files))
}

// TestTemplatesRenderAndApply renders every template and applies every object it
// renders with a server-side dry run: our CRDs (OpenAPI and CEL) and webhooks, CAPI's
// IPAddressClaim, and the providers' real CRDs must all accept them.
func TestTemplatesRenderAndApply(t *testing.T) {
	requireEnv(t)
	for _, c := range cases() {
		t.Run(c.file, func(t *testing.T) {
			g := NewWithT(t)
			ensureNamespace(t, c.namespace)
			objs := render(t, c.file, c.namespace, c.vars)
			g.Expect(refs(objs)).To(Equal(c.objects), "rendered objects")
			if c.before != nil {
				c.before(t, objs)
			}
			refused := dryRunAll(objs)
			g.Expect(refused).To(BeEmpty(), "refused by the API server:%s", describe(refused))
		})
	}
}

// TestTemplateVariables checks the variables each template needs: exactly the listed
// ones are required (rendering with no variables names them all), every value the table
// sets is a variable of the template, and rendering without any one required variable
// fails naming it.
func TestTemplateVariables(t *testing.T) {
	requireEnv(t)
	for _, c := range cases() {
		t.Run(c.file, func(t *testing.T) {
			g := NewWithT(t)
			args := clusterctlArgs(c.file, c.namespace)
			g.Expect(requiredVariables(t, args)).To(ConsistOf(c.required), "required variables")
			all := templateVariables(t, args)
			for k := range c.vars {
				g.Expect(all).To(ContainElement(k), "%s is not a variable of %s", k, c.file)
			}
			for _, missing := range c.required {
				vars := with(c.vars, nil)
				delete(vars, missing)
				_, err := runClusterctl(t, clusterctlArgs(c.file, c.namespace), vars)
				g.Expect(err).To(MatchError(ContainSubstring(fmt.Sprintf("value for variables [%s] is not set", missing))), "rendering without %s", missing)
			}
		})
	}
}

// TestTemplatesRefuseBadValues renders templates with a wrong value and checks that the
// API server refuses exactly the object it lands in, with a message that names the field.
func TestTemplatesRefuseBadValues(t *testing.T) {
	requireEnv(t)
	for _, tc := range []struct {
		name    string
		file    string
		set     map[string]string
		refused string
		message string
	}{
		{
			name: "gateway outside the node subnet (CEL)", file: "cluster-template-vsphere-nodes.yaml",
			set:     map[string]string{"NODE_GATEWAY": "10.20.31.1"},
			refused: "VitistackIPPool tpl-vsphere/c1-nodes", message: "gateway must lie inside subnet",
		},
		{
			name: "node subnet that is not a network (CEL)", file: "cluster-template-metal3-nodes.yaml",
			set:     map[string]string{"NODE_SUBNET": "10.20.30.7/24"},
			refused: "VitistackIPPool tpl-metal3/c1-nodes", message: "subnet must be a network in CIDR form, for example 10.20.0.0/24",
		},
		{
			name: "control-plane endpoint outside the node subnet (CEL)", file: "cluster-template-metal3-nodes.yaml",
			set:     map[string]string{"CONTROL_PLANE_ENDPOINT_IP": "10.99.0.5"},
			refused: "VitistackIPPool tpl-metal3/c1-nodes", message: "every excludedAddresses entry must be an address, a CIDR or a range first-last inside subnet",
		},
		{
			name: "gateway of the other family (CEL)", file: "cluster-template-vsphere-nodes.yaml",
			set:     map[string]string{"NODE_GATEWAY": "2001:db8::1"},
			refused: "VitistackIPPool tpl-vsphere/c1-nodes", message: "gateway must be an address of the pool's ipFamily",
		},
		{
			name: "zone without a pool (Service webhook)", file: "service.yaml",
			set:     map[string]string{"VITISTACK_ZONE": "nowhere"},
			refused: "Service tpl-service/web", message: `metadata.annotations[ipam.vitistack.io/zone]: Invalid value: "nowhere": unknown zone`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			c := caseFor(t, tc.file)
			ensureNamespace(t, c.namespace)
			objs := render(t, c.file, c.namespace, with(c.vars, tc.set))
			if c.before != nil {
				c.before(t, objs)
			}
			refused := dryRunAll(objs)
			g.Expect(refused).To(HaveLen(1), "exactly one object refused:%s", describe(refused))
			g.Expect(refused).To(HaveKeyWithValue(tc.refused, ContainSubstring(tc.message)), "refusals:%s", describe(refused))
		})
	}
}

// TestProxmoxTakesOnlyInClusterPools records why templates/ has no Proxmox overlay:
// CAPMOX's ipv4PoolRef/ipv6PoolRef accept only the in-cluster provider's pool kinds
// (CEL on its CRD), so a ProxmoxMachineTemplate cannot name a VitistackIPPool. The same
// object naming an InClusterIPPool is accepted. If a CAPMOX upgrade lifts the rule, this
// test fails: then add the overlay.
func TestProxmoxTakesOnlyInClusterPools(t *testing.T) {
	requireEnv(t)
	g := NewWithT(t)
	const ns = "tpl-proxmox"
	ensureNamespace(t, ns)
	machineTemplate := func(apiGroup, kind string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
			"kind":       "ProxmoxMachineTemplate",
			"metadata":   map[string]any{"name": "c1-worker", "namespace": ns},
			"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
				"sourceNode": "pve1",
				"templateID": int64(100),
				"network": map[string]any{"default": map[string]any{
					"bridge":      "vmbr0",
					"ipv4PoolRef": map[string]any{"apiGroup": apiGroup, "kind": kind, "name": "c1-nodes"},
				}},
			}}},
		}}
	}
	g.Expect(apply(machineTemplate("ipam.cluster.x-k8s.io", "InClusterIPPool"), true)).To(Succeed())
	err := apply(machineTemplate("ipam.vitistack.io", "VitistackIPPool"), true)
	g.Expect(err).To(MatchError(And(
		ContainSubstring("ipv4PoolRef allows only IPAM apiGroup ipam.cluster.x-k8s.io"),
		ContainSubstring("ipv4PoolRef allows either InClusterIPPool or GlobalInClusterIPPool"))))
}
