package release

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/testenv"
)

// clusterctl runs `clusterctl generate yaml --from file` of the release's assets with
// only vars set (E2E_CLUSTERCTL; the test skips without it): what clusterctl init and
// upgrade install.
func clusterctl(t *testing.T, file string, vars map[string]string) (string, error) {
	t.Helper()
	bin := os.Getenv("E2E_CLUSTERCTL")
	if bin == "" {
		t.Skip("E2E_CLUSTERCTL is not set: 'make test' builds bin/clusterctl and sets it")
	}
	dir, _ := assets(t)
	cmd := exec.Command(bin, "generate", "yaml", "--from", filepath.Join(dir, file))
	home := t.TempDir()
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"CLUSTERCTL_DISABLE_VERSIONCHECK=true"}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", errors.New(strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// objects decodes a YAML stream into its objects.
func objects(t *testing.T, stream string) []*unstructured.Unstructured {
	t.Helper()
	out, err := testenv.Objects(stream)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// installed is what the manager is started with and the Service webhook of a rendered
// release asset.
type installed struct {
	args        []string
	serviceHook map[string]any
}

func installedOf(g Gomega, objs []*unstructured.Unstructured) installed {
	var in installed
	for _, o := range objs {
		switch {
		case o.GetKind() == "Deployment":
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			g.Expect(containers).To(HaveLen(1))
			args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
			in.args = args
		case o.GetKind() == "ValidatingWebhookConfiguration":
			hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
			for _, h := range hooks {
				if h.(map[string]any)["name"] == "validation.service.ipam.vitistack.io" {
					in.serviceHook = h.(map[string]any)
				}
			}
		}
	}
	g.Expect(in.args).NotTo(BeEmpty(), "no manager Deployment")
	return in
}

// listMembership is the form of the Service webhook's service-controller-enabled
// condition: "value" in ["a", "b", ...].
var listMembership = regexp.MustCompile(`^"([^"]*)" in \[((?:"[^"]*"(?:, )?)+)\]$`)

// conditions are the Service webhook's match conditions by name; the
// service-controller-enabled one, a constant, is evaluated ("true" or "false") as the
// API server's CEL does.
func conditions(g Gomega, hook map[string]any) map[string]string {
	out := map[string]string{}
	conds, _, _ := unstructured.NestedSlice(hook, "matchConditions")
	for _, c := range conds {
		name, expr := c.(map[string]any)["name"].(string), c.(map[string]any)["expression"].(string)
		out[name] = expr
		if name == "service-controller-enabled" {
			m := listMembership.FindStringSubmatch(expr)
			g.Expect(m).NotTo(BeNil(), "the condition is not of the form \"value\" in [...]: %s", expr)
			out[name] = map[bool]string{true: "true", false: "false"}[slices.Contains(strings.Split(strings.Trim(m[2], `"`), `", "`), m[1])]
		}
	}
	return out
}

// clusterctl refuses to render either components file without VITISTACK_IPAM_API_URL,
// naming it: no install registers in an IPAM-API it was not told of.
func TestClusterctlRequiresTheIPAMAPIURL(t *testing.T) {
	for _, file := range []string{"ipam-components.yaml", "ipam-components-workload.yaml"} {
		_, err := clusterctl(t, file, nil)
		NewWithT(t).Expect(err).To(MatchError(ContainSubstring("value for variables [VITISTACK_IPAM_API_URL] is not set")), file)
	}
}

// VITISTACK_SERVICES turns the management install's Service controller on (false by
// default; any value the manager's boolean flag reads as true), keeping its default
// secret in the provider's namespace, and with it the Service webhook's calls (its
// configuration is always there, with a condition that is true exactly when the
// controller is on). The workload install serves Services whatever the variable.
func TestClusterctlServicesSwitch(t *testing.T) {
	const url = "https://ipam-api.example.org"
	for _, c := range []struct {
		file, services string
		on             bool
	}{
		{"ipam-components.yaml", "", false},
		{"ipam-components.yaml", "false", false},
		{"ipam-components.yaml", "true", true},
		{"ipam-components.yaml", "1", true},
		{"ipam-components.yaml", "True", true},
		{"ipam-components-workload.yaml", "", true},
		{"ipam-components-workload.yaml", "false", true},
	} {
		g := NewWithT(t)
		what := c.file + " with VITISTACK_SERVICES=" + c.services
		vars := map[string]string{"VITISTACK_IPAM_API_URL": url}
		if c.services != "" {
			vars["VITISTACK_SERVICES"] = c.services
		}
		out, err := clusterctl(t, c.file, vars)
		g.Expect(err).NotTo(HaveOccurred(), what)
		in := installedOf(g, objects(t, out))
		g.Expect(in.args).To(ContainElement("--ipam-api-url="+url), what)
		g.Expect(in.serviceHook).NotTo(BeNil(), "%s: no Service webhook", what)
		g.Expect(in.serviceHook["failurePolicy"]).To(Equal("Fail"), what)
		var service []string
		for _, a := range in.args {
			if strings.HasPrefix(a, "--enable-service-controller") {
				service = append(service, a)
			}
		}
		conds := conditions(g, in.serviceHook)
		if c.file == "ipam-components-workload.yaml" {
			g.Expect(service).To(Equal([]string{"--enable-service-controller"}), what)
			g.Expect(conds).NotTo(HaveKey("service-controller-enabled"), what)
			continue
		}
		want := "false"
		if c.services != "" {
			want = c.services
		}
		g.Expect(service).To(Equal([]string{"--enable-service-controller=" + want}), what)
		g.Expect(in.args).To(ContainElement("--default-secret-namespace=capi-ipam-vitistack-system"), what)
		g.Expect(conds).To(HaveKeyWithValue("service-controller-enabled", map[bool]string{true: "true", false: "false"}[c.on]), what)
		g.Expect(conds).To(HaveKey("type-loadbalancer"), what)
	}
}
