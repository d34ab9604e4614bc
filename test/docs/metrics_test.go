package docs

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

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
			if !exported[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count"), "_sum")] {
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
