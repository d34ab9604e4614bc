package templates

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/testenv"
)

var (
	ctx = context.Background()
	env *testenv.Env
	// k8s is an uncached client for unstructured objects of any of the installed kinds.
	k8s client.Client
	// clusterctl is the binary E2E_CLUSTERCTL names.
	clusterctl string
	// skip, when set, is why every test skips.
	skip string
)

// The infrastructure providers whose CRDs the overlays are checked against, pinned in
// hack/tools/provider-crds (go.mod + go.sum). The CRDs come from the module cache.
const (
	capvModule     = "sigs.k8s.io/cluster-api-provider-vsphere"
	capm3APIModule = "github.com/metal3-io/cluster-api-provider-metal3/api"
	capmoxModule   = "github.com/ionos-cloud/cluster-api-provider-proxmox"
)

const fieldOwner = "templates-test"

func TestMain(m *testing.M) {
	if clusterctl = os.Getenv("E2E_CLUSTERCTL"); clusterctl == "" {
		skip = "E2E_CLUSTERCTL is not set: 'make test' builds bin/clusterctl and sets it"
		os.Exit(m.Run())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if _, err := os.Stat(clusterctl); err != nil {
		fmt.Fprintf(os.Stderr, "templates: E2E_CLUSTERCTL=%s: %v ('make tools' builds bin/clusterctl)\n", clusterctl, err)
		return 1
	}
	start := time.Now()
	work, err := os.MkdirTemp("", "templates-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "templates:", err)
		return 1
	}
	defer func() { _ = os.RemoveAll(work) }()
	crdDirs, versions, err := providerCRDs(work)
	if err != nil {
		fmt.Fprintln(os.Stderr, "templates: provider CRDs:", err)
		return 1
	}
	if env, err = testenv.Start(ctx, testenv.DefaultOptions()); err != nil {
		fmt.Fprintln(os.Stderr, "templates: starting the test environment:", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "templates: stopping the test environment:", err)
		}
	}()
	crds, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{Paths: crdDirs, ErrorIfPathMissing: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "templates: installing the provider CRDs:", err)
		return 1
	}
	if k8s, err = client.New(env.Config, client.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, "templates:", err)
		return 1
	}
	fmt.Printf("templates: API server with %d provider CRDs (%s) ready in %s\n",
		len(crds), strings.Join(versions, ", "), time.Since(start).Round(time.Millisecond))
	return m.Run()
}

// requireEnv skips the test when the suite has no clusterctl.
func requireEnv(t *testing.T) {
	t.Helper()
	if skip != "" {
		t.Skip(skip)
	}
}

// providerCRDs returns the CRD directories of the pinned infrastructure providers, and
// their versions for the log. Metal3's root module (which holds its config/crd/bases)
// is not on the module proxy, so its CRDs are generated from its api module with
// controller-gen into work, as CAPM3's `make generate-manifests` does.
func providerCRDs(work string) ([]string, []string, error) {
	var dirs, versions []string
	for _, c := range []struct{ module, crds string }{
		{capvModule, "config/default/crd/bases"},
		{capmoxModule, "config/crd/bases"},
		{capm3APIModule, ""},
	} {
		dir, version, err := pinnedModule(c.module)
		if err != nil {
			return nil, nil, err
		}
		versions = append(versions, c.module+"@"+version)
		if c.crds != "" {
			dirs = append(dirs, filepath.Join(dir, c.crds))
			continue
		}
		out := filepath.Join(work, "metal3-crds")
		if err := generateCRDs(work, dir, out); err != nil {
			return nil, nil, err
		}
		dirs = append(dirs, out)
	}
	return dirs, versions, nil
}

// toolEnv is the environment of the go commands run on the pinned modules: go.sum as
// committed (no updates), no workspace.
func toolEnv() []string {
	return append(os.Environ(), "GOFLAGS=-mod=readonly", "GOWORK=off")
}

// pinnedModule returns the module cache directory and version of a module that
// hack/tools/provider-crds requires; go verifies it against that go.sum.
func pinnedModule(module string) (string, string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", module)
	cmd.Dir = filepath.Join(testenv.RepoRoot(), "hack", "tools", "provider-crds")
	cmd.Env = toolEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	var info struct{ Dir, Version, Error string }
	if err := json.Unmarshal(out, &info); err != nil || info.Error != "" || info.Dir == "" {
		return "", "", errors.Errorf("go mod download -json %s in %s: %v %s %s", module, cmd.Dir, runErr, info.Error, stderr.String())
	}
	return info.Dir, info.Version, nil
}

// generateCRDs writes the CRDs of the Metal3 API module in apiDir to out.
func generateCRDs(work, apiDir, out string) error {
	gen, err := controllerGen(work)
	if err != nil {
		return err
	}
	cmd := exec.Command(gen, "crd:crdVersions=v1", "paths=./v1beta1/...", "output:crd:dir="+out)
	cmd.Dir = apiDir
	cmd.Env = toolEnv()
	if b, err := cmd.CombinedOutput(); err != nil {
		return errors.Wrapf(err, "controller-gen in %s:\n%s", apiDir, b)
	}
	return nil
}

// controllerGen returns bin/controller-gen (make builds it), else builds it from
// hack/tools/controller-gen into work.
func controllerGen(work string) (string, error) {
	root := testenv.RepoRoot()
	if bin := filepath.Join(root, "bin", "controller-gen"); fileExists(bin) {
		return bin, nil
	}
	bin := filepath.Join(work, "controller-gen")
	cmd := exec.Command("go", "build", "-o", bin, "sigs.k8s.io/controller-tools/cmd/controller-gen")
	cmd.Dir = filepath.Join(root, "hack", "tools", "controller-gen")
	cmd.Env = toolEnv()
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", errors.Wrapf(err, "building controller-gen:\n%s", b)
	}
	return bin, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// templatePath is the path of a file in templates/.
func templatePath(file string) string {
	return filepath.Join(testenv.RepoRoot(), "templates", file)
}

// clusterctlArgs is the clusterctl command line that renders file: `generate cluster`
// for a cluster template (named c1, into namespace ns), `generate yaml` otherwise.
func clusterctlArgs(file, ns string, extra ...string) []string {
	var args []string
	if isClusterTemplate(file) {
		args = []string{"generate", "cluster", clusterName, "--from", templatePath(file), "--target-namespace", ns}
	} else {
		args = []string{"generate", "yaml", "--from", templatePath(file)}
	}
	return append(args, extra...)
}

func isClusterTemplate(file string) bool { return strings.HasPrefix(file, "cluster-template-") }

// clusterName is the cluster the cluster templates are rendered for.
const clusterName = "c1"

// runClusterctl runs clusterctl with only the given variables in its environment (and a
// configuration directory of its own), so nothing of the caller's environment leaks in.
func runClusterctl(t *testing.T, args []string, vars map[string]string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(clusterctl, args...)
	cmd.Env = []string{"HOME=" + home, "XDG_CONFIG_HOME=" + home, "CLUSTERCTL_DISABLE_VERSIONCHECK=true"}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), errors.Wrapf(err, "clusterctl %s: %s", strings.Join(args, " "), strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// render renders file with vars and decodes the objects.
func render(t *testing.T, file, ns string, vars map[string]string) []*unstructured.Unstructured {
	t.Helper()
	out, err := runClusterctl(t, clusterctlArgs(file, ns), vars)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return decode(t, out)
}

// decode splits a multi-document YAML stream into objects.
func decode(t *testing.T, s string) []*unstructured.Unstructured {
	t.Helper()
	g := NewWithT(t)
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(s)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		g.Expect(err).NotTo(HaveOccurred())
		js, err := yaml.YAMLToJSON(doc)
		g.Expect(err).NotTo(HaveOccurred())
		if s := strings.TrimSpace(string(js)); s == "null" || s == "{}" {
			continue
		}
		u := &unstructured.Unstructured{}
		g.Expect(u.UnmarshalJSON(js)).To(Succeed(), "rendered document:\n%s", doc)
		objs = append(objs, u)
	}
	return objs
}

// ref names an object as the tests list them: "Kind namespace/name" or "Kind name".
func ref(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetKind() + " " + o.GetName()
	}
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

func refs(objs []*unstructured.Unstructured) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, ref(o))
	}
	return out
}

// apply server-side applies obj as `kubectl apply --server-side` does (strict field
// validation: an unknown field is an error); with dryRun the server validates it
// (schema, CEL, admission webhooks) and stores nothing.
func apply(obj *unstructured.Unstructured, dryRun bool) error {
	opts := []client.PatchOption{client.FieldOwner(fieldOwner), client.ForceOwnership, client.FieldValidation("Strict")}
	if dryRun {
		opts = append(opts, client.DryRunAll)
	}
	// Client.Apply has no FieldValidation option, and this test wants Strict.
	return k8s.Patch(ctx, obj.DeepCopy(), client.Apply, opts...) //nolint:staticcheck // see above
}

// dryRunAll applies every object in a dry run and returns the refusals by object.
func dryRunAll(objs []*unstructured.Unstructured) map[string]string {
	refused := map[string]string{}
	for _, o := range objs {
		if err := apply(o, true); err != nil {
			refused[ref(o)] = err.Error()
		}
	}
	return refused
}

// describe lists refusals one per line, for failure messages.
func describe(refused map[string]string) string {
	keys := make([]string, 0, len(refused))
	for k := range refused {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %s: %s", k, refused[k])
	}
	return b.String()
}

// createForReal applies objects for real: the objects a template's webhooks judge it
// against (pools and Secrets a Service names) must exist.
func createForReal(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	g := NewWithT(t)
	for _, o := range objs {
		g.Expect(apply(o, false)).To(Succeed(), "creating %s", ref(o))
	}
}

// ensureNamespace creates ns unless it exists.
func ensureNamespace(t *testing.T, ns string) {
	t.Helper()
	if ns == "" || ns == metav1.NamespaceDefault {
		return
	}
	err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		NewWithT(t).Expect(err).NotTo(HaveOccurred())
	}
}

// templateVariables returns every variable clusterctl finds in args's template
// (`--list-variables`: required and optional ones for a cluster template, all of them
// in one list for `generate yaml`).
func templateVariables(t *testing.T, args []string) []string {
	t.Helper()
	out, err := runClusterctl(t, append(args, "--list-variables"), nil)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	var vars []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "-" {
			vars = append(vars, f[1])
		}
	}
	return vars
}

// missingVariables matches clusterctl's refusal to render a template with variables
// that have no value and no default.
var missingVariables = regexp.MustCompile(`value for variables \[([^\]]*)\] is not set`)

// requiredVariables returns the variables args's template cannot be rendered without:
// those clusterctl names when it renders the template with no variables at all.
func requiredVariables(t *testing.T, args []string) []string {
	t.Helper()
	_, err := runClusterctl(t, args, nil)
	if err == nil {
		return nil
	}
	m := missingVariables.FindStringSubmatch(err.Error())
	NewWithT(t).Expect(m).NotTo(BeNil(), "rendering with no variables: %v", err)
	return strings.Split(m[1], ", ")
}
