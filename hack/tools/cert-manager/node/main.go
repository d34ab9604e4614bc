package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	logsapi "k8s.io/component-base/logs/api/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmwebhook "github.com/cert-manager/cert-manager/internal/webhook"
	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	"github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	"github.com/cert-manager/cert-manager/pkg/healthz"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"
	webhookoptions "github.com/cert-manager/cert-manager/pkg/webhook/options"

	// The controllers this command runs; each registers itself with controller.Known.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	// The issuers the issuers' controllers know.
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf.InitLogs()
	defer logf.FlushLogs()
	commands := map[string]func(context.Context, *pflag.FlagSet) error{
		"controller": runController,
		"webhook":    runWebhook,
		"cainjector": runCAInjector,
	}
	name := filepath.Base(os.Args[0])
	run, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s: run me as controller, webhook or cainjector (the binary's name says which)\n", name)
		os.Exit(2)
	}
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	if err := run(ctx, fs); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// parse parses the command's flags and applies the logging flags.
func parse(fs *pflag.FlagSet, logging *logsapi.LoggingConfiguration) error {
	logf.AddFlags(logging, fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	return logf.ValidateAndApply(logging)
}

// runController runs the controllers while it leads, as cert-manager's controller does.
func runController(ctx context.Context, fs *pflag.FlagSet) error {
	opts := controller.ContextOptions{
		KubernetesAPIQPS:   20,
		KubernetesAPIBurst: 50,
		CertificateOptions: controller.CertificateOptions{
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	}
	fs.StringVar(&opts.ClusterResourceNamespace, "cluster-resource-namespace", "kube-system", "namespace of the Secrets ClusterIssuers refer to")
	fs.StringVar(&opts.HTTP01SolverImage, "acme-http01-solver-image", "", "accepted because the chart passes it; this build has no ACME issuer")
	fs.IntVar(&opts.MaxConcurrentChallenges, "max-concurrent-challenges", 60, "accepted because the chart passes it; this build has no ACME issuer")
	election := addLeaderElectionFlags(fs)
	if err := parse(fs, logsapi.NewLoggingConfiguration()); err != nil {
		return err
	}

	ctx = logf.NewContext(ctx, logf.Log, "controller")
	factory, err := controller.NewContextFactory(ctx, opts)
	if err != nil {
		return err
	}
	base, err := factory.Build()
	if err != nil {
		return err
	}
	health := healthz.NewServer(20 * time.Second)
	listener, err := net.Listen("tcp", ":9403")
	if err != nil {
		return err
	}
	go func() { _ = health.Start(ctx, listener) }()

	lead := func(ctx context.Context) {
		controllers := map[string]controller.Interface{}
		for name, construct := range controller.Known() {
			c, err := construct(factory)
			if err != nil {
				logf.Log.Error(err, "building a controller", "controller", name)
				os.Exit(1)
			}
			controllers[name] = c
		}
		base.KubeSharedInformerFactory.Start(ctx.Done())
		base.SharedInformerFactory.Start(ctx.Done())
		base.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
		for name, c := range controllers {
			go func() {
				if err := c.Run(5, ctx); err != nil {
					logf.Log.Error(err, "running a controller", "controller", name)
					os.Exit(1)
				}
			}()
		}
		<-ctx.Done()
	}
	return election.run(ctx, base.Client, "cert-manager-controller", health.LeaderHealthzAdaptor, lead)
}

// runWebhook serves cert-manager's admission webhook with the flags of its own command.
func runWebhook(ctx context.Context, fs *pflag.FlagSet) error {
	flags := webhookoptions.NewWebhookFlags()
	flags.AddFlags(fs)
	cfg, err := webhookoptions.NewWebhookConfiguration()
	if err != nil {
		return err
	}
	webhookoptions.AddConfigFlags(fs, cfg)
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if flags.Config != "" {
		return errors.New("--config is not supported by this build; pass flags")
	}
	if err := logf.ValidateAndApply(&cfg.Logging); err != nil {
		return err
	}
	log := logf.Log.WithName("webhook")
	srv, err := cmwebhook.NewCertManagerWebhookServer(log, *cfg)
	if err != nil {
		return err
	}
	return srv.Run(logf.NewContext(ctx, log))
}

// runCAInjector runs cert-manager's CA injectors for webhooks, API services and CRDs.
func runCAInjector(ctx context.Context, fs *pflag.FlagSet) error {
	election := addLeaderElectionFlags(fs)
	if err := parse(fs, logsapi.NewLoggingConfiguration()); err != nil {
		return err
	}
	ctrl.SetLogger(logf.Log.WithName("cainjector"))
	scheme := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(admissionregistrationv1.AddToScheme(scheme))
	utilruntime.Must(apiextensionsv1.AddToScheme(scheme))
	utilruntime.Must(apiregistrationv1.AddToScheme(scheme))
	utilruntime.Must(cmapi.AddToScheme(scheme))
	lease := election.lease
	// Its user agent names the field manager of the CA it applies.
	mgr, err := ctrl.NewManager(util.RestConfigWithUserAgent(ctrl.GetConfigOrDie(), "cainjector"), ctrl.Options{
		Scheme:                        scheme,
		LeaderElection:                true,
		LeaderElectionNamespace:       election.namespace,
		LeaderElectionID:              "cert-manager-cainjector-leader-election",
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &lease,
		RenewDeadline:                 &election.renew,
		RetryPeriod:                   &election.retry,
		Metrics:                       metricsserver.Options{BindAddress: ":9402"},
		// Secrets are read when a CA is injected, not cached: the injectors watch
		// only their metadata, as cert-manager's cainjector does.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
	})
	if err != nil {
		return err
	}
	if err := cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName:   true,
			cainjector.ValidatingWebhookConfigurationName: true,
			cainjector.APIServiceName:                     true,
			cainjector.CustomResourceDefinitionName:       true,
		},
	}); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// leaderElection holds the chart's leader election flags, with cert-manager's defaults.
type leaderElection struct {
	namespace           string
	lease, renew, retry time.Duration
}

func addLeaderElectionFlags(fs *pflag.FlagSet) *leaderElection {
	e := &leaderElection{}
	fs.StringVar(&e.namespace, "leader-election-namespace", "kube-system", "namespace of the leader election Lease")
	fs.DurationVar(&e.lease, "leader-election-lease-duration", 60*time.Second, "how long a leader's Lease lasts")
	fs.DurationVar(&e.renew, "leader-election-renew-deadline", 40*time.Second, "how long the leader tries to renew before it gives up")
	fs.DurationVar(&e.retry, "leader-election-retry-period", 15*time.Second, "how often candidates try to acquire or renew the Lease")
	return e
}

// run calls lead while this process holds the Lease name, and exits when it loses it.
func (e *leaderElection) run(ctx context.Context, cs kubernetes.Interface, name string, watchdog *leaderelection.HealthzAdaptor, lead func(context.Context)) error {
	host, err := os.Hostname()
	if err != nil {
		return err
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, e.namespace, name, cs.CoreV1(), cs.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: host + "-external-" + name})
	if err != nil {
		return err
	}
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   e.lease,
		RenewDeadline:   e.renew,
		RetryPeriod:     e.retry,
		ReleaseOnCancel: true,
		WatchDog:        watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: lead,
			OnStoppedLeading: func() {
				if ctx.Err() == nil {
					logf.Log.Info("leader election lost")
					os.Exit(1)
				}
			},
		},
	})
	if err != nil {
		return err
	}
	elector.Run(ctx)
	return ctx.Err()
}
