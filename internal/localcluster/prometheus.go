package localcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/pkg/errors"
	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// Prometheus is a Prometheus server scraping processes on loopback.
type Prometheus struct {
	*Process
	// URL is its HTTP API's base URL.
	URL string
	api promv1.API
}

// StartPrometheus starts a Prometheus server that scrapes each target (host:port,
// /metrics over plain HTTP) every second and evaluates the rules (a Prometheus rules
// file, nil for none) every second.
func StartPrometheus(dir string, p Paths, rules []byte, targets ...string) (*Prometheus, error) {
	if _, err := os.Stat(p.Prometheus); err != nil {
		return nil, errors.Errorf("the Prometheus server %q is missing (E2E_PROMETHEUS): run 'make test-e2e', which builds it", p.Prometheus)
	}
	dir = filepath.Join(dir, "prometheus")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	config := "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
	if rules != nil {
		if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
			return nil, err
		}
		config += "rule_files: [rules.yaml]\n"
	}
	config += "scrape_configs:\n  - job_name: vitistack-ipam\n    static_configs:\n      - targets:\n"
	for _, t := range targets {
		config += fmt.Sprintf("          - %q\n", t)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yaml"), []byte(config), 0o600); err != nil {
		return nil, err
	}
	var prom *Prometheus
	err := onFreePorts(1, func(ports []int) error {
		proc, err := startProcess(dir, "prometheus", nil, nil, p.Prometheus,
			"--config.file="+filepath.Join(dir, "prometheus.yaml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
			"--web.listen-address="+hostPort(ports[0]), "--log.level=warn")
		if err != nil {
			return err
		}
		client, err := api.NewClient(api.Config{Address: httpURL(ports[0])})
		if err != nil {
			proc.Stop()
			return err
		}
		prom = &Prometheus{Process: proc, URL: httpURL(ports[0]), api: promv1.NewAPI(client)}
		if err := waitFor(proc, time.Minute, "readiness", func() error { return httpOK(context.Background(), prom.URL+"/-/ready") }); err != nil {
			proc.Stop()
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return prom, nil
}

// Query evaluates expr now and returns the sum of its samples, and how many there are.
func (p *Prometheus) Query(ctx context.Context, expr string) (sum float64, samples int, err error) {
	v, _, err := p.api.Query(ctx, expr, time.Now())
	if err != nil {
		return 0, 0, errors.Wrapf(err, "query %s", expr)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return 0, 0, errors.Errorf("query %s: a %s, not a vector", expr, v.Type())
	}
	for _, s := range vec {
		sum += float64(s.Value)
	}
	return sum, len(vec), nil
}

// Firing returns the labels of the alerts named name that are firing now.
func (p *Prometheus) Firing(ctx context.Context, name string) ([]model.LabelSet, error) {
	res, err := p.api.Alerts(ctx)
	if err != nil {
		return nil, errors.Wrap(err, "listing alerts")
	}
	var out []model.LabelSet
	for _, a := range res.Alerts {
		if a.State == promv1.AlertStateFiring && string(a.Labels[model.AlertNameLabel]) == name {
			out = append(out, a.Labels)
		}
	}
	return out, nil
}
