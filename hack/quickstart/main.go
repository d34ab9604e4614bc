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
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

func main() {
	dir := flag.String("dir", "out/quickstart", "directory for kubeconfigs, certificates and logs (emptied first)")
	templates := flag.String("templates", "templates", "directory with global-pools.yaml, claims.yaml and service.yaml")
	flag.Parse()
	ctrl.SetLogger(logr.Discard()) // the processes log to files in --dir
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, stop, *dir, *templates); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

func run(ctx context.Context, stop func(), dir, templates string) error {
	paths, ok := localcluster.PathsFromEnv()
	if !ok {
		return errors.New("run it with 'make quickstart', which builds what it needs and sets E2E_REPOSITORY and friends")
	}
	if err := paths.Check(); err != nil {
		return err
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return errors.Wrap(err, "--dir")
	}
	// The folder is emptied first: only if it is empty or one of ours.
	marker := filepath.Join(dir, ".quickstart")
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		if _, err := os.Stat(marker); err != nil {
			return errors.Errorf("--dir %s is not empty and was not made by the quickstart: not emptying it", dir)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return errors.Wrapf(err, "emptying %s", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return errors.Wrapf(err, "creating %s", dir)
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		return errors.Wrapf(err, "creating %s", marker)
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

	step("clusterctl init --ipam vitistack (offline repository %s)", paths.Repository)
	out, err := cp.Init(ctx, map[string]string{"VITISTACK_IPAM_API_URL": sim.URL})
	if err != nil {
		return err
	}
	fmt.Print(indent(out))

	// The Service controller on a management cluster keeps its default secret in the
	// provider's namespace, where the clusterctl flavour lets it create one (the Services
	// flavour ships ipam-system for that instead).
	step("Starting the manager (the installed Deployment's arguments, as its ServiceAccount, plus --enable-service-controller " +
		"--default-secret-namespace=capi-ipam-vitistack-system)")
	mgr, err := cp.StartManager(ctx, nil, "--enable-service-controller", "--default-secret-namespace=capi-ipam-vitistack-system")
	if err != nil {
		return err
	}
	defer mgr.Stop()

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
		yaml, err := cp.GenerateYAML(ctx, f.vars, filepath.Join(templates, f.file))
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
		return errors.Wrapf(err, "(manager log: %s)", mgr.LogFile)
	}
	if err := report(ctx, cp.Client); err != nil {
		return err
	}

	fmt.Printf(`
Ready in %s. Explore with kubectl:

  export KUBECONFIG=%s
  kubectl get globalvitistackippools,ipaddressclaims,ipaddresses.ipam.cluster.x-k8s.io -A
  kubectl get services -o custom-columns='NAME:.metadata.name,ADDRESSES:.metadata.annotations.metallb\.io/loadBalancerIPs'
  kubectl describe ipaddressclaim example-any

What the IPAM-API stand-in holds:  curl -s %s/registrations
Logs (manager, kube-apiserver, stand-in): %s

Press Ctrl-C to stop everything.
`, time.Since(start).Round(time.Second), cp.Kubeconfig, sim.DebugURL, dir)
	<-ctx.Done()
	stop() // a second Ctrl-C ends the quickstart at once
	fmt.Println()
	step("Stopping")
	return nil
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
		if s.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Annotations["metallb.io/loadBalancerIPs"] == "" {
			out = append(out, "Service "+s.Name)
		}
	}
	return out, nil
}

func report(ctx context.Context, c client.Client) error {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	row := func(cells ...string) { _, _ = fmt.Fprintln(w, "    "+strings.Join(cells, "\t")) }
	row("KIND", "NAME", "ADDRESS", "ZONE")
	addrs := &ipamv1.IPAddressList{}
	if err := c.List(ctx, addrs); err != nil {
		return err
	}
	sort.Slice(addrs.Items, func(i, j int) bool { return addrs.Items[i].Name < addrs.Items[j].Name })
	for _, a := range addrs.Items {
		row("IPAddressClaim", a.Namespace+"/"+a.Name, a.Spec.Address, a.Labels[ipamv1alpha1.ZoneLabel])
	}
	svcs := &corev1.ServiceList{}
	if err := c.List(ctx, svcs, client.InNamespace("default")); err != nil {
		return err
	}
	for _, s := range svcs.Items {
		if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
			row("Service", s.Namespace+"/"+s.Name, s.Annotations["metallb.io/loadBalancerIPs"], s.Annotations[ipamv1alpha1.ZoneAnnotation])
		}
	}
	return w.Flush()
}

func indent(s string) string {
	if s == "" {
		return s
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}
