package observability

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// notIPAMAPIErrors is every request outcome that VitistackIPAMAPIErrors does not count
// as the IPAM-API failing, and why: with the outcomes its expression names, every
// outcome the code emits (ipamapi.Outcomes), no more.
var notIPAMAPIErrors = map[string]string{
	"success":          "an answer that carried the request out",
	"validation":       "a request the user must change: the claim's or pool's Ready condition says what",
	"no_prefixes":      "the zone has no container of the family: the pool's Ready condition says so",
	"not_held":         "a release of what is already free, which is a release's success",
	"wrong_secret":     "an address held under another secret: the claim's AddressTaken",
	"not_in_zone":      "a requested address outside the zone: the claim's AddressNotInZone",
	"exhausted":        "a full zone: claims wait with PoolExhausted, and VitistackIPAMClaimWaiting fires",
	"rotation_refused": "a Secret rotation the IPAM-API refuses: the claim's condition and event say so",
}

// The label values the alert rules, their promtool tests, the dashboard and the metrics
// page name are values the code emits, and the IPAM-API error alert counts every
// outcome but those listed above: an outcome renamed or added in the code cannot make
// an alert stop firing, or never fire, unseen.
func TestAlertLabelValuesAreWhatTheCodeEmits(t *testing.T) {
	texts := map[string]string{}
	for _, f := range []string{"config/observability/prometheusrule.yaml", "config/observability/dashboard.json",
		"test/observability/rules_test.yaml", "docs/metrics.md"} {
		b, err := os.ReadFile(filepath.Join(repoRoot(), f))
		if err != nil {
			t.Fatal(err)
		}
		texts[f] = string(b)
	}
	errorsAlert := alertExpr(t, texts["config/observability/prometheusrule.yaml"], "VitistackIPAMAPIErrors")
	for _, p := range labelProblems(texts, errorsAlert) {
		t.Error(p)
	}

	// Planted: a value the code does not emit, an outcome the error alert forgets, and one
	// both counted and excused.
	planted := map[string]string{"rules.yaml": `rate(vitistack_ipam_api_requests_total{operation="relase", outcome=~"transient|backend_failure"}[5m])`}
	got := labelProblems(planted, `rate(x{outcome=~"transient|backend_failing|success"}[5m])`)
	want := []string{
		`rules.yaml names operation "relase", which the code never emits (it emits [register release rotate probe])`,
		`rules.yaml names outcome "backend_failure", which the code never emits (it emits ` + fmt.Sprint(ipamapi.Outcomes()) + `)`,
		`VitistackIPAMAPIErrors counts outcome "success", which is listed as not an IPAM-API error`,
		`VitistackIPAMAPIErrors does not count outcome "unexpected_response", and it is not listed as not an IPAM-API error`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("the check on planted values found\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// labelMatcher is a matcher of the outcome or operation label, in PromQL as it stands in
// YAML, in JSON (quotes escaped) or in a Markdown table (| escaped).
var labelMatcher = regexp.MustCompile(`\b(outcome|operation)\s*(=~|!~|!=|=)\s*\\?"((?:[^"\\]|\\\|)*)\\?"`)

// labelProblems checks the label values every text names against the code's, and the
// outcomes errorsAlert (the IPAM-API error alert's expression) counts against
// notIPAMAPIErrors.
func labelProblems(texts map[string]string, errorsAlert string) []string {
	emitted := map[string][]string{"outcome": ipamapi.Outcomes()}
	for _, op := range ipamapi.Operations {
		emitted["operation"] = append(emitted["operation"], string(op))
	}
	var problems []string
	names := make([]string, 0, len(texts))
	for name := range texts {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for _, m := range labelMatcher.FindAllStringSubmatch(texts[name], -1) {
			for _, v := range values(m[3]) {
				if !slices.Contains(emitted[m[1]], v) {
					problems = append(problems, fmt.Sprintf("%s names %s %q, which the code never emits (it emits %v)", name, m[1], v, emitted[m[1]]))
				}
			}
		}
	}
	var counted []string
	for _, m := range labelMatcher.FindAllStringSubmatch(errorsAlert, -1) {
		if m[1] == "outcome" && m[2] == "=~" {
			counted = append(counted, values(m[3])...)
		}
	}
	for _, o := range emitted["outcome"] {
		_, excused := notIPAMAPIErrors[o]
		switch c := slices.Contains(counted, o); {
		case c && excused:
			problems = append(problems, fmt.Sprintf("VitistackIPAMAPIErrors counts outcome %q, which is listed as not an IPAM-API error", o))
		case !c && !excused:
			problems = append(problems, fmt.Sprintf("VitistackIPAMAPIErrors does not count outcome %q, and it is not listed as not an IPAM-API error", o))
		}
	}
	return problems
}

// values splits a matcher's value ("a|b", or `a\|b` in Markdown) into its alternatives.
func values(v string) []string {
	return strings.Split(strings.ReplaceAll(v, `\|`, "|"), "|")
}

// alertExpr returns the expression of the named alert of a PrometheusRule.
func alertExpr(t *testing.T, raw, alert string) string {
	t.Helper()
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert, Expr string
				}
			}
		}
	}
	if err := yaml.Unmarshal([]byte(raw), &rule); err != nil {
		t.Fatal(err)
	}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == alert {
				return r.Expr
			}
		}
	}
	t.Fatalf("the PrometheusRule has no alert %s", alert)
	return ""
}
