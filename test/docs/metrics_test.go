package docs

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/metrics"
)

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

// docs/metrics.md has a row for every metric the provider exports, and names no other
// vitistack_ipam_* metric anywhere in the docs.
func TestMetricsPageNamesEveryMetric(t *testing.T) {
	root := repoRoot(t)
	exported := exportedMetrics()
	checkPage(t, filepath.Join(root, "docs", "metrics.md"), exported, 10, func(code map[string]bool, page string) []string {
		documented := map[string]bool{}
		for name := range firstColumn(page, "") {
			if strings.HasPrefix(name, "vitistack_ipam_") {
				documented[name] = true
			}
		}
		return differences(code, documented, "docs/metrics.md has no row for %s, which the provider exports",
			"docs/metrics.md names %s, which the provider does not export")
	})
	named := regexp.MustCompile(`vitistack_ipam_[a-z_]+`)
	eachMarkdown(t, root, func(f, text string) {
		for _, n := range named.FindAllString(text, -1) {
			if !exported[family(n)] {
				t.Errorf("%s names %s, which the provider does not export", f, n)
			}
		}
	})
}

// exportedMetrics is the name of every metric the provider's collectors describe.
func exportedMetrics() map[string]bool {
	ch := make(chan *prometheus.Desc, 64)
	for _, c := range metrics.Collectors {
		c.Describe(ch)
	}
	close(ch)
	names := map[string]bool{}
	for d := range ch {
		if m := fqNameRE.FindStringSubmatch(d.String()); m != nil {
			names[m[1]] = true
		}
	}
	return names
}

// Every alert of config/observability/prometheusrule.yaml has its runbook in
// docs/metrics.md (a section named after it, which its annotations link to), and every
// metric its expressions name is one the provider exports.
func TestEveryAlertHasARunbook(t *testing.T) {
	root := repoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "config", "observability", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert       string            `json:"alert"`
					Expr        string            `json:"expr"`
					Annotations map[string]string `json:"annotations"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(root, "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics()
	named := regexp.MustCompile(`vitistack_ipam_[a-z_]+`)
	alerts := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts++
			if !strings.Contains(string(page), "\n### "+r.Alert+"\n") {
				t.Errorf("docs/metrics.md has no runbook (### %s) for the alert %s", r.Alert, r.Alert)
			}
			if link := "docs/metrics.md#" + strings.ToLower(r.Alert); !strings.Contains(r.Annotations["description"], link) {
				t.Errorf("the alert %s does not link its runbook %s", r.Alert, link)
			}
			for _, n := range named.FindAllString(r.Expr, -1) {
				if !exported[family(n)] {
					t.Errorf("the alert %s names %s, which the provider does not export", r.Alert, n)
				}
			}
		}
	}
	if alerts < 6 {
		t.Errorf("found %d alerts in config/observability/prometheusrule.yaml, want at least 6", alerts)
	}
}

// Every query of the Grafana dashboard in config/observability names only metrics the
// provider exports, and every panel has one.
func TestDashboardNamesOnlyExportedMetrics(t *testing.T) {
	dash := readDashboard(t, repoRoot(t))
	exported := exportedMetrics()
	named := regexp.MustCompile(`vitistack_ipam_[a-z_]+`)
	check := func(where, expr string) {
		names := named.FindAllString(expr, -1)
		if len(names) == 0 {
			t.Errorf("%s: %q names no metric of the provider", where, expr)
		}
		for _, n := range names {
			if !exported[family(n)] {
				t.Errorf("%s names %s, which the provider does not export", where, n)
			}
		}
	}
	panels := 0
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		panels++
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			check("panel "+strconv.Quote(p.Title), q.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok && strings.HasPrefix(q, "label_values(") {
			check("variable query", q)
		}
	}
	if panels < 8 {
		t.Errorf("the dashboard has %d panels, want the requests, claims and pools (at least 8)", panels)
	}
}

// family is the metric a series name belongs to: a histogram's _bucket, _count and
// _sum series belong to the histogram.
func family(series string) string {
	for _, suffix := range []string{"_bucket", "_count", "_sum"} {
		if f, ok := strings.CutSuffix(series, suffix); ok {
			return f
		}
	}
	return series
}

// dashboard is what the tests read of the Grafana dashboard: its panels' queries and its
// variables' queries.
type dashboard struct {
	Panels []struct {
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Query any `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// readDashboard reads config/observability/dashboard.json.
func readDashboard(t *testing.T, root string) dashboard {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "config", "observability", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash dashboard
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("config/observability/dashboard.json: %v", err)
	}
	return dash
}
