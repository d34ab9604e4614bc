package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "status" {
		if err := status(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "quickstart status:", err)
			os.Exit(1)
		}
		return
	}
	fs := flag.NewFlagSet("quickstart", flag.ExitOnError)
	fs.Usage = func() {
		_, _ = fmt.Fprint(fs.Output(), `Usage: quickstart [flags]          (what make quickstart runs)
       quickstart status [--kubeconfig FILE]   (what make status runs)

Runs the provider on this machine: the IPAM-API stand-in, etcd, kube-apiserver and
kube-controller-manager on 127.0.0.1, clusterctl init --ipam vitistack, the manager
(restarted when it dies) with both webhooks, and the examples of templates/. With
--node (make quickstart-node, as root): the image in a Pod on a node of its own.

Flags:
`)
		fs.PrintDefaults()
	}
	dir := fs.String("dir", "out/quickstart", "directory for kubeconfigs, certificates and logs (emptied first; out/quickstart-node with --node)")
	templates := fs.String("templates", "templates", "directory with global-pools.yaml, claims.yaml and service.yaml")
	noRestart := fs.Bool("no-restart", false, "leave the manager dead when it dies (to try what a crash does), instead of restarting it")
	builtIn := fs.Duration("built-in", 0, "how long make spent building before (printed with the start time)")
	onNode := fs.Bool("node", false, "run the provider as a cluster runs it, on a real node (make quickstart-node; as root)")
	_ = fs.Parse(os.Args[1:])
	ctrl.SetLogger(logr.Discard()) // the processes log to files in --dir
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := options{dir: *dir, templates: *templates, restart: !*noRestart, builtIn: *builtIn}
	start := run
	if *onNode {
		start = runNode
		dirSet := false
		fs.Visit(func(f *flag.Flag) { dirSet = dirSet || f.Name == "dir" })
		if !dirSet {
			o.dir = "out/quickstart-node"
		}
	}
	if err := start(ctx, stop, o); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

type options struct {
	dir, templates string
	restart        bool
	builtIn        time.Duration
}

func step(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

// prepare reads what make built (or names the target that builds it) and empties --dir,
// whose absolute path it returns.
func (o options) prepare(target string) (localcluster.Paths, string, error) {
	paths, ok := localcluster.PathsFromEnv()
	if !ok {
		return paths, "", errors.Errorf("run it with 'make %s', which builds what it needs and sets E2E_REPOSITORY and friends", target)
	}
	if err := paths.Check(); err != nil {
		return paths, "", err
	}
	dir, err := emptyDir(o.dir)
	return paths, dir, err
}

// took says how long make built and the quickstart started (since start).
func (o options) took(start time.Time) string {
	took := fmt.Sprintf("started in %s", time.Since(start).Round(time.Second))
	if o.builtIn > 0 {
		took = fmt.Sprintf("built in %s, %s", o.builtIn.Round(time.Second), took)
	}
	return took
}

func run(ctx context.Context, stop func(), o options) error {
	paths, dir, err := o.prepare("quickstart")
	if err != nil {
		return err
	}
	start := time.Now()

	step("Starting the IPAM-API stand-in")
	sim, err := localcluster.StartSim(dir, paths, nil)
	if err != nil {
		return err
	}
	defer sim.Stop()

	step("Starting etcd, kube-apiserver and kube-controller-manager on 127.0.0.1")
	cp, err := localcluster.StartControlPlane(dir, "quickstart", paths)
	if err != nil {
		return err
	}
	defer cp.Stop()

	// VITISTACK_SERVICES=true turns the Service controller and its webhook on, as a user
	// who wants LoadBalancer Services on a management cluster installs it.
	step("VITISTACK_SERVICES=true clusterctl init --ipam vitistack (offline repository %s)", paths.Repository)
	vars := map[string]string{"VITISTACK_IPAM_API_URL": sim.URL, "VITISTACK_SERVICES": "true"}
	out, err := cp.Init(ctx, vars)
	if err != nil {
		return err
	}
	fmt.Print(indent(out))

	step("Starting the manager (the installed Deployment's arguments, as its ServiceAccount)")
	mgr, err := cp.StartManager(ctx, nil)
	if err != nil {
		return err
	}
	sup := &supervisor{cp: cp, restart: o.restart, mgr: mgr}
	defer sup.stop()
	restarting := "restarted when it dies"
	if !o.restart {
		restarting = "not restarted when it dies (--no-restart)"
	}
	step("The manager runs (pid %d, log %s), %s; both webhooks are served", mgr.Pid(), mgr.LogFile, restarting)
	go sup.watch(ctx)
	step("Starting MetalLB's controller, with pools over the IPAM-API's zones (autoAssign: false; no speaker: nothing is announced on loopback)")
	metallb, err := cp.StartMetalLB(ctx, localcluster.StandInPools())
	if err != nil {
		return err
	}
	defer metallb.Stop()

	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	for _, f := range []struct {
		file string
		vars map[string]string
	}{
		{"global-pools.yaml", nil},
		{"claims.yaml", nil},
		{"service.yaml", map[string]string{"VITISTACK_SECRET": hex.EncodeToString(secret)}},
	} {
		step("Applying templates/%s", f.file)
		yaml, err := cp.GenerateYAML(ctx, f.vars, filepath.Join(o.templates, f.file))
		if err != nil {
			return err
		}
		applied, err := cp.Apply(ctx, yaml)
		if err != nil {
			return err
		}
		fmt.Print(indent(strings.Join(applied, "\n") + "\n"))
	}

	step("Waiting for the addresses")
	if err := waitAllocated(ctx, cp.Client); err != nil {
		return errors.Wrapf(err, "(manager log: %s)", sup.current().LogFile)
	}
	fmt.Println()
	if err := printStatus(ctx, cp.Client, os.Stdout, time.Now()); err != nil {
		return err
	}
	fmt.Printf(readyText, o.took(start), cp.Kubeconfig, sim.DebugURL, sup.current().MetricsURL, dir)
	<-ctx.Done()
	stop() // a second Ctrl-C ends the quickstart at once
	fmt.Println()
	step("Stopping")
	return nil
}

// emptyDir makes the folder dir, emptied first: only if it is empty or one of ours. It
// returns its absolute path.
func emptyDir(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", errors.Wrap(err, "--dir")
	}
	marker := filepath.Join(dir, ".quickstart")
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		if _, err := os.Stat(marker); err != nil {
			return "", errors.Errorf("--dir %s is not empty and was not made by the quickstart: not emptying it", dir)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", errors.Wrapf(err, "emptying %s", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", errors.Wrapf(err, "creating %s", dir)
	}
	return dir, errors.Wrapf(os.WriteFile(marker, nil, 0o600), "creating %s", marker)
}

// readyText is what the quickstart prints once everything is allocated; README.md's
// Quickstart shows it (a test compares the two).
const readyText = `
Ready (%s). Explore with kubectl:

  export KUBECONFIG=%s
  kubectl get globalvitistackippools,ipaddressclaims,services -A
  kubectl get ipaddresses.ipam.cluster.x-k8s.io -A -L ipam.vitistack.io/zone,ipam.vitistack.io/ip-family
  kubectl describe ipaddressclaim example-any
  make status

What the IPAM-API stand-in holds:  curl -s %s/registrations
The manager's metrics:             curl -s %s   (a new port after a restart: printed then)
Logs (manager, kube-apiserver, stand-in): %s

Press Ctrl-C to stop everything.
`

// status is the subcommand behind make status.
func status(args []string) error {
	fs := flag.NewFlagSet("quickstart status", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "the cluster to show (default: $KUBECONFIG)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *kubeconfig == "" {
		return errors.New("no cluster: pass --kubeconfig or set KUBECONFIG (make status uses the quickstart's when KUBECONFIG is unset)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return errors.Wrapf(err, "reading --kubeconfig %s", *kubeconfig)
	}
	c, err := client.New(cfg, client.Options{Scheme: manager.NewScheme()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return printStatus(ctx, c, os.Stdout, time.Now())
}

// waitAllocated waits until every claim and every LoadBalancer Service in default is
// served, or one of them reports a failure for too long.
func waitAllocated(ctx context.Context, c client.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		pending, err := pending(ctx, c)
		if err != nil {
			return err
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Errorf("still waiting for %s", strings.Join(pending, ", "))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func pending(ctx context.Context, c client.Client) ([]string, error) {
	var out []string
	claims := &ipamv1.IPAddressClaimList{}
	if err := c.List(ctx, claims, client.InNamespace("default")); err != nil {
		return nil, err
	}
	for _, cl := range claims.Items {
		if cl.Status.AddressRef.Name == "" {
			out = append(out, "IPAddressClaim "+cl.Name)
		}
	}
	svcs := &corev1.ServiceList{}
	if err := c.List(ctx, svcs, client.InNamespace("default")); err != nil {
		return nil, err
	}
	for _, s := range svcs.Items {
		if s.Spec.Type == corev1.ServiceTypeLoadBalancer && (s.Annotations["metallb.io/loadBalancerIPs"] == "" || len(s.Status.LoadBalancer.Ingress) == 0) {
			out = append(out, "Service "+s.Name)
		}
	}
	// The pools' in-use counts are patched at most once a second: the tables show them
	// once they count every IPAddress.
	addrs := &ipamv1.IPAddressList{}
	if err := c.List(ctx, addrs); err != nil {
		return nil, err
	}
	inUse := map[string]int32{}
	for _, a := range addrs.Items {
		if a.Spec.PoolRef.Kind == ipamv1alpha1.GlobalVitistackIPPoolKind {
			inUse[a.Spec.PoolRef.Name]++
		}
	}
	pools := &ipamv1alpha1.GlobalVitistackIPPoolList{}
	if err := c.List(ctx, pools); err != nil {
		return nil, err
	}
	for _, p := range pools.Items {
		if got := p.Status.AddressesInUse; got == nil || *got != inUse[p.Name] {
			out = append(out, "the in-use count of GlobalVitistackIPPool "+p.Name)
		}
	}
	return out, nil
}

func indent(s string) string {
	if s == "" {
		return s
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}
