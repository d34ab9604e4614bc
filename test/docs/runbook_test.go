package docs

import (
	"cmp"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/yaml"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
)

// The alert rules, their promtool tests, the dashboard and docs/metrics.md name only
// metrics, labels and label values the provider emits: every selector's labels are the
// metric's, every value of an enumerated label (operation, outcome, state, reason, mode,
// pool_kind, ip_family) is one the code gives it, and every label grouped by is one of
// the provider's metrics has.
func TestObservabilityNamesWhatTheCodeEmits(t *testing.T) {
	root := repoRoot(t)
	e := emitted(t, root)
	var problems []string
	exprs := 0
	check := func(where, expr string, extra map[string]bool) {
		exprs++
		problems = append(problems, e.promQL(where, expr, extra)...)
	}

	rules := readRules(t, root)
	for _, r := range rules {
		check("config/observability/prometheusrule.yaml, alert "+r.Alert, r.Expr, nil)
		all := e.allLabels()
		for _, text := range r.Annotations {
			for _, m := range regexp.MustCompile(`\$labels\.(\w+)`).FindAllStringSubmatch(text, -1) {
				if !all[m[1]] {
					problems = append(problems, fmt.Sprintf("the alert %s's annotations name $labels.%s, a label no metric of the provider has", r.Alert, m[1]))
				}
			}
		}
	}

	raw, err := os.ReadFile(filepath.Join(root, "test", "observability", "rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var promtool struct {
		Tests []struct {
			InputSeries []struct {
				Series string `json:"series"`
			} `json:"input_series"`
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []struct {
					ExpLabels map[string]string `json:"exp_labels"`
				} `json:"exp_alerts"`
			} `json:"alert_rule_test"`
			PromQLExprTest []struct {
				Expr string `json:"expr"`
			} `json:"promql_expr_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(raw, &promtool); err != nil {
		t.Fatal(err)
	}
	for _, tc := range promtool.Tests {
		for _, s := range tc.InputSeries {
			check("test/observability/rules_test.yaml, input series", s.Series, targetLabels)
		}
		for _, q := range tc.PromQLExprTest {
			check("test/observability/rules_test.yaml, promql_expr_test", q.Expr, targetLabels)
		}
		// An alert's labels are its rule's (severity) and those of its expression's series.
		all := e.allLabels()
		for _, a := range tc.AlertRuleTest {
			for _, x := range a.ExpAlerts {
				exprs++
				for k, v := range x.ExpLabels {
					switch {
					case k == "severity":
					case !all[k]:
						problems = append(problems, fmt.Sprintf("test/observability/rules_test.yaml: the alert %s is expected with the label %s, "+
							"which no metric of the provider has", a.Alertname, k))
					case e.values[k] != nil && !e.values[k][v]:
						problems = append(problems, fmt.Sprintf("test/observability/rules_test.yaml: the alert %s is expected with %s=%q, "+
							"which the provider never sets", a.Alertname, k, v))
					}
				}
			}
		}
	}

	dash := readDashboard(t, root)
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			check("config/observability/dashboard.json, panel "+p.Title, q.Expr, nil)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok {
			check("config/observability/dashboard.json, variable", q, nil)
		}
	}

	for _, s := range promQLSpans(t, root) {
		check(s.where, s.expr, nil)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if exprs < 40 {
		t.Errorf("checked %d expressions, want at least 40: the readers see too little", exprs)
	}
}

// The enumerated values of the provider's metrics are each named on docs/metrics.md, and
// every word it writes as code in lower case is one the code has (a metric, a label, a
// value) or kubectl's (a verb, a resource): a new outcome or state gets documented, a gone
// one leaves the page.
func TestMetricsPageNamesEveryLabelValue(t *testing.T) {
	root := repoRoot(t)
	e := emitted(t, root)
	spans := pageSpans(t, root)
	for _, label := range []string{"operation", "outcome", "state", "mode"} {
		for v := range e.values[label] {
			if !spans[v] {
				t.Errorf("docs/metrics.md does not name `%s`, a value of %s", v, label)
			}
		}
	}
	known := map[string]bool{"max": true} // the PromQL aggregation the alerts use
	// kubectl's verbs, and the resources it reads
	for v := range ReadOnlyVerbs {
		known[v] = true
	}
	for r := range runbookResources(t, root) {
		plural, _, _ := strings.Cut(r, ".")
		known[plural] = true
	}
	for l := range e.allLabels() {
		known[l] = true
	}
	for m := range e.labels {
		known[m] = true
	}
	for label, values := range e.values {
		if label != "reason" && label != "pool_kind" {
			for v := range values {
				known[v] = true
			}
		}
	}
	lower := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	for s := range spans {
		if lower.MatchString(s) && !known[s] {
			t.Errorf("docs/metrics.md names `%s`, which is no metric, label or label value of the provider", s)
		}
	}
}

// The words docs/metrics.md writes as code in CamelCase, and those of the alerts'
// annotations, are reasons the provider sets (on a condition or an event), condition
// types and statuses, kinds or alerts; every reason a runbook's command selects events by
// is one the provider sets; every column a runbook names in capitals is one its commands
// print.
func TestRunbooksNameReasonsTheProviderSets(t *testing.T) {
	root := repoRoot(t)
	vocabulary := map[string]bool{"True": true, "False": true, "Unknown": true, // condition statuses
		// the kinds the page may name: the provider's, Cluster API's, Kubernetes' and the Prometheus Operator's
		ipamv1alpha1.VitistackIPPoolKind: true, ipamv1alpha1.GlobalVitistackIPPoolKind: true, "IPAddress": true,
		"IPAddressClaim": true, "Cluster": true, "Service": true, "Secret": true, "Event": true, "PrometheusRule": true}
	reasons := providerReasons(t, root)
	for r := range reasons {
		vocabulary[r] = true
	}
	vocabulary[ipamv1.IPAddressClaimReadyCondition] = true
	for name, v := range stringConstants(t, filepath.Join(root, "api", "v1alpha1", "conditions.go")) {
		if strings.HasSuffix(name, "Condition") {
			vocabulary[v] = true
		}
	}
	vocabulary["None"] = true // vitistack_ipam_claims' reason of a claim without one
	rules := readRules(t, root)
	for _, r := range rules {
		vocabulary[r.Alert] = true
	}

	camel := regexp.MustCompile(`^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*$`)
	for s := range pageSpans(t, root) {
		if camel.MatchString(s) && !vocabulary[s] {
			t.Errorf("docs/metrics.md names `%s`, which is no reason the provider sets, nor a condition, kind or alert", s)
		}
	}
	words := regexp.MustCompile(`\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b`)
	for _, r := range rules {
		for _, text := range r.Annotations {
			for _, w := range words.FindAllString(text, -1) {
				if !vocabulary[w] {
					t.Errorf("the alert %s's annotations name %s, which is no reason the provider sets, nor a condition, kind or alert", r.Alert, w)
				}
			}
		}
	}

	page := readPage(t, root)
	cmds, _ := RunbookCommands(page)
	columns := map[string]map[string]bool{} // by section
	for _, c := range cmds {
		args, err := c.Args(c.asWritten())
		if err != nil {
			continue // TestRunbookCommandsNameTheirResources reports it
		}
		for _, p := range fieldSelectorProblems(args, reasons) {
			t.Errorf("%s: %s", c, p)
		}
		if columns[c.Section] == nil {
			columns[c.Section] = map[string]bool{}
		}
		for _, col := range customColumns(args) {
			columns[c.Section][col] = true
		}
	}
	caps := regexp.MustCompile(`^[A-Z][A-Z_]+$`)
	for section, spans := range sectionSpans(page) {
		for _, s := range spans {
			if caps.MatchString(s) && !columns[section][s] {
				t.Errorf("docs/metrics.md (%s) names the column `%s`, which no command of the section prints", section, s)
			}
		}
	}
}

// Every command of the runbooks (a line of a ```sh block, see RunbookCommands) is read
// by RunbookCommands without a problem, and names a resource of the right API group: the
// provider's kinds and Cluster API's by plural.group (a bare ipaddresses is Kubernetes'
// own IPAddress since 1.33), Kubernetes' core ones by plural; its label selectors select
// labels the provider sets, a pool-kind by a kind.
func TestRunbookCommandsNameTheirResources(t *testing.T) {
	root := repoRoot(t)
	cmds, problems := RunbookCommands(readPage(t, root))
	for _, p := range problems {
		t.Error(p)
	}
	if len(cmds) < 10 {
		t.Errorf("found %d commands in docs/metrics.md's ```sh blocks, want at least 10", len(cmds))
	}
	resources := runbookResources(t, root)
	labels := map[string]bool{}
	for _, v := range stringConstants(t, filepath.Join(root, "api", "v1alpha1", "annotations.go")) {
		if strings.HasPrefix(v, "ipam.vitistack.io/") {
			labels[v] = true
		}
	}
	for _, c := range cmds {
		args, err := c.Args(c.asWritten())
		if err != nil {
			continue // RunbookCommands reported it
		}
		for _, p := range commandProblems(args, resources, labels) {
			t.Errorf("%s: %s", c, p)
		}
	}
}

// The checks of this file find what they are for.
func TestRunbookChecksFindMistakes(t *testing.T) {
	root := repoRoot(t)
	e := emitted(t, root)
	for expr, want := range map[string][]string{
		`vitistack_ipam_claims{state="waiting", reason="PoolExhausted"}`:                                                nil,
		`sum by (host) (rate(vitistack_ipam_api_requests_total{operation="release", outcome!~"success|not_held"}[5m]))`: nil,
		`vitistack_ipam_api_requests_total{host="…"}`:                                                                   nil,
		`vitistack_ipam_claims{reason="ReleaseFailed"}`:                                                                 nil,
		`vitistack_ipam_claims{reason="NotARealReason"}`:                                                                {`reason="NotARealReason": the provider never sets reason to NotARealReason`},
		`vitistack_ipam_claims{state="deleting"}`:                                                                       {`state="deleting": the provider never sets state to deleting`},
		`rate(vitistack_ipam_api_requests_total{outcome=~"transient|timeout"}[5m])`:                                     {`outcome="timeout": the provider never sets outcome to timeout`},
		`rate(vitistack_ipam_api_requests_total{outcome=~"trans.*"}[5m])`:                                               {`cannot check a regular expression`},
		`vitistack_ipam_pool_ready{zone="inet"}`:                                                                        {`vitistack_ipam_pool_ready has no label zone`},
		`sum by (pod_name) (vitistack_ipam_claims)`:                                                                     {`no metric of the provider has the label pod_name`},
		`vitistack_ipam_claim_waiting_seconds`:                                                                          {`vitistack_ipam_claim_waiting_seconds is no metric of the provider`},
	} {
		got := e.promQL("x", expr, nil)
		if len(got) != len(want) {
			t.Errorf("%s: problems %q, want %d like %q", expr, got, len(want), want)
			continue
		}
		for i := range want {
			if !strings.Contains(got[i], want[i]) {
				t.Errorf("%s: problem %q, want one with %q", expr, got[i], want[i])
			}
		}
	}

	cmds, problems := RunbookCommands("# M\n\n## Alerts\n\n### A\n\n- **Look at:** `kubectl get pods`, `curl -s http://x`,\n" +
		"  `sum by (reason) (vitistack_ipam_claims)`\n\n  ```sh\n  # a comment\n  kubectl get ipaddresses -A\n" +
		"  kubectl get ipaddressclaims.ipam.cluster.x-k8s.io -n <namespace> <claim> \\\n  kubectl delete secret x\n  ```\n\n" +
		"```promql\nup\n```\n\n```sh\nkubectl get events | grep x\n")
	wantProblems := []string{"`kubectl get pods` is a command outside a ```sh block", "`curl -s http://x` in the runbook A looks like a command",
		"continued on the next line", "not kubectl with a verb that only reads", `a code block of language "promql"`,
		`'|' outside quotes`, "a code block that is never closed"}
	if len(problems) != len(wantProblems) {
		t.Errorf("problems %q, want %d", problems, len(wantProblems))
	} else {
		for i := range wantProblems {
			if !strings.Contains(problems[i], wantProblems[i]) {
				t.Errorf("problem %q, want one with %q", problems[i], wantProblems[i])
			}
		}
	}
	if len(cmds) != 3 || cmds[0].Text != "kubectl get ipaddresses -A" || cmds[0].Section != "A" || cmds[0].Line != 12 {
		t.Errorf("commands %v, want 3, the first kubectl get ipaddresses -A of A on line 12", cmds)
	}
	args, err := Command{Text: `kubectl get x -n <namespace> -o custom-columns='A:.a,B:.b[?(@.type=="Ready")].c' -l "k=v"`}.Args(map[string]string{"namespace": "ns"})
	if want := []string{"kubectl", "get", "x", "-n", "ns", "-o", `custom-columns=A:.a,B:.b[?(@.type=="Ready")].c`, "-l", "k=v"}; err != nil || !slices.Equal(args, want) {
		t.Errorf("args %q, %v; want %q", args, err, want)
	}
	if _, err := (Command{Text: "kubectl describe x <pool>"}).Args(map[string]string{"namespace": "ns"}); err == nil || !strings.Contains(err.Error(), "unknown placeholder <pool>") {
		t.Errorf("an unknown placeholder: %v", err)
	}
	if _, err := (Command{Text: "kubectl get x --kubeconfig=/elsewhere"}).Args(nil); err == nil {
		t.Error("a command with its own kubeconfig is accepted")
	}

	resources := runbookResources(t, root)
	labels := map[string]bool{ipamv1alpha1.PoolNameLabel: true, ipamv1alpha1.PoolKindLabel: true}
	for cmd, want := range map[string]string{
		"kubectl get ipaddresses -A":                           "ipaddresses is not qualified",
		"kubectl get vip":                                      "vip is not qualified",
		"kubectl get ipaddresses.networking.k8s.io":            "ipaddresses.networking.k8s.io is no resource",
		"kubectl get -A ipaddressclaims.ipam.cluster.x-k8s.io": "the resource must follow the verb",
		"kubectl get vitistackippools.ipam.vitistack.io -l ipam.vitistack.io/pool-kind=Pool": "Pool is no kind of pool",
		"kubectl get events -l ipam.vitistack.io/pool=x":                                     "ipam.vitistack.io/pool is no label the provider sets",
		"kubectl get ipaddresses.ipam.cluster.x-k8s.io -l ipam.vitistack.io/pool-name=x":     "",
	} {
		args, err := Command{Text: cmd}.Args(nil)
		if err != nil {
			t.Fatal(err)
		}
		got := commandProblems(args, resources, labels)
		if want == "" && len(got) > 0 || want != "" && (len(got) != 1 || !strings.Contains(got[0], want)) {
			t.Errorf("%s: problems %q, want %q", cmd, got, want)
		}
	}
	args, _ = Command{Text: "kubectl get events -A --field-selector reason=ReleaseFailed,type=Warning"}.Args(nil)
	if got := fieldSelectorProblems(args, map[string]bool{"ReleaseFailed": true}); len(got) > 0 {
		t.Errorf("problems %q for a reason the provider sets", got)
	}
	if got := fieldSelectorProblems(args, map[string]bool{"Released": true}); len(got) != 1 {
		t.Errorf("problems %q for a reason the provider does not set, want one", got)
	}
}

type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	Annotations map[string]string `json:"annotations"`
}

// readRules is the alert rules of config/observability/prometheusrule.yaml.
func readRules(t *testing.T, root string) []rule {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "config", "observability", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Spec struct {
			Groups []struct {
				Rules []rule `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	var rules []rule
	for _, g := range r.Spec.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) < 6 {
		t.Fatalf("found %d rules in config/observability/prometheusrule.yaml, want at least 6", len(rules))
	}
	return rules
}

func readPage(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sectionSpans is the code spans of page outside code blocks, by the heading (## or ###)
// of their section, with a table's escaped \| turned back into |.
func sectionSpans(page string) map[string][]string {
	spans := map[string][]string{}
	section, fenced := "", false
	for _, line := range strings.Split(page, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "```"):
			fenced = !fenced
			continue
		case fenced:
			continue
		case strings.HasPrefix(line, "## "):
			section = strings.TrimSpace(line[3:])
		case strings.HasPrefix(line, "### "):
			section = strings.TrimSpace(line[4:])
		}
		for _, m := range codeSpanRE.FindAllStringSubmatch(line, -1) {
			spans[section] = append(spans[section], strings.ReplaceAll(m[1], `\|`, "|"))
		}
	}
	return spans
}

// pageSpans is every code span of docs/metrics.md outside code blocks.
func pageSpans(t *testing.T, root string) map[string]bool {
	t.Helper()
	all := map[string]bool{}
	for _, spans := range sectionSpans(readPage(t, root)) {
		for _, s := range spans {
			all[s] = true
		}
	}
	return all
}

type span struct{ where, expr string }

// promQLSpans is the PromQL of docs/metrics.md: its code spans that name a metric of the
// provider.
func promQLSpans(t *testing.T, root string) []span {
	t.Helper()
	var out []span
	for section, spans := range sectionSpans(readPage(t, root)) {
		for _, s := range spans {
			if strings.Contains(s, "vitistack_ipam_") {
				out = append(out, span{"docs/metrics.md (" + section + ")", s})
			}
		}
	}
	if len(out) < 15 {
		t.Fatalf("found %d PromQL spans in docs/metrics.md, want at least 15", len(out))
	}
	return out
}

// providerReasons is every reason the provider sets on a condition or an event: the
// constants of api/v1alpha1 ending in Reason, Cluster API's reasons the code uses, and
// event reasons written out in the code.
func providerReasons(t *testing.T, root string) map[string]bool {
	t.Helper()
	reasons := map[string]bool{}
	for name, v := range stringConstants(t, filepath.Join(root, "api", "v1alpha1", "conditions.go")) {
		if strings.HasSuffix(name, "Reason") {
			reasons[v] = true
		}
	}
	err := filepath.WalkDir(filepath.Join(root, "internal"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range capiReasonUse.FindAllStringSubmatch(string(b), -1) {
			v, ok := capiReasons[m[1]]
			if !ok {
				t.Errorf("%s sets Cluster API's %s: add it to capiReasons, and to docs/troubleshooting.md", p, m[1])
			}
			reasons[v] = true
		}
		for _, m := range literalEventReason.FindAllStringSubmatch(string(b), -1) {
			reasons[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(reasons) < 25 {
		t.Fatalf("found %d reasons in the code, want at least 25", len(reasons))
	}
	return reasons
}

// runbookResources are the names a runbook's command may give a resource, each with its
// API group: the provider's CRDs (config/crd/bases) and Cluster API's IPAM kinds by
// plural.group, Kubernetes' core kinds a runbook reads by plural. A bare custom resource
// is refused: its plural or short name may be another group's (ipaddresses is
// networking.k8s.io's IPAddress too, since Kubernetes 1.33).
func runbookResources(t *testing.T, root string) map[string]string {
	t.Helper()
	resources := map[string]string{"events": "", "secrets": "", "services": "", "namespaces": "",
		"ipaddresses." + ipamv1.GroupVersion.Group: ipamv1.GroupVersion.Group, "ipaddressclaims." + ipamv1.GroupVersion.Group: ipamv1.GroupVersion.Group}
	crds, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(crds) < 2 {
		t.Fatalf("the provider's CRDs: %v, %v", crds, err)
	}
	for _, f := range crds {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd struct {
			Spec struct {
				Group string `json:"group"`
				Names struct {
					Plural string `json:"plural"`
				} `json:"names"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			t.Fatal(err)
		}
		resources[crd.Spec.Names.Plural+"."+crd.Spec.Group] = crd.Spec.Group
	}
	return resources
}

// commandProblems reports what is wrong with the resource and the label selector of a
// runbook's command (args as Command.Args returns them).
func commandProblems(args []string, resources map[string]string, labels map[string]bool) []string {
	var problems []string
	resource := args[2]
	if strings.HasPrefix(resource, "-") {
		return []string{"the resource must follow the verb (" + args[1] + ")"}
	}
	if _, ok := resources[resource]; !ok {
		qualified := ""
		for r := range resources {
			if plural, _, _ := strings.Cut(r, "."); plural == resource && strings.Contains(r, ".") {
				qualified = r
			}
		}
		switch {
		case !strings.Contains(resource, "."):
			problems = append(problems, fmt.Sprintf("%s is not qualified by its API group (write %s): a bare name may be another "+
				"group's resource or short name, as ipaddresses is networking.k8s.io's IPAddress too", resource, cmp.Or(qualified, "plural.group")))
		default:
			problems = append(problems, fmt.Sprintf("%s is no resource of the provider, of Cluster API's IPAM or of Kubernetes' core "+
				"a runbook reads (%s)", resource, strings.Join(slices.Sorted(maps.Keys(resources)), ", ")))
		}
	}
	for _, selector := range flagValues(args, "-l", "--selector") {
		for _, term := range strings.Split(selector, ",") {
			key, value, _ := strings.Cut(strings.Replace(term, "!=", "=", 1), "=")
			value = strings.TrimPrefix(value, "=")
			if strings.HasPrefix(key, "ipam.vitistack.io/") && !labels[key] {
				problems = append(problems, key+" is no label the provider sets")
			}
			if key == ipamv1alpha1.PoolKindLabel && !isPlaceholder(value) && value != ipamv1alpha1.VitistackIPPoolKind && value != ipamv1alpha1.GlobalVitistackIPPoolKind {
				problems = append(problems, value+" is no kind of pool")
			}
		}
	}
	return problems
}

// fieldSelectorProblems reports a reason a command selects events by that the provider
// never sets.
func fieldSelectorProblems(args []string, reasons map[string]bool) []string {
	var problems []string
	for _, selector := range flagValues(args, "--field-selector") {
		for _, term := range strings.Split(selector, ",") {
			key, value, _ := strings.Cut(strings.Replace(term, "!=", "=", 1), "=")
			value = strings.TrimPrefix(value, "=")
			if key == "reason" && !reasons[value] {
				problems = append(problems, fmt.Sprintf("selects events by the reason %s, which the provider never sets", value))
			}
		}
	}
	return problems
}

// customColumns is the headings of a command's -o custom-columns=.
func customColumns(args []string) []string {
	var cols []string
	for _, o := range flagValues(args, "-o", "--output") {
		if spec, ok := strings.CutPrefix(o, "custom-columns="); ok {
			for _, c := range strings.Split(spec, ",") {
				heading, _, _ := strings.Cut(c, ":")
				cols = append(cols, heading)
			}
		}
	}
	return cols
}

// flagValues is the values of a flag (any of names) in args: "-l x" and "-l=x" alike.
func flagValues(args []string, names ...string) []string {
	var values []string
	for i, a := range args {
		for _, n := range names {
			if a == n && i+1 < len(args) {
				values = append(values, args[i+1])
			} else if v, ok := strings.CutPrefix(a, n+"="); ok {
				values = append(values, v)
			}
		}
	}
	return values
}
