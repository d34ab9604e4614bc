package observability

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"sigs.k8s.io/yaml"
)

// repoRoot is the repository's root, two directories up from this file.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// promtool is the pinned promtool: PROMTOOL, else bin/promtool (make test builds it).
func promtool(t *testing.T) string {
	t.Helper()
	p := os.Getenv("PROMTOOL")
	if p == "" {
		p = filepath.Join(repoRoot(), "bin", "promtool")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("promtool not found at %s (make promtool builds it): %v", p, err)
	}
	return p
}

// The PrometheusRule's rules pass promtool's own checks and every unit test of
// rules_test.yaml: each alert fires when it should, with its labels and annotations,
// and not before or below its threshold.
func TestAlertRules(t *testing.T) {
	bin := promtool(t)
	raw, err := os.ReadFile(filepath.Join(repoRoot(), "config", "observability", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Kind string         `json:"kind"`
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		t.Fatal(err)
	}
	if rule.Kind != "PrometheusRule" || rule.Spec["groups"] == nil {
		t.Fatalf("config/observability/prometheusrule.yaml is not a PrometheusRule with groups: kind %q", rule.Kind)
	}
	rules, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{"rules.yaml": rules, "rules_test.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "rules_test.yaml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
