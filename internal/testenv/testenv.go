package testenv

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// RepoRoot is the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Env is a running test environment.
type Env struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is an uncached client for the tests.
	Client client.Client
	// Sim is the IPAM-API stand-in; SimURL its base URL.
	Sim    *sim.Server
	SimURL string
	// Clock drives the stand-in's expiry.
	Clock *clocktesting.FakeClock
	// Logs holds every line the manager logged.
	Logs *Logs
	// Cache reads the running manager's cache, for a test that must know the manager
	// has seen a write it made (nil while no manager runs).
	Cache client.Reader

	env     *envtest.Environment
	httpSrv *httptest.Server
	mgr     *runningManager
	kcm     *localcluster.Process
	kcmDir  string
}

// Logs is a concurrency-safe log sink: String returns everything logged so far, and
// Write takes a process's output.
type Logs struct {
	localcluster.LockedBuffer
}

// writer is an io.Writer into the log, for processes' output, with a prefix.
func (l *Logs) writer(prefix string) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		_, _ = fmt.Fprintf(l, "%s: %s", prefix, p)
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func (l *Logs) logger() logr.Logger {
	verbose := os.Getenv("TESTENV_VERBOSE") != ""
	return funcr.New(func(prefix, args string) {
		_, _ = fmt.Fprintf(l, "%s %s\n", prefix, args)
		if verbose {
			fmt.Fprintf(os.Stderr, "%s %s\n", prefix, args)
		}
	}, funcr.Options{Verbosity: 4, LogTimestamp: true})
}

// assetsDir finds kube-apiserver and etcd: KUBEBUILDER_ASSETS, else the repo's bin/.
func assetsDir() (string, error) {
	for _, dir := range []string{os.Getenv("KUBEBUILDER_ASSETS"), filepath.Join(RepoRoot(), "bin")} {
		if dir == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "kube-apiserver")); err == nil {
			return dir, nil
		}
	}
	return "", errors.New("kube-apiserver not found: run 'make test-assets' (it builds bin/kube-apiserver and bin/etcd)")
}

// DefaultOptions are the manager options the integration tests run with: short
// IPAM-API timeouts, webhooks on.
func DefaultOptions() manager.Options {
	return manager.Options{
		IPAMAPITimeout:          2 * time.Second,
		DefaultSecretNamespace:  manager.ProviderNamespace,
		DefaultSecretName:       "default",
		MaxConcurrentReconciles: 10,
		PoolProbeInterval:       5 * time.Minute,
		SubnetRecheckInterval:   time.Second,
		EnableWebhooks:          true,
		EnableServiceController: true,
		DefaultZone:             "hnet-private",
		ExcludedNamespaces:      manager.DefaultExcludedNamespaces(),
	}
}

// Start starts the API server, the stand-in and (unless noManager) the manager.
func Start(ctx context.Context, opts manager.Options) (*Env, error) {
	assets, err := assetsDir()
	if err != nil {
		return nil, err
	}
	root := RepoRoot()
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDInstallOptions: envtest.CRDInstallOptions{
			Paths: []string{
				filepath.Join(root, "config", "crd", "bases"),
				// CAPI's IPAddressClaim, IPAddress and Cluster CRDs as the workload install
				// ships them (v1beta2 only), generated from the CAPI module.
				filepath.Join(root, "config", "services", "capi-crds"),
			},
			ErrorIfPathMissing: true,
		},
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			Paths: []string{filepath.Join(root, "config", "webhook"), filepath.Join(root, "config", "services", "webhook")},
		},
	}
	// Dual-stack Services, as on the clusters the Service controller serves.
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.96.0.0/16,fd00:10:96::/112")
	cfg, err := env.Start()
	if err != nil {
		return nil, errors.Wrap(err, "starting envtest")
	}
	e := &Env{Config: cfg, env: env, Logs: &Logs{}}
	e.Clock = clocktesting.NewFakeClock(time.Now())
	e.Sim = sim.New(sim.Config{Clock: e.Clock})
	e.httpSrv = httptest.NewServer(e.Sim)
	e.SimURL = e.httpSrv.URL
	if e.Client, err = client.New(cfg, client.Options{Scheme: manager.NewScheme()}); err != nil {
		return nil, err
	}
	ctrl.SetLogger(e.Logs.logger())
	if err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opts.DefaultSecretNamespace}}); err != nil {
		return nil, errors.Wrap(err, "creating the default secret's namespace")
	}
	if err := e.StartManager(ctx, opts); err != nil {
		return nil, err
	}
	return e, nil
}

type runningManager struct {
	cancel context.CancelFunc
	done   chan error
}

// controllerConfig is the shipped controllers' settings, with one more: a restarted
// manager registers its controllers' metrics again.
func controllerConfig() config.Controller {
	c := manager.ControllerConfig()
	c.SkipNameValidation = ptr.To(true)
	return c
}

// StartManager starts the provider's manager with opts (the stand-in's URL when
// opts.IPAMAPIURL is empty). Only one runs at a time.
func (e *Env) StartManager(ctx context.Context, opts manager.Options) error {
	if e.mgr != nil {
		return errors.New("a manager is already running")
	}
	if opts.IPAMAPIURL == "" {
		opts.IPAMAPIURL = e.SimURL
	}
	wh := e.env.WebhookInstallOptions
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{
		Scheme:                 manager.NewScheme(),
		Logger:                 e.Logs.logger(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  manager.CacheOptions(""),
		// CI has seen managers take more than the default 30 s to stop (controller-runtime's
		// priority queue, now off: see manager.ControllerConfig): a stop that ends at all
		// is a stop, and the stacks logged after 20 s (see StopManager) show what was slow.
		GracefulShutdownTimeout: ptr.To(2 * time.Minute),
		Controller:              controllerConfig(),
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: wh.LocalServingHost, Port: wh.LocalServingPort, CertDir: wh.LocalServingCertDir,
		}),
	})
	if err != nil {
		return errors.Wrap(err, "creating the manager")
	}
	mctx, cancel := context.WithCancel(ctx)
	if err := manager.Setup(mctx, mgr, opts); err != nil {
		cancel()
		return err
	}
	rm := &runningManager{cancel: cancel, done: make(chan error, 1)}
	go func() { rm.done <- mgr.Start(mctx) }()
	e.mgr = rm
	// Wait until the webhook server answers, so tests do not race its start.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := mgr.GetWebhookServer().StartedChecker()(nil); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the webhook server did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !mgr.GetCache().WaitForCacheSync(mctx) {
		return errors.New("the manager's cache did not sync")
	}
	e.Cache = mgr.GetCache()
	return nil
}

// ExtraSim starts another stand-in with its own state and faults, for a test whose
// faults must not hit other tests' claims. Point a pool's spec.endpoint at its URL.
func (e *Env) ExtraSim() (*sim.Server, string, func()) {
	s := sim.New(sim.Config{Clock: e.Clock})
	srv := httptest.NewServer(s)
	return s, srv.URL, srv.Close
}

// StartControllerManager runs kube-controller-manager's garbage collector and namespace
// controller against the test API server (envtest runs no controllers), until Stop.
func (e *Env) StartControllerManager() error {
	assets, err := assetsDir()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "kcm-")
	if err != nil {
		return errors.Wrap(err, "creating a directory for kube-controller-manager")
	}
	e.kcmDir = dir
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*localcluster.KubeconfigFor(e.Config, "test"), kubeconfig); err != nil {
		return errors.Wrap(err, "writing kube-controller-manager's kubeconfig")
	}
	e.kcm, err = localcluster.StartControllerManager(dir, assets, kubeconfig, e.Logs.writer("kube-controller-manager"))
	return err
}

// StopManager stops the manager as a crash would: at once, wherever its reconciles are.
func (e *Env) StopManager() error {
	if e.mgr == nil {
		return nil
	}
	e.mgr.cancel()
	// A runnable still running 20 s after the manager was told to stop (it has 2
	// minutes, see StartManager) is slow or ignores its context: the goroutines'
	// stacks show which.
	dump := time.AfterFunc(20*time.Second, func() {
		_, _ = fmt.Fprintf(os.Stderr, "the manager has not stopped 20 s after it was told to; its goroutines:\n%s\n", providerStacks())
	})
	err := <-e.mgr.done
	dump.Stop()
	e.mgr, e.Cache = nil, nil
	return err
}

// providerStacks are the stacks of the goroutines that run this provider's or
// controller-runtime's code.
func providerStacks() string {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 2)
	var out []string
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(g, "cluster-api-ipam-provider-vitistack/") || strings.Contains(g, "controller-runtime/") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// Stop stops everything.
func (e *Env) Stop() error {
	_ = e.StopManager()
	e.kcm.Kill()
	if e.kcmDir != "" {
		_ = os.RemoveAll(e.kcmDir) // it holds an administrator's kubeconfig
	}
	e.httpSrv.Close()
	return e.env.Stop()
}
