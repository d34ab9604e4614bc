package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/pkg/errors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/apicount"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

type providerName string

const (
	vitistack providerName = "vitistack"
	inCluster providerName = "in-cluster"
)

// runSpec is one configuration: which provider, how many claims, and how.
type runSpec struct {
	provider providerName
	n        int
	// latency of the stand-in (this provider only).
	latency time.Duration
	// subnet: the pool is in subnet mode (this provider only).
	subnet bool
	// sequential: one claim at a time, each created once the last one is bound.
	sequential bool
	// memoryOnly: no quiet window and no deletion, only the burst.
	memoryOnly bool
}

// name is the configuration as the report shows it.
func (s runSpec) name() string {
	name := string(s.provider)
	if s.provider == vitistack {
		name += fmt.Sprintf(", stand-in %s", s.latency)
	}
	switch {
	case s.subnet:
		name += ", subnet mode"
	case s.sequential:
		name += ", one at a time"
	case s.memoryOnly:
		name += ", memory run"
	}
	return name
}

// key tells configurations apart: the name and N.
func (s runSpec) key() string { return fmt.Sprintf("%s N=%d", s.name(), s.n) }

// baseline is the in-cluster run this one is compared with in the same repetition.
func (s runSpec) baseline() (runSpec, bool) {
	if s.provider == inCluster || s.memoryOnly {
		return runSpec{}, false
	}
	return runSpec{provider: inCluster, n: s.n, sequential: s.sequential}, true
}

// result is what one run measured.
type result struct {
	spec runSpec
	rep  int
	// err is why the run failed; logs the end of its processes' logs.
	err  error
	logs string

	claimsPerSec float64
	// createsPerSec is N over the time from the first create to the last create's
	// return: what the creators managed (claims/s cannot exceed it).
	createsPerSec float64
	p50, p99      time.Duration
	// writes are the provider's writes during the burst (the harness's creates taken
	// out), secretGETs its GETs of Secrets, ipamCalls its requests to the stand-in.
	writes          apicount.Counts
	secretGETs      float64
	ipamCalls       int
	peakRSS, endRSS uint64
	cpu             time.Duration
	// bindCP and deleteCP are the control plane's CPU time (per process) while the
	// claims were bound and while they were deleted.
	bindCP, deleteCP map[string]time.Duration

	quietRun    bool
	quietWrites apicount.Counts
	quietCalls  int

	deleted   bool
	deleteAll time.Duration
	// deleteRequests are every client's requests to the API server while all claims
	// were deleted (the harness's, the provider's, the garbage collector's; no
	// watches, no leases).
	deleteRequests apicount.Counts
}

func (r *result) summary() string {
	s := fmt.Sprintf("%.1f claims/s (created at %.1f/s), p50 %s, p99 %s, %.2f writes/claim, %.2f IPAM-API calls/claim, peak RSS %.0f MiB, CPU %.1f s",
		r.claimsPerSec, r.createsPerSec, ms(r.p50), ms(r.p99), r.writes.Total()/float64(r.spec.n), float64(r.ipamCalls)/float64(r.spec.n),
		mib(r.peakRSS), r.cpu.Seconds())
	if r.quietRun {
		s += fmt.Sprintf(", quiet window: %g writes, %d IPAM-API calls", r.quietWrites.Total(), r.quietCalls)
	}
	if r.deleted {
		s += fmt.Sprintf(", delete-all %.1f s", r.deleteAll.Seconds())
	}
	s += "\n    writes: " + strings.ReplaceAll(strings.TrimSpace(r.writes.String()), "\n", ", ")
	s += "\n    control plane CPU while binding: " + formatCPU(r.bindCP)
	if r.deleted {
		s += fmt.Sprintf("\n    deleting, all requests per claim: %s", perClaim(r.deleteRequests, r.spec.n))
		s += "\n    control plane CPU while deleting: " + formatCPU(r.deleteCP)
	}
	return s
}

// perClaim lists counts divided by n, largest first.
func perClaim(c apicount.Counts, n int) string {
	per := apicount.Counts{}
	for k, v := range c {
		per[k] = math.Round(v/float64(n)*100) / 100
	}
	return strings.ReplaceAll(strings.TrimSpace(per.String()), "\n", ", ")
}

// runOne runs spec on a fresh control plane and stops everything it started.
func runOne(ctx context.Context, o *options, root string, rep int, spec runSpec) *result {
	r := &result{spec: spec, rep: rep}
	name := fmt.Sprintf("rep%d-%s-%d", rep, strings.NewReplacer(" ", "", ",", "-").Replace(spec.name()), spec.n)
	defer func() {
		if !o.keep {
			_ = os.RemoveAll(filepath.Join(root, name)) //nolint:gosec // the run's own temporary directory
		}
	}()
	cp, err := localcluster.StartControlPlane(root, name, localcluster.Paths{Assets: o.assets})
	if err != nil {
		r.err = err
		return r
	}
	defer cp.Stop()
	p, err := startProvider(ctx, o, cp, spec)
	defer p.stop()
	if err == nil {
		err = measure(ctx, o, cp, p, r)
	}
	if err != nil {
		r.err = err
		r.logs = p.logs() + fmt.Sprintf("--- the control plane's logs: %s (kept with --keep)\n", cp.Dir)
	}
	return r
}

// measure runs the burst (or the claims one at a time), the quiet window and the
// deletion, filling r.
func measure(ctx context.Context, o *options, cp *localcluster.ControlPlane, p *running, r *result) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the watch
	// The harness's own client: no client-side rate limit, so that 32 workers create
	// as fast as the API server takes them.
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS, cfg.Burst = -1, 0
	cl, err := client.New(cfg, client.Options{Scheme: cp.Client.Scheme()})
	if err != nil {
		return err
	}
	t, err := startTracker(ctx, cfg, cp.Client.Scheme())
	if err != nil {
		return err
	}
	n, pid := r.spec.n, p.proc.Pid()
	before, err := readCounters(ctx, cp, p)
	if err != nil {
		return err
	}
	cpBefore, err := controlPlaneCPU(cp.Dir)
	if err != nil {
		return err
	}

	// The burst: n creates, then every claim bound.
	c := &creator{cl: cl, poolRef: p.poolRef, created: map[string]time.Time{}}
	profiled := func() error { return nil }
	profile := func(phase string) {
		if o.apiServerProfiles != "" && !r.spec.sequential {
			profiled = apiServerProfile(ctx, cp, 3*time.Second, 10*time.Second,
				filepath.Join(o.apiServerProfiles, fmt.Sprintf("rep%d-%s-%d-%s.pb.gz", r.rep, r.spec.provider, n, phase)))
		}
	}
	profile("bind")
	start := time.Now()
	if r.spec.sequential {
		for i := range n {
			if err := c.create(ctx, i); err != nil {
				return err
			}
			name := claimName(i)
			if err := t.waitFor(ctx, p.proc, o.timeout, func() string { return name + " is not bound" },
				func() bool { _, ok := t.boundAt(name); return ok }); err != nil {
				return err
			}
		}
	} else if err := parallel(n, o.workers, func(i int) error { return c.create(ctx, i) }); err != nil {
		return err
	}
	if err := t.waitFor(ctx, p.proc, o.timeout,
		func() string { b, _ := t.counts(); return fmt.Sprintf("%d of %d claims bound", b, n) },
		func() bool { b, _ := t.counts(); return b == n }); err != nil {
		return err
	}
	after, err := readCounters(ctx, cp, p)
	if err != nil {
		return err
	}
	if err := profiled(); err != nil {
		return err
	}
	cpAfter, err := controlPlaneCPU(cp.Dir)
	if err != nil {
		return err
	}
	r.bindCP = cpuSince(cpBefore, cpAfter)
	var last, lastCreate time.Time
	latencies := make([]time.Duration, 0, n)
	for i := range n {
		lastCreate = later(lastCreate, c.created[claimName(i)])
		bound, _ := t.boundAt(claimName(i))
		last = later(last, bound)
		// The watch may see the claim bound before its create returned: latency 0.
		latencies = append(latencies, max(0, bound.Sub(c.created[claimName(i)])))
	}
	r.claimsPerSec = float64(n) / last.Sub(start).Seconds()
	r.createsPerSec = float64(n) / lastCreate.Sub(start).Seconds()
	r.p50, r.p99 = percentile(latencies, 50), percentile(latencies, 99)
	burst := after.api.Since(before.api)
	r.writes = providerWrites(burst)
	r.writes[apicount.Key{Verb: "POST", Resource: "ipaddressclaims"}] -= float64(n) // the harness's
	r.writes = r.writes.Only(func(k apicount.Key) bool { return r.writes[k] > 0 })
	r.secretGETs = burst.Get("GET", "secrets")
	r.ipamCalls = after.ipamCalls - before.ipamCalls
	r.cpu = after.cpu - before.cpu
	if r.peakRSS, r.endRSS, err = memory(pid); err != nil {
		return err
	}
	if r.spec.memoryOnly {
		if o.heapProfile != "" {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(o.heapProfileDelay):
			}
			return heapProfile(ctx, cp, p, o.heapProfile)
		}
		return nil
	}

	// The quiet window: nothing changes; what does the provider do?
	if o.quiet > 0 && !r.spec.sequential {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(o.quiet):
		}
		end, err := readCounters(ctx, cp, p)
		if err != nil {
			return err
		}
		r.quietRun = true
		r.quietWrites = providerWrites(end.api.Since(after.api))
		r.quietCalls = end.ipamCalls - after.ipamCalls
	}

	// Delete every claim; done when the watch has seen the last one go.
	delBefore, err := apicount.Read(ctx, cp.Config)
	if err != nil {
		return err
	}
	if cpBefore, err = controlPlaneCPU(cp.Dir); err != nil {
		return err
	}
	profile("delete")
	start = time.Now()
	if err := parallel(n, o.workers, func(i int) error { return deleteClaim(ctx, cl, i) }); err != nil {
		return err
	}
	if err := t.waitFor(ctx, p.proc, o.timeout,
		func() string { _, left := t.counts(); return fmt.Sprintf("%d of %d claims are not deleted", left, n) },
		func() bool { _, left := t.counts(); return left == 0 }); err != nil {
		return err
	}
	t.mu.Lock()
	r.deleteAll, r.deleted = t.goneAt.Sub(start), true
	t.mu.Unlock()
	delAfter, err := apicount.Read(ctx, cp.Config)
	if err != nil {
		return err
	}
	if err := profiled(); err != nil {
		return err
	}
	if cpAfter, err = controlPlaneCPU(cp.Dir); err != nil {
		return err
	}
	r.deleteCP = cpuSince(cpBefore, cpAfter)
	r.deleteRequests = delAfter.Since(delBefore).Only(func(k apicount.Key) bool { return k.Resource != "leases" && k.Verb != "WATCH" })
	if exited, err := p.proc.Exited(); exited {
		return errors.Errorf("%s exited (%v) during the run", p.proc.Name, err)
	}
	return nil
}

// providerWrites are the writes of c without the control plane's own: kube-apiserver
// renews its identity Lease every 10 s. Neither provider elects a leader here, so no
// Lease write is theirs.
func providerWrites(c apicount.Counts) apicount.Counts {
	return c.WritesOnly().Only(func(k apicount.Key) bool { return k.Resource != "leases" })
}

// counters are the cumulative counts one reading takes.
type counters struct {
	api       apicount.Counts
	ipamCalls int
	cpu       time.Duration
}

func readCounters(ctx context.Context, cp *localcluster.ControlPlane, p *running) (counters, error) {
	var c counters
	var err error
	if c.api, err = apicount.Read(ctx, cp.Config); err != nil {
		return c, err
	}
	if p.sim != nil {
		var st sim.Stats
		if st, err = p.sim.Stats(ctx); err != nil {
			return c, err
		}
		for route := range st.Requests {
			c.ipamCalls += st.Total(route)
		}
	}
	c.cpu, err = cpuTime(p.proc.Pid())
	return c, err
}

// percentile is the nearest-rank percentile of ds (which it sorts).
func percentile(ds []time.Duration, pct int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := (len(ds)*pct+99)/100 - 1
	return ds[max(0, i)]
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
