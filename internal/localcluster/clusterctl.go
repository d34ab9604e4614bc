package localcluster

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/pkg/errors"
)

// Clusterctl runs clusterctl with c.ClusterctlConfig (the offline repository's), the version
// check off and its own config directory; vars are clusterctl variables (environment).
// Commands that talk to a cluster need "--kubeconfig", c.Kubeconfig in args.
func (c *ControlPlane) Clusterctl(ctx context.Context, vars map[string]string, args ...string) (string, error) {
	return c.clusterctl(ctx, vars, false, args...)
}

// GenerateYAML renders a template with `clusterctl generate yaml --from file` and vars;
// it returns only what clusterctl writes to stdout (the YAML).
func (c *ControlPlane) GenerateYAML(ctx context.Context, vars map[string]string, file string) (string, error) {
	return c.clusterctl(ctx, vars, true, "generate", "yaml", "--from", file)
}

func (c *ControlPlane) clusterctl(ctx context.Context, vars map[string]string, stdoutOnly bool, args ...string) (string, error) {
	args = append(args, "--config", c.ClusterctlConfig)
	cmd := exec.CommandContext(ctx, c.paths.Clusterctl, args...)
	home := filepath.Join(c.Dir, "clusterctl-home")
	// This process's environment without clusterctl variables of the provider (set in a
	// developer's shell, they would change what is installed), then vars.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "VITISTACK_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "CLUSTERCTL_DISABLE_VERSIONCHECK=true", "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"))
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		cmd.Env = append(cmd.Env, k+"="+vars[k])
	}
	// stdout and stderr are copied by two goroutines: both go through one lock.
	var stdout, all LockedBuffer
	cmd.Stdout, cmd.Stderr = io.MultiWriter(&stdout, &all), &all
	if err := cmd.Run(); err != nil {
		return all.String(), errors.Wrapf(err, "clusterctl %s:\n%s", strings.Join(args, " "), all.String())
	}
	if stdoutOnly {
		return stdout.String(), nil
	}
	return all.String(), nil
}

// Init runs `clusterctl init --ipam vitistack` (on a new cluster clusterctl also
// installs core Cluster API and the kubeadm providers) with vars, then removes the
// webhook configurations of the Cluster API providers and turns their CRDs' conversion
// webhooks off: their Deployments never run on a control plane without nodes, their
// admission webhooks would refuse every Cluster, and nothing would answer a conversion.
func (c *ControlPlane) Init(ctx context.Context, vars map[string]string) (string, error) {
	return c.InitVersion(ctx, vars, "")
}

// InitVersion is Init of the provider's release version ("v0.1.0"; empty: the
// repository's default, the build under test).
func (c *ControlPlane) InitVersion(ctx context.Context, vars map[string]string, version string) (string, error) {
	ipam := "vitistack"
	if version != "" {
		ipam += ":" + version
	}
	out, err := c.Clusterctl(ctx, vars, "init", "--ipam", ipam, "--kubeconfig", c.Kubeconfig)
	if err != nil {
		return out, err
	}
	if err := c.removeForeignWebhooks(ctx); err != nil {
		return out, err
	}
	if err := c.removeForeignConversions(ctx); err != nil {
		return out, err
	}
	// The garbage collector looks for new resource types only every 30 s: restart it so
	// that it follows owner references of the CRDs just installed at once.
	return out, c.restartControllerManager()
}

// Helm runs the pinned Helm (Paths.Helm) against the control plane with a home of its
// own (no user's repositories or plugins), and returns what it printed.
func (c *ControlPlane) Helm(args ...string) (string, error) {
	if c.paths.Helm == "" {
		return "", errors.New("E2E_HELM is not set: run through make, which builds bin/helm")
	}
	home, err := os.MkdirTemp("", "helm-home-")
	if err != nil {
		return "", errors.Wrap(err, "making Helm's home")
	}
	defer os.RemoveAll(home) //nolint:errcheck // a temporary directory
	cmd := exec.Command(c.paths.Helm, append(args, "--kubeconfig", c.Kubeconfig)...)
	cmd.Env = []string{"HOME=" + home, "XDG_CONFIG_HOME=" + home, "XDG_CACHE_HOME=" + home, "XDG_DATA_HOME=" + home, "PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// UseUpgradeRepository writes a clusterctl repository in c's folder that holds both the
// previous release (Paths.Previous) and the build under test, as a release repository
// does, and points c's clusterctl at it (core Cluster API and cert-manager from the
// suite's repository). It returns the previous release's version.
func (c *ControlPlane) UseUpgradeRepository() (string, error) {
	if c.paths.Previous == "" {
		return "", errors.New("E2E_PREVIOUS_RELEASE is not set: run through make, which builds bin/previous")
	}
	previous := filepath.Base(c.paths.Previous)
	repo := filepath.Join(c.Dir, "repository", "ipam-vitistack")
	for version, from := range map[string]string{
		previous:        c.paths.Previous,
		c.paths.Version: filepath.Join(c.paths.Repository, "ipam-vitistack", c.paths.Version),
	} {
		if err := os.MkdirAll(filepath.Join(repo, version), 0o700); err != nil {
			return "", err
		}
		for _, f := range []string{"ipam-components.yaml", "ipam-components-workload.yaml", "metadata.yaml"} {
			b, err := os.ReadFile(filepath.Join(from, f))
			if err != nil {
				return "", errors.Wrapf(err, "the release %s", version)
			}
			if err := os.WriteFile(filepath.Join(repo, version, f), b, 0o600); err != nil {
				return "", err
			}
		}
	}
	config, err := os.ReadFile(c.paths.ClusterctlConfig())
	if err != nil {
		return "", err
	}
	ours := "file://" + filepath.Join(c.paths.Repository, "ipam-vitistack", c.paths.Version, "ipam-components.yaml")
	if !strings.Contains(string(config), ours) {
		return "", errors.Errorf("%s does not name %s", c.paths.ClusterctlConfig(), ours)
	}
	config = []byte(strings.Replace(string(config), ours, "file://"+filepath.Join(repo, c.paths.Version, "ipam-components.yaml"), 1))
	c.ClusterctlConfig = filepath.Join(c.Dir, "repository", "clusterctl.yaml")
	return previous, os.WriteFile(c.ClusterctlConfig, config, 0o600)
}
