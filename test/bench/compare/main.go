package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/pkg/errors"
	ctrl "sigs.k8s.io/controller-runtime"
)

// options are the command's flags.
type options struct {
	ns             []int
	reps           int
	quiet          time.Duration
	latency        time.Duration
	extraLatencies []time.Duration
	extraN         int
	seqN           int
	bigN           int
	workers        int
	timeout        time.Duration
	out            string
	keep           bool
	// heapProfile is where the memory run writes the provider's heap profile (empty: not).
	heapProfile string
	// heapProfileDelay is how long after the last claim is bound the profile is taken.
	heapProfileDelay time.Duration
	// apiServerProfiles is where kube-apiserver's CPU profiles of each phase go (empty: none).
	apiServerProfiles string
	// managerArgs are extra flags of this provider's manager (for example
	// --max-concurrent-reconciles=32), space-separated.
	managerArgs []string
	// managerEnv is extra environment of this provider's manager (GOMEMLIMIT=115MiB:
	// what the manager sets itself in a container with a 128Mi memory limit).
	managerEnv []string

	// What the runs start and install.
	assets, manager, sim, inCluster string
	capiCRDs, crds, inClusterCRDs   string
}

func main() {
	ctrl.SetLogger(logr.Discard()) // envtest's chatter; the processes log to files
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return // --help: the flags were printed
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-compare:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-compare:", err)
		stop()
		os.Exit(1)
	}
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("bench-compare", flag.ContinueOnError)
	ns := fs.String("n", "200,1000,3000", "claims per burst run, comma-separated")
	extra := fs.String("extra-latencies", "50ms,200ms", "stand-in latencies of the extra runs of this provider, comma-separated (empty: none)")
	fs.IntVar(&o.reps, "reps", 3, "repetitions of the whole plan")
	fs.DurationVar(&o.quiet, "quiet", 60*time.Second, "idle window after the burst (0 skips it)")
	fs.DurationVar(&o.latency, "latency", 2*time.Millisecond, "stand-in latency of the main runs")
	fs.IntVar(&o.extraN, "extra-n", 1000, "claims of the extra runs (other latencies, subnet mode); 0 skips them")
	fs.IntVar(&o.seqN, "seq-n", 100, "claims created one at a time, both providers; 0 skips")
	fs.IntVar(&o.bigN, "big-n", 10000, "claims of the memory run of this provider, once at the end; 0 skips")
	fs.IntVar(&o.workers, "workers", 32, "goroutines that create and delete claims")
	fs.DurationVar(&o.timeout, "timeout", 15*time.Minute, "limit of each phase (all bound, all deleted)")
	fs.StringVar(&o.out, "out", "out/bench/compare.md", "Markdown report file (also printed)")
	managerEnv := fs.String("manager-env", "", "extra environment of this provider's manager, space-separated KEY=VALUE (for example GOMEMLIMIT=115MiB, as the manager sets it in a container limited to 128Mi)")
	managerArgs := fs.String("manager-args", "", "extra flags of this provider's manager, space-separated (for example --max-concurrent-reconciles=32)")
	fs.StringVar(&o.heapProfile, "heap-profile", "", "file for this provider's heap profile at the end of the memory run (go tool pprof; empty: none)")
	fs.DurationVar(&o.heapProfileDelay, "heap-profile-delay", 0, "how long after the memory run's last claim is bound --heap-profile is taken (0: at once, the burst's own allocations included)")
	fs.StringVar(&o.apiServerProfiles, "apiserver-profiles", "", "directory for kube-apiserver's CPU profiles, 10 s from 3 s into the burst and into the deletion of each run (empty: none)")
	fs.BoolVar(&o.keep, "keep", false, "keep the runs' directories (logs) instead of removing them")
	fs.StringVar(&o.assets, "assets", envOr("KUBEBUILDER_ASSETS", "bin/k8s/v1.33.4"), "directory with kube-apiserver, etcd and kube-controller-manager")
	fs.StringVar(&o.manager, "manager", envOr("E2E_MANAGER", "bin/manager"), "this provider's manager binary")
	fs.StringVar(&o.sim, "sim", envOr("E2E_IPAM_API_SIM", "bin/ipam-api-sim"), "the IPAM-API stand-in binary")
	fs.StringVar(&o.inCluster, "incluster", "bin/ipam-incluster", "the in-cluster provider's binary")
	fs.StringVar(&o.capiCRDs, "capi-crds", "config/services/capi-crds", "directory of the Cluster API IPAM CRDs")
	fs.StringVar(&o.crds, "crds", "config/crd/bases", "directory of this provider's CRDs")
	fs.StringVar(&o.inClusterCRDs, "incluster-crds", "", "directory of the in-cluster provider's CRDs (its module's config/crd/bases)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.managerArgs = strings.Fields(*managerArgs)
	o.managerEnv = strings.Fields(*managerEnv)
	var err error
	if o.ns, err = parseList(*ns, strconv.Atoi); err != nil {
		return nil, errors.Wrap(err, "--n")
	}
	if o.extraLatencies, err = parseList(*extra, time.ParseDuration); err != nil {
		return nil, errors.Wrap(err, "--extra-latencies")
	}
	if o.reps < 1 || o.workers < 1 {
		return nil, errors.New("--reps and --workers must be at least 1")
	}
	if o.inClusterCRDs == "" {
		return nil, errors.New("--incluster-crds is required (make bench-compare sets it)")
	}
	for _, p := range []*string{&o.assets, &o.manager, &o.sim, &o.inCluster, &o.capiCRDs, &o.crds, &o.inClusterCRDs} {
		if *p, err = filepath.Abs(*p); err != nil {
			return nil, err
		}
		if _, err := os.Stat(*p); err != nil {
			return nil, errors.Wrap(err, "run it with 'make bench-compare', which builds what it needs")
		}
	}
	return o, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := parse(f)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// plan lists the runs of one repetition, in order: per N this provider then the
// in-cluster one, then the extra runs.
func (o *options) plan() []runSpec {
	var plan []runSpec
	for _, n := range o.ns {
		plan = append(plan,
			runSpec{provider: vitistack, n: n, latency: o.latency},
			runSpec{provider: inCluster, n: n})
	}
	if o.extraN > 0 {
		for _, l := range o.extraLatencies {
			plan = append(plan, runSpec{provider: vitistack, n: o.extraN, latency: l})
		}
		plan = append(plan, runSpec{provider: vitistack, n: o.extraN, latency: o.latency, subnet: true})
	}
	if o.seqN > 0 {
		plan = append(plan,
			runSpec{provider: vitistack, n: o.seqN, latency: o.latency, sequential: true},
			runSpec{provider: inCluster, n: o.seqN, sequential: true})
	}
	return plan
}

func run(ctx context.Context, o *options) error {
	root, err := os.MkdirTemp("", "bench-compare-")
	if err != nil {
		return err
	}
	defer func() {
		if o.keep {
			fmt.Fprintf(os.Stderr, "bench-compare: the runs' logs are in %s\n", root)
			return
		}
		_ = os.RemoveAll(root)
	}()
	plan := o.plan()
	runs := o.reps * len(plan)
	if o.bigN > 0 {
		runs++
	}
	fmt.Fprintf(os.Stderr, "bench-compare: %d runs (%d repetitions of %d, then the memory run), %d CPUs\n", runs, o.reps, len(plan), runtime.NumCPU())
	start, load := time.Now(), loadAverage()
	var results []*result
	var failed []string
	do := func(rep int, spec runSpec) {
		if ctx.Err() != nil {
			return
		}
		fmt.Fprintf(os.Stderr, "bench-compare: [%d/%d] rep %d: %s ...\n", len(results)+1, runs, rep, spec.name())
		r := runOne(ctx, o, root, rep, spec)
		results = append(results, r)
		if r.err != nil {
			failed = append(failed, fmt.Sprintf("rep %d %s: %v", rep, spec.name(), r.err))
			fmt.Fprintf(os.Stderr, "bench-compare: FAILED rep %d %s: %v\n%s\n", rep, spec.name(), r.err, r.logs)
			return
		}
		fmt.Fprintf(os.Stderr, "bench-compare:   %s\n", r.summary())
	}
	for rep := 1; rep <= o.reps; rep++ {
		for _, spec := range plan {
			do(rep, spec)
		}
	}
	if o.bigN > 0 {
		do(1, runSpec{provider: vitistack, n: o.bigN, latency: o.latency, memoryOnly: true})
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	report := markdown(o, results, time.Since(start), load)
	fmt.Print(report)
	if err := os.MkdirAll(filepath.Dir(o.out), 0o750); err != nil {
		return err
	}
	if err := os.WriteFile(o.out, []byte(report), 0o644); err != nil { //nolint:gosec // a report for people to read
		return err
	}
	fmt.Fprintf(os.Stderr, "bench-compare: wrote %s after %s\n", o.out, time.Since(start).Round(time.Second))
	if len(failed) > 0 {
		return errors.Errorf("%d runs failed:\n  %s", len(failed), strings.Join(failed, "\n  "))
	}
	return nil
}
