package main

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/pkg/errors"
	"github.com/spf13/pflag"
	"k8s.io/component-base/logs"
	logsv1 "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/diagnostics"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// defaultGCPercent is the GC percent the manager runs with unless GOGC is set.
const defaultGCPercent = 50

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// settings are the manager's flags.
type settings struct {
	opts            manager.Options
	diagOptions     diagnostics.Options
	logOptions      *logs.Options
	leaderElect     bool
	leaderElectNS   string
	leaseDuration   time.Duration
	renewDeadline   time.Duration
	retryPeriod     time.Duration
	healthAddr      string
	watchNamespace  string
	webhookPort     int
	webhookHost     string
	webhookCertDir  string
	showVersionOnly bool
}

// newFlags is every flag of the manager (docs/flags.md is checked against it).
func newFlags() (*pflag.FlagSet, *settings) {
	fs := pflag.NewFlagSet("manager", pflag.ContinueOnError)
	s := &settings{logOptions: logs.NewOptions()}
	s.opts.AddFlags(fs)
	diagnostics.AddFlags(fs, &s.diagOptions)
	logsv1.AddFlags(s.logOptions, fs)
	// component-base also registers its alpha logging options, which it refuses without
	// the LoggingAlphaOptions feature gate, and the manager has no --feature-gates: they
	// are hidden rather than offered in --help and then refused.
	for _, alpha := range []string{"log-text-split-stream", "log-text-info-buffer-size", "log-json-split-stream", "log-json-info-buffer-size"} {
		if err := fs.MarkHidden(alpha); err != nil {
			panic(err) // component-base no longer has it: drop it from the list
		}
	}
	fs.BoolVar(&s.leaderElect, "leader-elect", false, "Elect a leader so that only one replica reconciles at a time.")
	fs.StringVar(&s.leaderElectNS, "leader-elect-namespace", "", "Namespace of the leader election Lease (default: the Pod's own; required out of cluster).")
	fs.DurationVar(&s.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "Leader election lease duration.")
	fs.DurationVar(&s.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "Leader election renew deadline.")
	fs.DurationVar(&s.retryPeriod, "leader-elect-retry-period", 2*time.Second, "Leader election retry period.")
	fs.StringVar(&s.healthAddr, "health-addr", ":9440", "Address of the /healthz and /readyz endpoints.")
	fs.StringVar(&s.watchNamespace, "namespace", "", "Only watch this namespace (default: all namespaces).")
	fs.IntVar(&s.webhookPort, "webhook-port", webhook.DefaultPort, "Port of the webhook server.")
	fs.StringVar(&s.webhookHost, "webhook-host", "", "Address the webhook server binds to (default: all).")
	fs.StringVar(&s.webhookCertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "Directory with tls.crt and tls.key for the webhook server.")
	fs.BoolVar(&s.showVersionOnly, "version", false, "Print the version and exit.")
	return fs, s
}

func run(args []string) error {
	fs, s := newFlags()
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if s.showVersionOnly {
		fmt.Println(version)
		return nil
	}
	// Every request to the IPAM-API names the provider and this version (User-Agent).
	ipamapi.Version = version
	if err := logsv1.ValidateAndApply(s.logOptions, nil); err != nil {
		return err
	}
	ctrl.SetLogger(klog.Background())
	setupLog := ctrl.Log.WithName("setup")
	// The Go GC works to stay under 90 % of the container's memory limit (GOMEMLIMIT, or
	// AUTOMEMLIMIT=<ratio>|off, overrides it) instead of letting the heap double and the
	// Pod be OOM-killed: the cache grows with the claims.
	// The cache is most of the heap and lives as long as the process, so Go's default
	// (GOGC=100: the heap grows to twice what is live before a collection) mostly buys
	// room for garbage. At 50 the peak of a 10,000-claim burst is about a sixth lower
	// (121 against 142-147 MiB) at no throughput measured. GOGC overrides it.
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	memLimit, err := memlimit.Set()
	if err != nil {
		setupLog.V(1).Info("No memory limit found for GOMEMLIMIT", "reason", err.Error())
	}

	tlsOpts, metricsOpts, err := diagnostics.ManagerOptions(s.diagOptions)
	if err != nil {
		return err
	}
	mgrOpts := ctrl.Options{
		Scheme:                        manager.NewScheme(),
		Metrics:                       *metricsOpts,
		HealthProbeBindAddress:        s.healthAddr,
		LeaderElection:                s.leaderElect,
		LeaderElectionID:              "controller-leader-election-capi-ipam-vitistack",
		LeaderElectionNamespace:       s.leaderElectNS,
		LeaseDuration:                 &s.leaseDuration,
		RenewDeadline:                 &s.renewDeadline,
		RetryPeriod:                   &s.retryPeriod,
		LeaderElectionReleaseOnCancel: true,
		Cache:                         manager.CacheOptions(s.watchNamespace),
		Controller:                    manager.ControllerConfig(),
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: s.webhookHost, Port: s.webhookPort, CertDir: s.webhookCertDir, TLSOpts: tlsOpts,
		}),
	}
	ctx := ctrl.SetupSignalHandler()
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), mgrOpts)
	if err != nil {
		return err
	}
	if err := manager.Setup(ctx, mgr, s.opts); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	readyz := healthz.Ping
	if s.opts.EnableWebhooks {
		readyz = mgr.GetWebhookServer().StartedChecker()
	}
	if err := mgr.AddReadyzCheck("readyz", readyz); err != nil {
		return err
	}
	if s.opts.IPAMAPIURL == "" {
		// No default on purpose (the IPAM-API registers what it is sent without
		// authentication): a pool names its own with spec.endpoint, or it is not served.
		setupLog.Info("No --ipam-api-url: only pools with spec.endpoint are served, the others are not Ready")
	}
	setupLog.Info("Starting manager", "version", version, "ipamAPIURL", s.opts.IPAMAPIURL,
		"maxConcurrentReconciles", s.opts.MaxConcurrentReconciles, "goMemLimit", memLimitString(memLimit))
	return mgr.Start(ctx)
}

// memLimitString is GOMEMLIMIT for the log: "none", or MiB.
func memLimitString(limit int64) string {
	if limit <= 0 || limit == math.MaxInt64 {
		return "none"
	}
	return fmt.Sprintf("%dMiB", limit>>20)
}
