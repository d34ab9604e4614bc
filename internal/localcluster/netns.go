package localcluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/pkg/errors"
	"golang.org/x/sys/unix"
)

// The node's network: everything a node test runs lives in two network namespaces the
// test makes itself, joined by one veth pair and linked to nothing else: the node
// (control plane, containerd, kubelet, kube-proxy, the IPAM-API stand-in, and the Pods'
// bridge) and a client host on the node's link. No packet can leave them: the node's
// default route points at the client host, which has no route on.
const (
	// NodeIP is the node's address on its link, 10.250.0.0/24, whose free addresses a
	// LoadBalancer pool may hand out (MetalLB's speaker answers ARP for them there);
	// kube-apiserver serves on it.
	NodeIP = "10.250.0.10"
	// ClientIP is the client host's address on the node's link.
	ClientIP = "10.250.0.2"
	// PodCIDR is the Pods' range on the node's bridge.
	PodCIDR = "10.244.0.0/24"

	netnsEnv = "LOCALCLUSTER_NODE_NETNS"
)

// NodeNamespaces are the two network namespaces of a node test.
type NodeNamespaces struct{ Node, Client string }

// InNodeNamespace reports the namespaces this process runs in, if RunInNodeNamespace
// started it.
func InNodeNamespace() (NodeNamespaces, bool) {
	v := os.Getenv(netnsEnv)
	return namespacesOf(v), v != ""
}

// namespacesOf are the node namespace node and its client host's.
func namespacesOf(node string) NodeNamespaces {
	if node == "" {
		return NodeNamespaces{}
	}
	return NodeNamespaces{Node: node, Client: node + "-client"}
}

// RunInNodeNamespace makes the node's and the client host's network namespaces (named
// prefix-<pid>), runs this program again, with the same arguments, inside the node's,
// and removes both when it ends; it returns the program's exit code. Needs root, ip
// (iproute2) and nsenter (util-linux). Only the network namespace changes (StartNode
// gives the node a mount namespace of its own).
func RunInNodeNamespace(prefix string) (int, error) {
	if os.Getuid() != 0 {
		return 1, errors.New("a node needs root (network namespaces, mounts, cgroups): run it with sudo")
	}
	ns := namespacesOf(fmt.Sprintf("%s-%d", prefix, os.Getpid()))
	defer func() {
		_ = exec.Command("ip", "netns", "delete", ns.Client).Run()
		_ = exec.Command("ip", "netns", "delete", ns.Node).Run()
	}()
	if err := ns.setUp(); err != nil {
		return 1, err
	}
	self, err := os.Executable()
	if err != nil {
		return 1, errors.Wrap(err, "finding this program")
	}
	cmd := exec.Command("nsenter", append([]string{"--net=" + ns.path(ns.Node), "--", self}, os.Args[1:]...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), netnsEnv+"="+ns.Node)
	// However the run inside ends (a panic or a timeout skips its clean-up), what it
	// started ends here: every process in the two namespaces (containerd's shims among
	// them), and the Pods' (the kubepods cgroups, unless a kubelet of the machine's own
	// had them before). A signal goes to the run inside, which stops its node.
	kubeletBefore := len(cgroupDirs("kubepods")) > 0
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(signals)
	if err := cmd.Start(); err != nil {
		return 1, errors.Wrap(err, "running inside the node's network namespace")
	}
	go func() {
		for s := range signals {
			_ = cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	for _, name := range []string{ns.Node, ns.Client} {
		out, _ := exec.Command("ip", "netns", "pids", name).Output()
		killPIDs(string(out))
	}
	if !kubeletBefore {
		killCgroups("kubepods")
		removeCgroups("kubepods")
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	if err != nil {
		return 1, errors.Wrap(err, "running inside the node's network namespace")
	}
	return 0, nil
}

func (NodeNamespaces) path(name string) string { return filepath.Join("/run/netns", name) }

// setUp makes both namespaces and their link: the node's eth0 (NodeIP, its default
// route the client host), the client host's eth0 (ClientIP, no route beyond its link),
// both loopbacks up, and forwarding on in the node (its Pods, Services and
// LoadBalancer addresses are routed there).
func (ns NodeNamespaces) setUp() error {
	steps := [][]string{
		{"netns", "add", ns.Node},
		{"netns", "add", ns.Client},
		{"-n", ns.Node, "link", "set", "lo", "up"},
		{"-n", ns.Client, "link", "set", "lo", "up"},
		{"-n", ns.Node, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", ns.Client},
		{"-n", ns.Node, "addr", "add", NodeIP + "/24", "dev", "eth0"},
		{"-n", ns.Client, "addr", "add", ClientIP + "/24", "dev", "eth0"},
		{"-n", ns.Node, "link", "set", "eth0", "up"},
		{"-n", ns.Client, "link", "set", "eth0", "up"},
		{"-n", ns.Node, "route", "add", "default", "via", ClientIP},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			return errors.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	// /proc/sys/net is the writing process's network namespace's.
	if out, err := exec.Command("nsenter", "--net="+ns.path(ns.Node), "--", "sh", "-c",
		"echo 1 > /proc/sys/net/ipv4/ip_forward").CombinedOutput(); err != nil {
		return errors.Errorf("turning forwarding on in the node's namespace: %v: %s", err, out)
	}
	return nil
}

// DialFromClient opens a TCP connection to address from the client host, as a program
// there would: the socket is made in the client host's network namespace.
func (ns NodeNamespaces) DialFromClient(address string, timeout time.Duration) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	// On a goroutine of its own, locked to its thread: the thread switches to the client
	// host's namespace, makes the socket there (which stays there), and switches back.
	// A thread that cannot switch back stays locked, and ends with the goroutine.
	go func() {
		runtime.LockOSThread()
		conn, back, err := ns.dialInClient(address, timeout)
		if back {
			runtime.UnlockOSThread()
		}
		done <- result{conn, err}
	}()
	r := <-done
	return r.conn, r.err
}

// dialInClient dials from the client host's namespace on this (locked) thread; back
// says whether the thread is in its own namespace again.
func (ns NodeNamespaces) dialInClient(address string, timeout time.Duration) (conn net.Conn, back bool, err error) {
	home, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, true, errors.Wrap(err, "opening this thread's network namespace")
	}
	defer home.Close() //nolint:errcheck // read only
	client, err := os.Open(ns.path(ns.Client))
	if err != nil {
		return nil, true, errors.Wrap(err, "opening the client host's network namespace")
	}
	defer client.Close() //nolint:errcheck // read only
	if err := unix.Setns(int(client.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, true, errors.Wrap(err, "entering the client host's network namespace")
	}
	conn, dialErr := net.DialTimeout("tcp", address, timeout)
	if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
		if conn != nil {
			_ = conn.Close()
		}
		return nil, false, errors.Wrap(err, "returning to the node's network namespace")
	}
	return conn, true, dialErr
}
