package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pkg/errors"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
)

// runNode is make quickstart-node: the provider as a cluster runs it, on a node of its
// own inside two network namespaces it makes (the node and a client host on its link).
// cert-manager from its chart, clusterctl init --ipam vitistack (the shipped image in a
// Pod, its webhook certificate from cert-manager), MetalLB's controller and speaker in
// L2 mode, and a LoadBalancer Service whose address the client host reaches. Outside
// the namespaces it makes them and runs itself again inside (as root), like test/node.
func runNode(ctx context.Context, _ func(), o options) error {
	namespaces, inside := localcluster.InNodeNamespace()
	if !inside {
		code, err := localcluster.RunInNodeNamespace("vitistack-quickstart")
		if err != nil {
			return err
		}
		os.Exit(code)
	}
	nodePaths, ok := localcluster.NodePathsFromEnv()
	if !ok {
		return errors.New("run it with 'make quickstart-node', which builds the node's programs and images and sets E2E_KUBELET and friends")
	}
	paths, dir, err := o.prepare("quickstart-node")
	if err != nil {
		return err
	}
	start := time.Now()

	step("Starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler on %s (network namespace %s)", localcluster.NodeIP, namespaces.Node)
	cp, err := localcluster.StartNodeControlPlane(dir, "cp", paths, localcluster.NodeIP)
	if err != nil {
		return err
	}
	defer cp.Stop()
	step("Starting the node: containerd, kubelet, kube-proxy; importing the images")
	node, err := localcluster.StartNode(dir, cp, nodePaths)
	if node != nil {
		defer func() {
			step("Stopping the node")
			node.Stop()
			if left := node.Leftovers(); len(left) > 0 {
				fmt.Fprintf(os.Stderr, "quickstart: the node left on the machine:\n  %s\n", strings.Join(left, "\n  "))
			}
		}()
	}
	if err != nil {
		return err
	}

	step("Installing cert-manager from its chart")
	if err := cp.InstallCertManager(ctx); err != nil {
		return err
	}
	step("Starting the IPAM-API stand-in on %s, zone hnet-private = %s", localcluster.NodeIP, localcluster.LinkPool)
	zones := filepath.Join(dir, "zones.json")
	if err := os.WriteFile(zones, []byte(localcluster.NodeZones), 0o600); err != nil {
		return err
	}
	sim, err := localcluster.StartSimOn(dir, localcluster.NodeIP, paths, nil, "--zones", zones)
	if err != nil {
		return err
	}
	defer sim.Stop()

	// Cluster API's own controllers' images are not built here: they are kept from running.
	if err := cp.NoClusterAPIPods(ctx); err != nil {
		return err
	}
	step("VITISTACK_SERVICES=true clusterctl init --ipam vitistack (offline repository %s)", paths.Repository)
	out, err := cp.Init(ctx, map[string]string{"VITISTACK_IPAM_API_URL": sim.URL, "VITISTACK_SERVICES": "true"})
	if err != nil {
		return err
	}
	fmt.Print(indent(out))
	step("Waiting for the provider's Pod to be Ready (its probes; its webhook certificate from cert-manager)")
	if err := deploymentReady(ctx, cp.Client, manager.ProviderNamespace, localcluster.DeploymentName); err != nil {
		return err
	}

	step("Installing MetalLB's controller and speaker (L2 mode; its pool %s, autoAssign: false)", localcluster.LinkPool)
	if err := cp.InstallMetalLB(ctx); err != nil {
		return err
	}
	step("Creating the GlobalVitistackIPPool hnet-private-ipv4, and a LoadBalancer Service default/echo with one backend Pod")
	pool := &ipamv1alpha1.GlobalVitistackIPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "hnet-private-ipv4"},
		Spec:       ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4},
	}
	backend, svc := localcluster.EchoApp(corev1.NamespaceDefault)
	for _, obj := range []client.Object{pool, backend, svc} {
		if err := cp.Client.Create(ctx, obj); err != nil {
			return err
		}
	}
	if err := deploymentReady(ctx, cp.Client, backend.Namespace, backend.Name); err != nil {
		return err
	}
	address, answer, err := reachFromClient(ctx, cp.Client, namespaces, client.ObjectKeyFromObject(svc))
	if err != nil {
		return err
	}
	step("The client host %s reached %s:80, the address the provider registered and MetalLB announces; the answer: %s",
		localcluster.ClientIP, address, answer)
	if err := waitAllocated(ctx, cp.Client); err != nil {
		return err
	}
	fmt.Println()
	if err := printStatus(ctx, cp.Client, os.Stdout, time.Now()); err != nil {
		return err
	}
	fmt.Printf(nodeReadyText, o.took(start), namespaces.Node, cp.Kubeconfig, namespaces.Client, address, dir)
	// Ctrl-C reaches the run inside twice (from the terminal, and forwarded by the run
	// outside): later ones are ignored, so that the node always stops cleanly.
	<-ctx.Done()
	fmt.Println()
	step("Stopping")
	return nil
}

// nodeReadyText is what make quickstart-node prints once the client host reached the
// Service.
const nodeReadyText = `
Ready (%s). The cluster lives in network namespaces of its own: run kubectl in the node's.

  sudo ip netns exec %s kubectl --kubeconfig %s get pods -A
  sudo ip netns exec %s bash -c 'head -1 < /dev/tcp/%s/80'   # from the client host

Logs (kube-apiserver, kubelet, containerd, stand-in; the Pods' in the node's /var/log/pods): %s

Press Ctrl-C to stop everything; the node leaves nothing on the machine.
`

// deploymentReady waits until the Deployment runs its replicas, all updated and Ready.
func deploymentReady(ctx context.Context, c client.Client, namespace, name string) error {
	d := &appsv1.Deployment{}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		if last = c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, d); last != nil {
			return false, nil
		}
		last = localcluster.RolledOut(d)
		return last == nil, nil
	})
	return errors.Wrapf(localcluster.WaitError(last, err), "Deployment %s/%s", namespace, name)
}

// reachFromClient waits until the Service has its address, then until a TCP connection
// from the client host to it on port 80 gets a line back; it returns both.
func reachFromClient(ctx context.Context, c client.Client, ns localcluster.NodeNamespaces, key client.ObjectKey) (address, answer string, err error) {
	var last error
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		svc := &corev1.Service{}
		if last = c.Get(ctx, key, svc); last != nil {
			return false, nil
		}
		if len(svc.Status.LoadBalancer.Ingress) == 0 {
			last = errors.Errorf("Service %s has no address yet (annotations %v)", key, svc.Annotations)
			return false, nil
		}
		address = svc.Status.LoadBalancer.Ingress[0].IP
		conn, err := ns.DialFromClient(net.JoinHostPort(address, "80"), 2*time.Second)
		if last = err; err != nil {
			return false, nil
		}
		defer func() { _ = conn.Close() }()
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		answer, last = bufio.NewReader(conn).ReadString('\n')
		answer = strings.TrimSpace(answer)
		return last == nil, nil
	})
	return address, answer, errors.Wrapf(localcluster.WaitError(last, err), "the client host reaching Service %s", key)
}
