package chart

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
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

// render is `helm template` of the chart in namespace ns with the --set values given.
func render(t *testing.T, ns string, set ...string) (map[string]*unstructured.Unstructured, error) {
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
	objs := map[string]*unstructured.Unstructured{}
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(stream)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatalf("%v in\n%s", err, doc)
		}
		if s := strings.TrimSpace(string(js)); s == "null" || s == "{}" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			t.Fatal(err)
		}
		objs[key(u)] = u
	}
}

func key(u *unstructured.Unstructured) string {
	return u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
}

// clusterctlDefault is a clusterctl variable with its default, ${NAME:=default}.
var clusterctlDefault = regexp.MustCompile(`\$\{[A-Z0-9_]+:=([^}]*)\}`)

// release reads a release manifest with every clusterctl variable at its default, as
// clusterctl renders it when none is set.
func release(t *testing.T, file string) map[string]*unstructured.Unstructured {
	t.Helper()
	dir := os.Getenv("E2E_RELEASE_DIR")
	if dir == "" {
		t.Skip("E2E_RELEASE_DIR is not set: 'make test' builds the release manifests and sets it")
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatalf("%v: run 'make release-manifests'", err)
	}
	return byKey(t, clusterctlDefault.ReplaceAllString(string(b), "$1"))
}

// The chart with its default values renders, object by object, what the release
// manifests install, in each flavour: the only differences are the ones the chart
// makes on purpose (the release's namespace is Helm's to create; uninstalling keeps the
// CRDs, and the default secret's namespace, whose Secrets own addresses).
func TestChartRendersTheReleaseManifests(t *testing.T) {
	for _, c := range []struct{ flavour, file string }{
		{"management", "ipam-components.yaml"},
		{"workload", "ipam-components-workload.yaml"},
	} {
		t.Run(c.flavour, func(t *testing.T) {
			g := NewWithT(t)
			want := release(t, c.file)
			got, err := render(t, providerNamespace, "flavour="+c.flavour)
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

// helm lint passes, with the default values and with every optional object on.
func TestChartLints(t *testing.T) {
	g := NewWithT(t)
	for _, set := range [][]string{nil, {"flavour=management"}, {"observability.prometheusRule=true,observability.grafanaDashboard=true"}} {
		args := []string{"lint", chartPath(t), "--strict", "--kube-version", kubeVersion}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		out, err := helm(t, args...)
		g.Expect(err).NotTo(HaveOccurred(), "helm lint %v", set)
		g.Expect(out).To(ContainSubstring("0 chart(s) failed"))
	}
}
