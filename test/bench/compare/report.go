package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/apicount"
)

// row is one configuration's results over the repetitions.
type row struct {
	spec    runSpec
	ok      []*result
	failed  int
	ratios  []float64 // claims/s over the in-cluster provider's, per repetition
	p99s    []float64 // p99 over the in-cluster provider's, per repetition
	hasBase bool
}

// rows groups results by configuration, in the order they ran, and pairs each with the
// in-cluster run of the same repetition.
func rows(results []*result) []*row {
	byKey := map[string]*row{}
	var out []*row
	find := func(rep int, spec runSpec) *result {
		for _, r := range results {
			if r.rep == rep && r.spec.key() == spec.key() && r.err == nil {
				return r
			}
		}
		return nil
	}
	for _, r := range results {
		rw := byKey[r.spec.key()]
		if rw == nil {
			rw = &row{spec: r.spec}
			byKey[r.spec.key()] = rw
			out = append(out, rw)
		}
		if r.err != nil {
			rw.failed++
			continue
		}
		rw.ok = append(rw.ok, r)
		if base, ok := r.spec.baseline(); ok {
			rw.hasBase = true
			if b := find(r.rep, base); b != nil {
				rw.ratios = append(rw.ratios, r.claimsPerSec/b.claimsPerSec)
				rw.p99s = append(rw.p99s, float64(r.p99)/float64(max(b.p99, time.Microsecond)))
			}
		}
	}
	return out
}

// median of what f returns for each successful run.
func (rw *row) median(f func(r *result) float64) float64 {
	vs := make([]float64, 0, len(rw.ok))
	for _, r := range rw.ok {
		vs = append(vs, f(r))
	}
	return median(vs)
}

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	vs = slices.Clone(vs)
	slices.Sort(vs)
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}

// medianCounts is, per verb and resource, the median over the runs of counts(r)/per(r)
// (0 in a run without that key).
func (rw *row) medianCounts(counts func(r *result) apicount.Counts, per func(r *result) float64) apicount.Counts {
	keys := map[apicount.Key]bool{}
	for _, r := range rw.ok {
		for k := range counts(r) {
			keys[k] = true
		}
	}
	out := apicount.Counts{}
	for k := range keys {
		out[k] = rw.median(func(r *result) float64 { return counts(r)[k] / per(r) })
	}
	return out
}

// markdown renders the report.
func markdown(o *options, results []*result, took time.Duration, loadBefore string) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# vitistack vs in-cluster IPAM provider (v1.1.0)\n\n")
	p("%s, %d CPUs, %s/%s, Kubernetes %s, %d repetition(s), %d workers, quiet window %s; took %s. Load average before: %s, after: %s.\n\n",
		time.Now().Format("2006-01-02 15:04"), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, filepath.Base(o.assets),
		o.reps, o.workers, o.quiet, took.Round(time.Second), loadBefore, loadAverage())
	p("Every run on a fresh control plane. Medians over the repetitions; created/s is what the creating goroutines managed (N over first create to last create), an upper bound of claims/s (N over first create to last bound); × in-cluster is the median of the per-repetition ratios to the in-cluster provider with the same N, with their range in parentheses (claims/s: higher is better; p99: lower is better). ")
	p("Writes and Secret GETs are the provider's requests to the API server during the burst, per bound claim; IPAM-API calls are requests to the stand-in per claim. ")
	p("Peak RSS is VmHWM at the end of the burst, CPU the provider's user+system time during it. Quiet: writes and IPAM-API calls in the idle window after the burst. Lease writes (kube-apiserver's own) are left out.\n\n")

	p("| configuration | N | runs | created/s | claims/s | × in-cluster | p50 ms | p99 ms | p99 × in-cluster | writes/claim | Secret GETs/claim | IPAM-API calls/claim | peak RSS MiB | end RSS MiB | CPU s | delete-all s | quiet writes | quiet IPAM calls |\n")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	all := rows(results)
	for _, rw := range all {
		runs := fmt.Sprint(len(rw.ok))
		if rw.failed > 0 {
			runs += fmt.Sprintf(" (%d failed)", rw.failed)
		}
		if len(rw.ok) == 0 {
			p("| %s | %d | %s |%s\n", rw.spec.name(), rw.spec.n, runs, strings.Repeat(" – |", 14))
			continue
		}
		n := func(r *result) float64 { return float64(r.spec.n) }
		ratio := func(vs []float64) string {
			if !rw.hasBase || len(vs) == 0 {
				return "–"
			}
			if len(vs) == 1 {
				return fmt.Sprintf("%.2f", vs[0])
			}
			return fmt.Sprintf("%.2f (%.2f–%.2f)", median(vs), slices.Min(vs), slices.Max(vs))
		}
		sim := func(v float64) string {
			if rw.spec.provider != vitistack {
				return "–"
			}
			return fmt.Sprintf("%.2f", v)
		}
		quiet, quietCalls, del := "–", "–", "–"
		if rw.ok[0].quietRun {
			quiet = fmt.Sprintf("%.0f", rw.median(func(r *result) float64 { return r.quietWrites.Total() }))
			quietCalls = sim(rw.median(func(r *result) float64 { return float64(r.quietCalls) }))
		}
		if rw.ok[0].deleted {
			del = fmt.Sprintf("%.1f", rw.median(func(r *result) float64 { return r.deleteAll.Seconds() }))
		}
		p("| %s | %d | %s | %.1f | %.1f | %s | %.0f | %.0f | %s | %.2f | %.2f | %s | %.0f | %.0f | %.1f | %s | %s | %s |\n",
			rw.spec.name(), rw.spec.n, runs, rw.median(func(r *result) float64 { return r.createsPerSec }),
			rw.median(func(r *result) float64 { return r.claimsPerSec }), ratio(rw.ratios),
			rw.median(func(r *result) float64 { return msf(r.p50) }), rw.median(func(r *result) float64 { return msf(r.p99) }), ratio(rw.p99s),
			rw.median(func(r *result) float64 { return r.writes.Total() / n(r) }),
			rw.median(func(r *result) float64 { return r.secretGETs / n(r) }),
			sim(rw.median(func(r *result) float64 { return float64(r.ipamCalls) / n(r) })),
			rw.median(func(r *result) float64 { return mib(r.peakRSS) }), rw.median(func(r *result) float64 { return mib(r.endRSS) }),
			rw.median(func(r *result) float64 { return r.cpu.Seconds() }), del, quiet, quietCalls)
	}

	p("\n## Writes by verb and resource\n\nPer bound claim during the burst (medians), and in the quiet window (medians, absolute).\n\n")
	p("| configuration | N | writes per bound claim | quiet-window writes |\n|---|--:|---|---|\n")
	for _, rw := range all {
		if len(rw.ok) == 0 {
			continue
		}
		burst := rw.medianCounts(func(r *result) apicount.Counts { return r.writes }, func(r *result) float64 { return float64(r.spec.n) })
		quiet := "–"
		if rw.ok[0].quietRun {
			quiet = inline(rw.medianCounts(func(r *result) apicount.Counts { return r.quietWrites }, func(*result) float64 { return 1 }), "%.0f")
		}
		p("| %s | %d | %s | %s |\n", rw.spec.name(), rw.spec.n, inline(burst, "%.2f"), quiet)
	}

	p("\n## Control plane CPU, binding and deleting\n\nCPU seconds of each control plane process while all claims were bound, and while all were deleted (medians); " +
		"requests per claim while deleting, every client's.\n\n")
	p("| configuration | N | kube-apiserver s bind / delete | etcd s bind / delete | kube-controller-manager s bind / delete | requests per claim while deleting |\n|---|--:|--:|--:|--:|---|\n")
	for _, rw := range all {
		if len(rw.ok) == 0 || !rw.ok[0].deleted && !rw.spec.memoryOnly {
			continue
		}
		cells := make([]string, 0, len(controlPlaneComponents))
		for _, c := range controlPlaneComponents {
			del := "–" // the memory run deletes nothing
			if rw.ok[0].deleted {
				del = fmt.Sprintf("%.1f", rw.median(func(r *result) float64 { return r.deleteCP[c].Seconds() }))
			}
			cells = append(cells, fmt.Sprintf("%.1f / %s", rw.median(func(r *result) float64 { return r.bindCP[c].Seconds() }), del))
		}
		del := "–"
		if rw.ok[0].deleted {
			del = inline(rw.medianCounts(func(r *result) apicount.Counts { return r.deleteRequests }, func(r *result) float64 { return float64(r.spec.n) }), "%.2f")
		}
		p("| %s | %d | %s | %s |\n", rw.spec.name(), rw.spec.n, strings.Join(cells, " | "), del)
	}
	return b.String()
}

// inline lists counts on one line, largest first ("none" when empty).
func inline(c apicount.Counts, format string) string {
	c = c.Only(func(k apicount.Key) bool { return c[k] > 0 })
	if len(c) == 0 {
		return "none"
	}
	var parts []string
	for _, line := range strings.Split(strings.TrimSpace(c.String()), "\n") {
		key, _, _ := strings.Cut(line, ": ")
		k, res, _ := strings.Cut(key, " ")
		parts = append(parts, fmt.Sprintf("%s %s "+format, k, res, c[apicount.Key{Verb: k, Resource: res}]))
	}
	return strings.Join(parts, ", ")
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// loadAverage is the 1, 5 and 15 minute load average: other work on the machine
// skews every figure.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
