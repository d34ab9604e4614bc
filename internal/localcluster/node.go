package localcluster

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NodePaths are the programs a node runs, besides the control plane's.
type NodePaths struct {
	// Kubelet and KubeProxy are of the control plane's Kubernetes version.
	Kubelet, KubeProxy string
	// CNI is the directory of the CNI plugins (bridge, host-local, loopback, portmap).
	CNI string
	// Containerd and Ctr are containerd's daemon and client; runc and
	// containerd-shim-runc-v2 are looked up in PATH, nft (kube-proxy's nftables mode
	// and portmap) too.
	Containerd, Ctr string
	// Images are OCI archives imported before the kubelet starts: the pause image
	// (PauseImage) among them.
	Images []string
}

// PauseImage is the Pod sandbox image containerd is told to use; an archive of it must
// be among NodePaths.Images, for nothing can be pulled.
const PauseImage = "registry.k8s.io/pause:3.10"

// NodeName is the node's name.
const NodeName = "node"

// Node is a kubelet, its containerd and kube-proxy, registered with a node control
// plane (StartNodeControlPlane), the way Kubernetes' hack/local-up-cluster.sh runs
// one: inside the node's network namespace (RunInNodeNamespace) and a mount namespace
// of its own, cgroups v1 as these machines have them (cgroupfs), Pods on a CNI bridge
// in PodCIDR, Services routed by kube-proxy's nftables rules in the node's namespace
// only.
type Node struct {
	Dir string

	containerd, kubelet, proxy *Process
	socket                     string
	ctr                        string
	// machineTunables are the machine's kernelTunables when the node started, and
	// machineState what hostStateDirs held.
	machineTunables map[string]string
	machineState    []string
	// madeDirs are the hostStateDirs the machine did not have: the node's mount points
	// for its own, removed on Stop.
	madeDirs []string
}

// StartNode starts containerd, imports p.Images, starts the kubelet and kube-proxy, and
// waits until the node is Ready. Its files and logs live in dir/node.
func StartNode(dir string, cp *ControlPlane, p NodePaths) (n *Node, err error) {
	if _, ok := InNodeNamespace(); !ok {
		return nil, errors.New("a node runs only inside the network namespace RunInNodeNamespace makes")
	}
	// Stop kills what runs in the kubepods cgroups: only the node's may.
	if dirs := cgroupDirs("kubepods"); len(dirs) > 0 {
		return nil, errors.Errorf("a kubelet already runs on this machine (%s exists): the node needs a machine of its own", dirs[len(dirs)-1])
	}
	dir = filepath.Join(dir, "node")
	n = &Node{Dir: dir, socket: filepath.Join(dir, "containerd", "containerd.sock"), ctr: p.Ctr,
		machineTunables: readTunables(), machineState: stateEntries()}
	for _, d := range hostStateDirs {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			n.madeDirs = append(n.madeDirs, d)
		}
	}
	defer func() {
		if err != nil {
			n.Stop()
		}
	}()
	for _, d := range []string{"containerd", "net.d", "kubelet", "kubelet-pki", "volume-plugins", "pod-logs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return n, errors.Wrap(err, "making the node's directories")
		}
	}
	if err := n.writeConfig(p); err != nil {
		return n, err
	}
	script, err := n.mountNamespaceScript()
	if err != nil {
		return n, err
	}
	if n.containerd, err = startProcess(dir, "containerd", nil, nil, "unshare", "--mount", "--propagation", "private", "--",
		"sh", "-ec", script, "node", filepath.Join(dir, "sysctl"), p.Containerd, "--config", filepath.Join(dir, "containerd.toml")); err != nil {
		return n, err
	}
	if err := waitFor(n.containerd, time.Minute, "containerd serving", func() error {
		_, err := n.ctrRun("version")
		return err
	}); err != nil {
		return n, err
	}
	for _, image := range p.Images {
		if out, err := n.ctrRun("images", "import", image); err != nil {
			return n, errors.Wrapf(err, "importing %s: %s", image, out)
		}
	}
	if n.kubelet, err = startProcess(dir, "kubelet", nil, nil, "nsenter", "--mount=/proc/"+strconv.Itoa(n.containerd.Pid())+"/ns/mnt", "--",
		p.Kubelet, "--config="+filepath.Join(dir, "kubelet.yaml"), "--kubeconfig="+cp.Kubeconfig,
		"--root-dir="+filepath.Join(dir, "kubelet"), "--cert-dir="+filepath.Join(dir, "kubelet-pki"),
		"--node-ip="+NodeIP, "--hostname-override="+NodeName, "--v=2"); err != nil {
		return n, err
	}
	if n.proxy, err = startProcess(dir, "kube-proxy", nil, nil, p.KubeProxy,
		"--kubeconfig="+cp.Kubeconfig, "--hostname-override="+NodeName, "--proxy-mode=nftables",
		"--cluster-cidr="+PodCIDR, "--conntrack-max-per-core=0",
		"--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256", "--v=2"); err != nil {
		return n, err
	}
	return n, waitFor(n.kubelet, 2*time.Minute, "Ready node", func() error {
		var node corev1.Node
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := cp.Client.Get(ctx, client.ObjectKey{Name: NodeName}, &node); err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status == corev1.ConditionTrue {
					return nil
				}
				return errors.Errorf("the node is not Ready: %s", c.Message)
			}
		}
		return errors.New("the node has no Ready condition yet")
	})
}

// kernelTunables are the kernel settings the kubelet wants (and writes, unless
// protectKernelDefaults makes it refuse to start): they are the whole machine's.
var kernelTunables = map[string]string{
	"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10", "kernel/panic_on_oops": "1",
	"kernel/keys/root_maxkeys": "1000000", "kernel/keys/root_maxbytes": "25000000",
}

// hostStateDirs are where containerd, runc, the CNI plugins and the kubelet keep state
// outside the directories they are given: shim sockets and runc's state, the CNI's
// results, Pods' network namespace names, the kubelet's log links. The node has its own,
// empty, in its mount namespace.
var hostStateDirs = []string{"/run/containerd", "/run/netns", "/var/lib/cni", "/var/log/containers"}

// mountNamespaceScript is the shell that gives the node a mount namespace of its own
// before it runs containerd (the kubelet joins it): every Pod's mount (volumes, root
// filesystems, network namespaces) and the state in hostStateDirs live and end there,
// and the kernel settings the kubelet wants read as it wants them from files bound over
// /proc/sys, where its writes land too, so the machine's stay as they are. It takes
// containerd and its configuration as its arguments, and ends by running it.
func (n *Node) mountNamespaceScript() (string, error) {
	dir := filepath.Join(n.Dir, "sysctl")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", errors.Wrap(err, "making the node's directories")
	}
	var script strings.Builder
	for _, d := range hostStateDirs {
		fmt.Fprintf(&script, "mkdir -p %[1]s && mount -t tmpfs -o mode=0755 node-state %[1]s\n", d)
	}
	for _, key := range slices.Sorted(maps.Keys(kernelTunables)) {
		file := filepath.Join(dir, strings.ReplaceAll(key, "/", "."))
		if err := os.WriteFile(file, []byte(kernelTunables[key]+"\n"), 0o600); err != nil {
			return "", errors.Wrap(err, "writing the node's kernel settings")
		}
		fmt.Fprintf(&script, "mount --bind \"$1/%s\" /proc/sys/%s\n", filepath.Base(file), key)
	}
	script.WriteString(`shift; exec "$@"`)
	return script.String(), nil
}

// ctrRun runs ctr against the node's containerd in the Pods' namespace (k8s.io).
func (n *Node) ctrRun(args ...string) ([]byte, error) {
	return exec.Command(n.ctr, append([]string{"--address", n.socket, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
}

// writeConfig writes containerd's, the CNI's and the kubelet's configuration.
func (n *Node) writeConfig(p NodePaths) error {
	d := n.Dir
	// restrict_oom_score_adj: these machines forbid lowering a process's oom_score_adj,
	// which runc otherwise does for a Pod's sandbox.
	containerd := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[7]q
`, filepath.Join(d, "containerd", "root"), filepath.Join(d, "containerd", "state"), n.socket,
		filepath.Join(d, "containerd", "opt"), PauseImage, p.CNI, filepath.Join(d, "net.d"))
	cni := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "node",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "portmap", "backend": "nftables", "capabilities": {"portMappings": true}}
  ]
}
`, PodCIDR, filepath.Join(d, "cni-ipam"))
	// failCgroupV1: these machines have cgroups v1. No eviction and no image garbage
	// collection: a test's disk is what it is. No DNS Service: Pods reach kube-apiserver
	// and each other by address. syncFrequency 10s (a minute by default): a Secret's
	// change reaches its volumes within seconds, where MetalLB's controller waits for the
	// certificate it has just written (its liveness probe restarted it after 30 s).
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%[1]s
address: %[2]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
failSwapOn: false
resolvConf: %[3]q
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
volumePluginDir: %[4]q
podLogsDir: %[5]q
serializeImagePulls: false
syncFrequency: 10s
`, n.socket, NodeIP, filepath.Join(d, "resolv.conf"), filepath.Join(d, "volume-plugins"), filepath.Join(d, "pod-logs"))
	for file, data := range map[string]string{
		"containerd.toml": containerd, filepath.Join("net.d", "10-node.conflist"): cni,
		"kubelet.yaml": kubelet, "resolv.conf": "",
	} {
		if err := os.WriteFile(filepath.Join(d, file), []byte(data), 0o600); err != nil {
			return errors.Wrap(err, "writing the node's configuration")
		}
	}
	return nil
}

// Stop stops the node and leaves nothing of it on the machine: kube-proxy and the
// kubelet, every Pod's processes (the kubepods cgroups), containerd's shims and
// containerd, the last processes of the node's mount namespace, whose mounts go with
// it, and the kubepods cgroups.
func (n *Node) Stop() {
	if n == nil {
		return
	}
	n.proxy.Stop()
	n.kubelet.Stop()
	// containerd first, so that nothing starts a shim or a container any more (one
	// being started as a test failed was seen to outlive a single round of kills);
	// then what it started, until nothing is left.
	n.containerd.Stop()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		killCgroups("kubepods")
		killMatching(n.socket)
		if (len(ProcessesWith(n.socket)) == 0 && !cgroupsHaveProcesses("kubepods")) || time.Now().After(deadline) {
			break
		}
	}
	removeCgroups("kubepods")
	// The node's mount points, which the machine did not have: what landed in them on
	// the machine's side (runc's state directory was once seen there) is the node's too.
	for _, d := range slices.Backward(n.madeDirs) {
		_ = os.RemoveAll(d)
	}
}

// readTunables reads kernelTunables as this process sees them.
func readTunables() map[string]string {
	values := make(map[string]string, len(kernelTunables))
	for key := range kernelTunables {
		b, err := os.ReadFile(filepath.Join("/proc/sys", key))
		if err != nil {
			values[key] = err.Error()
			continue
		}
		values[key] = strings.TrimSpace(string(b))
	}
	return values
}

// Leftovers names, after Stop, what the node left on the machine: processes of its
// containerd, kubepods cgroups, state in hostStateDirs that was not there, kernel
// settings other than they were. Empty is the promise.
func (n *Node) Leftovers() []string {
	var left []string
	if pids := ProcessesWith(n.socket); len(pids) > 0 {
		left = append(left, fmt.Sprintf("processes of the node's containerd: %v", pids))
	}
	if dirs := cgroupDirs("kubepods"); len(dirs) > 0 {
		left = append(left, fmt.Sprintf("cgroups: %v", dirs))
	}
	for _, e := range stateEntries() {
		if !slices.Contains(n.machineState, e) {
			left = append(left, "state on the machine's disk: "+e)
		}
	}
	for _, d := range n.madeDirs {
		if _, err := os.Stat(d); err == nil {
			left = append(left, "a directory the machine did not have: "+d)
		}
	}
	now := readTunables()
	for _, key := range slices.Sorted(maps.Keys(now)) {
		if now[key] != n.machineTunables[key] {
			left = append(left, fmt.Sprintf("kernel setting %s is %s, was %s", key, now[key], n.machineTunables[key]))
		}
	}
	return left
}

// stateEntries are the files and directories in hostStateDirs, as this process sees
// them (the machine's).
func stateEntries() []string {
	var all []string
	for _, d := range hostStateDirs {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			all = append(all, filepath.Join(d, e.Name()))
		}
	}
	return all
}

// cgroupDirs are the directories of cgroup name in every v1 hierarchy, deepest first.
func cgroupDirs(name string) []string {
	var dirs []string
	roots, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", name))
	for _, root := range roots {
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
	}
	slices.SortFunc(dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return dirs
}

// killCgroups kills every process in cgroup name and below.
func killCgroups(name string) {
	for _, dir := range cgroupDirs(name) {
		b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		killPIDs(string(b))
	}
}

// cgroupsHaveProcesses: a cgroup name or one below it has a process.
func cgroupsHaveProcesses(name string) bool {
	for _, dir := range cgroupDirs(name) {
		if b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs")); len(strings.TrimSpace(string(b))) > 0 {
			return true
		}
	}
	return false
}

// killPIDs kills the processes whose IDs pids lists (one a line, as cgroup.procs and ip
// netns pids print them), never this one or init.
func killPIDs(pids string) {
	for _, f := range strings.Fields(pids) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// removeCgroups removes cgroup name and below, once their processes are gone.
func removeCgroups(name string) {
	deadline := time.Now().Add(10 * time.Second)
	for _, dir := range cgroupDirs(name) {
		for syscall.Rmdir(dir) == syscall.EBUSY && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// killMatching kills every process whose command line holds s.
func killMatching(s string) {
	for _, pid := range ProcessesWith(s) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// ProcessesWith are the processes on the machine, other than this one, whose command
// line holds s.
func ProcessesWith(s string) []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), s) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}
