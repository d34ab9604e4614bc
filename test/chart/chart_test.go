package chart

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/testenv"
)

// The namespace the release manifests install into.
const providerNamespace = "capi-ipam-vitistack-system"

// The oldest Kubernetes the provider supports: the chart's kubeVersion must accept it.
const kubeVersion = "1.33.4"

// helmBinary is E2E_HELM; the tests skip without it.
func helmBinary(t *testing.T) string {
	t.Helper()
	h := os.Getenv("E2E_HELM")
	if h == "" {
		t.Skip("E2E_HELM is not set: 'make test' builds bin/helm and sets it")
	}
	return h
}

// chartPath is the chart, from this package's directory (where go test runs).
func chartPath(*testing.T) string {
	return filepath.Join("..", "..", "charts", "cluster-api-ipam-provider-vitistack")
}

// helm runs helm with args and returns its standard output, or an error with its
// standard error.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Env = []string{"HOME=" + t.TempDir(), "PATH=" + os.Getenv("PATH")}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), errors.New(strings.TrimSpace(stderr.String() + "\n" + stdout.String()))
	}
	return stdout.String(), nil
}

// ipamAPIURL is the IPAM-API the tests install with: the chart has no default for it.
const ipamAPIURL = "https://ipam-api.example.org"

// render is `helm template` of the chart in namespace ns with ipamAPI.url set to
// ipamAPIURL and then the --set values given (a later one wins).
func render(t *testing.T, ns string, set ...string) (map[string]*unstructured.Unstructured, error) {
	t.Helper()
	return renderWithout(t, ns, append([]string{"ipamAPI.url=" + ipamAPIURL}, set...)...)
}

// renderWithout is render without the IPAM-API's URL: only the --set values given.
func renderWithout(t *testing.T, ns string, set ...string) (map[string]*unstructured.Unstructured, error) {
	t.Helper()
	args := []string{"template", "ipam", chartPath(t), "--namespace", ns, "--kube-version", kubeVersion}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		return nil, err
	}
	return byKey(t, out), nil
}

// byKey decodes a YAML stream into its objects, by "Kind namespace/name".
func byKey(t *testing.T, stream string) map[string]*unstructured.Unstructured {
	t.Helper()
	list, err := testenv.Objects(stream)
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]*unstructured.Unstructured{}
	for _, u := range list {
		objs[key(u)] = u
	}
	return objs
}

func key(u *unstructured.Unstructured) string {
	return u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
}

// clusterctlVariable is a clusterctl variable, ${NAME} or ${NAME:=default}.
var clusterctlVariable = regexp.MustCompile(`\$\{([A-Z0-9_]+)(:=([^}]*))?\}`)

// release reads a release manifest with its clusterctl variables rendered as clusterctl
// renders them: the value in vars, else the default; a variable with neither fails
// the test.
func release(t *testing.T, file string, vars map[string]string) map[string]*unstructured.Unstructured {
	t.Helper()
	dir := os.Getenv("E2E_RELEASE_DIR")
	if dir == "" {
		t.Skip("E2E_RELEASE_DIR is not set: 'make test' builds the release manifests and sets it")
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatalf("%v: run 'make release-manifests'", err)
	}
	rendered := clusterctlVariable.ReplaceAllStringFunc(string(b), func(v string) string {
		m := clusterctlVariable.FindStringSubmatch(v)
		if value, ok := vars[m[1]]; ok {
			return value
		}
		if m[2] == "" {
			t.Fatalf("%s has the variable %s without a default, and the test gives it no value", file, m[1])
		}
		return m[3]
	})
	return byKey(t, rendered)
}

// The chart with its default values (and the IPAM-API's URL, which has none) renders,
// object by object, what the release manifests install with clusterctl's defaults (and
// that URL), for each cluster, and so does the management install with the Service
// controller on (services.enabled, VITISTACK_SERVICES): the only differences are the
// ones the chart makes on purpose (the release's namespace is Helm's to create;
// uninstalling keeps the CRDs, and the default secret's namespace, whose Secrets own
// addresses).
func TestChartRendersTheReleaseManifests(t *testing.T) {
	for _, c := range []struct {
		name, file string
		set        []string
		vars       map[string]string
	}{
		{"management", "ipam-components.yaml", []string{"cluster=management"}, nil},
		{"management with Services", "ipam-components.yaml", []string{"cluster=management", "services.enabled=true"},
			map[string]string{"VITISTACK_SERVICES": "true"}},
		{"workload", "ipam-components-workload.yaml", []string{"cluster=workload"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			vars := map[string]string{"VITISTACK_IPAM_API_URL": ipamAPIURL}
			for k, v := range c.vars {
				vars[k] = v
			}
			want := release(t, c.file, vars)
			got, err := render(t, providerNamespace, c.set...)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(want).To(HaveKey("Namespace /"+providerNamespace), "the release manifests create their namespace")
			delete(want, "Namespace /"+providerNamespace)
			for k, o := range got {
				ann := o.GetAnnotations()
				if o.GetKind() == "CustomResourceDefinition" || o.GetKind() == "Namespace" {
					g.Expect(ann).To(HaveKeyWithValue("helm.sh/resource-policy", "keep"), "%s outlives the release", k)
					delete(ann, "helm.sh/resource-policy")
					if len(ann) == 0 {
						ann = nil
					}
					o.SetAnnotations(ann)
				}
			}
			g.Expect(keys(got)).To(ConsistOf(keys(want)))
			for k, w := range want {
				g.Expect(toYAML(t, got[k])).To(Equal(toYAML(t, w)), "%s", k)
			}
		})
	}
}

func keys(m map[string]*unstructured.Unstructured) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func toYAML(t *testing.T, u *unstructured.Unstructured) string {
	t.Helper()
	b, err := yaml.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// helm lint passes, with the default values (and the IPAM-API's URL, which has none)
// and with every optional object on.
func TestChartLints(t *testing.T) {
	g := NewWithT(t)
	for _, set := range [][]string{nil, {"cluster=management"}, {"cluster=management", "services.enabled=true"},
		{"observability.prometheusRule=true,observability.grafanaDashboard=true"}} {
		args := []string{"lint", chartPath(t), "--strict", "--kube-version", kubeVersion, "--set", "ipamAPI.url=" + ipamAPIURL}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		out, err := helm(t, args...)
		g.Expect(err).NotTo(HaveOccurred(), "helm lint %v", set)
		g.Expect(out).To(ContainSubstring("0 chart(s) failed"))
	}
}
