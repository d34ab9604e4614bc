package docs

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/metrics"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// emission is what the provider's metrics can carry, read from the code: the labels of
// each metric, and every value of the labels whose values the code enumerates.
type emission struct {
	// labels are the label names of each metric family (a histogram's with le).
	labels map[string]map[string]bool
	// values are the values each enumerated label can take.
	values map[string]map[string]bool
}

// freeLabels are labels whose values come from the cluster or the flags (an IPAM-API
// host, a pool's name, namespace or zone, a bucket's bound), not from the code: any value
// is one the provider may emit.
var freeLabels = map[string]bool{"host": true, "pool": true, "pool_namespace": true, "zone": true, "le": true}

// targetLabels are the labels Prometheus adds to every series it scrapes (the Prometheus
// Operator's ServiceMonitor and PodMonitor add these): rules_test.yaml's input series may
// carry them.
var targetLabels = map[string]bool{"job": true, "instance": true, "namespace": true, "pod": true, "service": true,
	"endpoint": true, "container": true}

var (
	descRE = regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	// The literals internal/metrics/state.go gives the state, reason and mode labels.
	stateLiteralRE  = regexp.MustCompile(`\bstate\s*(?::|=)\s*"(\w+)"`)
	reasonLiteralRE = regexp.MustCompile(`\breason\s*(?::|=)\s*"(\w+)"`)
	modeLiteralRE   = regexp.MustCompile(`\bmode\s*(?::=|=)\s*"(\w+)"`)
)

// emitted reads what the provider's metrics can carry from the code: the collectors'
// descriptions; operation from ipamapi's Op constants; outcome from ipamapi.Outcome of
// every error class and of success; state, mode and the reason None from the literals
// of internal/metrics/state.go; reason from the claim Ready reasons (ClaimReady*Reason
// in api/v1alpha1/conditions.go and Cluster API's); pool_kind and ip_family from the API.
func emitted(t *testing.T, root string) emission {
	t.Helper()
	e := emission{labels: map[string]map[string]bool{}, values: map[string]map[string]bool{}}
	for _, c := range metrics.Collectors {
		ch := make(chan *prometheus.Desc, 64)
		c.Describe(ch)
		close(ch)
		_, histogram := c.(*prometheus.HistogramVec)
		for d := range ch {
			m := descRE.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read the description %s", d)
			}
			labels := map[string]bool{}
			for _, l := range strings.Split(m[2], ",") {
				if l != "" {
					labels[l] = true
				}
			}
			if histogram {
				labels["le"] = true
			}
			e.labels[m[1]] = labels
		}
	}
	add := func(label string, vs ...string) {
		if e.values[label] == nil {
			e.values[label] = map[string]bool{}
		}
		for _, v := range vs {
			e.values[label][v] = true
		}
	}
	for name, v := range stringConstants(t, filepath.Join(root, "pkg", "ipamapi", "operation.go")) {
		if strings.HasPrefix(name, "Op") {
			add("operation", v)
		}
	}
	add("outcome", ipamapi.Outcome(nil))
	for name, v := range stringConstants(t, filepath.Join(root, "pkg", "ipamapi", "errors.go")) {
		if strings.HasPrefix(name, "Class") {
			add("outcome", ipamapi.Outcome(&ipamapi.Error{Class: ipamapi.Class(v)}))
		}
	}
	state, err := os.ReadFile(filepath.Join(root, "internal", "metrics", "state.go"))
	if err != nil {
		t.Fatal(err)
	}
	for label, re := range map[string]*regexp.Regexp{"state": stateLiteralRE, "reason": reasonLiteralRE, "mode": modeLiteralRE} {
		for _, m := range re.FindAllStringSubmatch(string(state), -1) {
			add(label, m[1])
		}
	}
	for name, v := range stringConstants(t, filepath.Join(root, "api", "v1alpha1", "conditions.go")) {
		if strings.HasPrefix(name, "ClaimReady") && strings.HasSuffix(name, "Reason") {
			add("reason", v)
		}
	}
	for _, v := range capiReasons {
		add("reason", v)
	}
	add("pool_kind", ipamv1alpha1.VitistackIPPoolKind, ipamv1alpha1.GlobalVitistackIPPoolKind)
	add("ip_family", string(ipamv1alpha1.IPv4), string(ipamv1alpha1.IPv6))

	// The parsers saw enough, and every label is known.
	for label, least := range map[string]int{"operation": 4, "outcome": 10, "state": 3, "mode": 2, "reason": 20} {
		if len(e.values[label]) < least {
			t.Fatalf("found %d values of %s in the code (%v), want at least %d: the parser sees too little", len(e.values[label]),
				label, slices.Sorted(maps.Keys(e.values[label])), least)
		}
	}
	if len(e.labels) < 8 {
		t.Fatalf("found %d metrics, want at least 8", len(e.labels))
	}
	for metric, labels := range e.labels {
		for l := range labels {
			if e.values[l] == nil && !freeLabels[l] {
				t.Errorf("%s has the label %s, whose values this test does not know: read them from the code in emitted, "+
					"or add the label to freeLabels if its values come from the cluster", metric, l)
			}
		}
	}
	return e
}

// allLabels is every label of every metric of the provider.
func (e emission) allLabels() map[string]bool {
	all := map[string]bool{}
	for _, labels := range e.labels {
		for l := range labels {
			all[l] = true
		}
	}
	return all
}

var (
	selectorRE = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)?\{([^{}]*)\}`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
	groupingRE = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)`)
	labelValRE = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_]\w*)\s*\)`)
	providerRE = regexp.MustCompile(`vitistack_ipam_[a-z_]+`)
	// A regular expression's metacharacters, but |: a matcher's value that has one is
	// more than a list of values.
	regexMeta = regexp.MustCompile(`[.*+?()\[\]{}^$\\]`)
)

// promQL reports what expr names that the provider does not emit: a metric; a label of a
// metric it selects, or grouped by, that no metric of the provider has (extra labels
// aside); a value of an enumerated label that the code never gives it. A placeholder
// value ("…", a Grafana $variable, <name>) stands for any value.
func (e emission) promQL(where, expr string, extra map[string]bool) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, where+": "+fmt.Sprintf(format, args...)) }
	for _, n := range providerRE.FindAllString(expr, -1) {
		if e.labels[family(n)] == nil {
			add("%s is no metric of the provider", n)
		}
	}
	all := e.allLabels()
	for _, m := range selectorRE.FindAllStringSubmatch(expr, -1) {
		metric, body := family(m[1]), m[2]
		labels, ok := e.labels[metric]
		if !ok {
			if !strings.HasPrefix(metric, "vitistack_ipam_") {
				continue // another's metric: its labels are not the provider's to check
			}
			labels = map[string]bool{}
		}
		if rest := strings.Trim(matcherRE.ReplaceAllString(body, ""), ", \t\n"); strings.Trim(rest, ",") != "" {
			add("cannot read the selector {%s}", body)
		}
		for _, mm := range matcherRE.FindAllStringSubmatch(body, -1) {
			label, op, value := mm[1], mm[2], mm[3]
			if !labels[label] && !extra[label] {
				add("%s has no label %s", metric, label)
				continue
			}
			values := e.values[label]
			if values == nil {
				continue
			}
			alternatives := []string{value}
			if op == "=~" || op == "!~" {
				alternatives = strings.Split(value, "|")
			}
			for _, v := range alternatives {
				switch {
				case isPlaceholder(v):
				case (op == "=~" || op == "!~") && regexMeta.MatchString(v):
					add("%s%s%q: cannot check a regular expression, list the values", label, op, value)
				case !values[v]:
					add("%s=%q: the provider never sets %s to %s (it sets %s)", label, v, label, v,
						strings.Join(slices.Sorted(maps.Keys(values)), ", "))
				}
			}
		}
	}
	for _, m := range groupingRE.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[2], ",") {
			if l = strings.TrimSpace(l); l != "" && !all[l] && !extra[l] {
				add("%s (%s): no metric of the provider has the label %s", m[1], m[2], l)
			}
		}
	}
	for _, m := range labelValRE.FindAllStringSubmatch(expr, -1) {
		if labels := e.labels[family(m[1])]; labels != nil && !labels[m[2]] {
			add("label_values(%s, %s): %s has no label %s", m[1], m[2], m[1], m[2])
		}
	}
	return problems
}

// isPlaceholder is a value that stands for what the reader fills in.
func isPlaceholder(v string) bool {
	return v == "…" || strings.HasPrefix(v, "$") || strings.HasPrefix(v, "<") && strings.HasSuffix(v, ">")
}
