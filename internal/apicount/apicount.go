package apicount

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/rest"
)

// Key names one kind of request: the verb as the API server counts it (POST, PATCH,
// DELETE, GET, LIST, WATCH, …, upper case as in the metric) and the resource, with its
// subresource after a slash ("ipaddressclaims/status").
type Key struct {
	Verb     string
	Resource string
}

func (k Key) String() string { return k.Verb + " " + k.Resource }

// Counts is a reading of apiserver_request_total, summed over codes, groups, versions
// and scopes.
type Counts map[Key]float64

// Writes are the verbs that change state.
var Writes = []string{"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY"}

// Read scrapes the API server's /metrics with cfg (which must be allowed to GET it).
func Read(ctx context.Context, cfg *rest.Config) (Counts, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading the API server's /metrics: HTTP %d", resp.StatusCode)
	}
	return Parse(string(raw))
}

// Parse reads apiserver_request_total from a Prometheus text exposition.
func Parse(text string) (Counts, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("parsing the API server's metrics: %w", err)
	}
	out := Counts{}
	mf := families["apiserver_request_total"]
	if mf == nil {
		return out, nil
	}
	for _, m := range mf.GetMetric() {
		var k Key
		var sub string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "verb":
				k.Verb = l.GetValue()
			case "resource":
				k.Resource = l.GetValue()
			case "subresource":
				sub = l.GetValue()
			}
		}
		if sub != "" {
			k.Resource += "/" + sub
		}
		out[k] += m.GetCounter().GetValue()
	}
	return out, nil
}

// Since returns what was counted after before was read (c minus before).
func (c Counts) Since(before Counts) Counts {
	out := Counts{}
	for k, v := range c {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// Get is the count of one verb on one resource.
func (c Counts) Get(verb, resource string) float64 { return c[Key{verb, resource}] }

// Only keeps the keys keep accepts.
func (c Counts) Only(keep func(Key) bool) Counts {
	out := Counts{}
	for k, v := range c {
		if keep(k) {
			out[k] = v
		}
	}
	return out
}

// WritesOnly keeps the verbs in Writes.
func (c Counts) WritesOnly() Counts {
	return c.Only(func(k Key) bool {
		for _, w := range Writes {
			if k.Verb == w {
				return true
			}
		}
		return false
	})
}

// Total sums every count.
func (c Counts) Total() float64 {
	var t float64
	for _, v := range c {
		t += v
	}
	return t
}

// String lists the counts, largest first, one "VERB resource: n" per line.
func (c Counts) String() string {
	keys := make([]Key, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if c[keys[i]] != c[keys[j]] {
			return c[keys[i]] > c[keys[j]]
		}
		return keys[i].String() < keys[j].String()
	})
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s: %g\n", k, c[k])
	}
	return b.String()
}
