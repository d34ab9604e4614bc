package localcluster

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/pkg/errors"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
)

// ControlPlane is etcd, kube-apiserver and kube-controller-manager (garbage collector
// and namespace controller only: nothing here runs Pods) on loopback.
type ControlPlane struct {
	// Name tells control planes apart in logs and directories.
	Name string
	// Dir holds the kubeconfigs, certificates and logs.
	Dir string
	// Kubeconfig is an administrator's kubeconfig file; Config and Client the same access.
	Kubeconfig string
	Config     *rest.Config
	Client     client.Client
	// Outages are the RestartAPIServer calls so far: requests refused in them (RBAC's
	// caches are empty until the API server is ready) are not the provider's fault.
	Outages []Outage
	// ClusterctlConfig is the clusterctl.yaml Clusterctl uses: the repository's, unless
	// set otherwise (to add an images: override, say).
	ClusterctlConfig string
	// ManagerBinary is the manager StartManager runs: the build under test
	// (Paths.Manager), unless set otherwise (an earlier release, for the upgrade tests).
	ManagerBinary string

	paths       Paths
	env         *envtest.Environment
	kcm         *Process
	apiLog      *os.File
	webhookPort int
	managers    int
	certDir     string
	caBundle    []byte
	// scheduler runs on a node's control plane only (whose kube-controller-manager runs
	// every controller).
	scheduler *Process
}

// StartControlPlane starts a control plane whose files and logs live in dir/name.
func StartControlPlane(dir, name string, p Paths) (*ControlPlane, error) {
	return startControlPlane(dir, name, p, "")
}

// StartNodeControlPlane starts a control plane that a node's Pods use as a cluster's
// do: kube-apiserver serves on nodeIP:6443 with a certificate for the kubernetes
// Service's address, admits Pods with their service account's token, and calls
// webhooks at their Pods' addresses (there is no Service routing on its host);
// kube-controller-manager runs every controller and publishes the CA to every
// namespace; kube-scheduler places Pods. Only inside the network namespace
// RunInNodeNamespace makes.
func StartNodeControlPlane(dir, name string, p Paths, nodeIP string) (*ControlPlane, error) {
	return startControlPlane(dir, name, p, nodeIP)
}

func startControlPlane(dir, name string, p Paths, nodeIP string) (*ControlPlane, error) {
	dir = filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errors.Wrap(err, "creating the control plane's directory")
	}
	apiLog, err := os.OpenFile(filepath.Join(dir, "kube-apiserver.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, errors.Wrap(err, "opening kube-apiserver's log")
	}
	// etcd's data and kube-apiserver's certificates in dir, not in directories envtest
	// removes on Stop: RestartAPIServer starts them again on the same data. A new
	// control plane starts empty.
	for _, sub := range []string{"etcd", "kube-apiserver"} {
		_ = os.RemoveAll(filepath.Join(dir, sub))
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			_ = apiLog.Close()
			return nil, errors.Wrap(err, "creating the control plane's directory")
		}
	}
	// kube-apiserver may take more than 20 s to finish its watches when asked to stop:
	// it and etcd are killed after 3 s, as a reboot of their host would.
	env := &envtest.Environment{BinaryAssetsDirectory: p.Assets, ControlPlaneStopTimeout: 3 * time.Second}
	env.ControlPlane.Etcd = &envtest.Etcd{DataDir: filepath.Join(dir, "etcd")}
	api := env.ControlPlane.GetAPIServer()
	api.Out, api.Err = apiLog, apiLog
	api.CertDir = filepath.Join(dir, "kube-apiserver")
	// Dual-stack Services, as on the clusters the Service controller serves.
	api.Configure().Set("service-cluster-ip-range", "10.96.0.0/16,fd00:10:96::/112")
	if nodeIP != "" {
		if err := forPods(api, nodeIP); err != nil {
			_ = apiLog.Close()
			return nil, err
		}
	}
	cfg, err := env.Start()
	if err != nil {
		_ = apiLog.Close()
		return nil, errors.Wrapf(err, "starting etcd and kube-apiserver (see %s)", apiLog.Name())
	}
	cp := &ControlPlane{Name: name, Dir: dir, Config: cfg, paths: p, env: env, apiLog: apiLog,
		Kubeconfig: filepath.Join(dir, "kubeconfig"), ClusterctlConfig: p.ClusterctlConfig(), ManagerBinary: p.Manager}
	if err := clientcmd.WriteToFile(*KubeconfigFor(cfg, name), cp.Kubeconfig); err != nil {
		cp.Stop()
		return nil, errors.Wrap(err, "writing the kubeconfig")
	}
	scheme := manager.NewScheme()
	utilruntime.Must(apiextensionsv1.AddToScheme(scheme))
	if cp.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		cp.Stop()
		return nil, errors.Wrap(err, "creating a client")
	}
	if cp.kcm, err = startControllerManager(dir, p.Assets, cp.Kubeconfig, nodeIP != ""); err != nil {
		cp.Stop()
		return nil, err
	}
	if nodeIP != "" {
		if cp.scheduler, err = startProcess(dir, "kube-scheduler", nil, nil, filepath.Join(p.Assets, "kube-scheduler"),
			"--kubeconfig="+cp.Kubeconfig, "--leader-elect=false", "--secure-port=0", "--v=1"); err != nil {
			cp.Stop()
			return nil, err
		}
	}
	return cp, nil
}

// RestartAPIServer stops kube-apiserver and etcd, as a reboot of their host does, waits
// down, and starts them again on the same ports, certificates and data; every client
// (kube-controller-manager, managers, Client) reconnects on its own. It starts
// kube-controller-manager again if it ended meanwhile.
func (c *ControlPlane) RestartAPIServer(down time.Duration) error {
	outage := Outage{From: time.Now()}
	defer func() {
		outage.To = time.Now()
		c.Outages = append(c.Outages, outage)
	}()
	plane := &c.env.ControlPlane
	// Stop kills a process that does not end within the stop timeout, without waiting
	// for it to go: wait until its port is free.
	_ = plane.APIServer.Stop()
	if err := waitPortFree(plane.APIServer.HostPort()); err != nil {
		return errors.Wrap(err, "stopping kube-apiserver")
	}
	_ = plane.Etcd.Stop()
	if err := waitPortFree(plane.Etcd.URL.Host); err != nil {
		return errors.Wrap(err, "stopping etcd")
	}
	time.Sleep(down)
	if err := plane.Etcd.Start(); err != nil {
		return errors.Wrap(err, "starting etcd again")
	}
	plane.APIServer.EtcdURL = plane.Etcd.URL
	if err := plane.APIServer.Start(); err != nil {
		return errors.Wrapf(err, "starting kube-apiserver again (see %s)", c.apiLog.Name())
	}
	if err := c.waitReady(time.Minute); err != nil {
		return err
	}
	if exited, _ := c.kcm.Exited(); exited {
		return c.restartControllerManager()
	}
	return nil
}

// Outage is a time when the API server did not serve every request as usual: from its
// stop until it answered ready again (/readyz: RBAC and its other caches synced).
type Outage struct{ From, To time.Time }

// waitReady waits until kube-apiserver answers /readyz with ok.
func (c *ControlPlane) waitReady(timeout time.Duration) error {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil && string(body) == "ok" {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.Errorf("/readyz answered %q", body)
			}
			return errors.Wrapf(err, "kube-apiserver is not ready after %s (see %s)", timeout, c.apiLog.Name())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitPortFree waits up to 10 s until nothing listens on hostPort.
func waitPortFree(hostPort string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", hostPort, time.Second)
		if err != nil {
			return nil
		}
		_ = conn.Close()
		if time.Now().After(deadline) {
			return errors.Errorf("%s still listens after 10 s", hostPort)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *ControlPlane) restartControllerManager() error {
	c.kcm.Stop()
	var err error
	c.kcm, err = startControllerManager(c.Dir, c.paths.Assets, c.Kubeconfig, c.scheduler != nil)
	return err
}

// StartControllerManager runs kube-controller-manager's garbage collector and namespace
// controller against the API server of kubeconfig, its log in dir.
func StartControllerManager(dir, assets, kubeconfig string, also io.Writer) (*Process, error) {
	return runControllerManager(dir, assets, kubeconfig, also, "--controllers=garbagecollector,namespace")
}

func runControllerManager(dir, assets, kubeconfig string, also io.Writer, args ...string) (*Process, error) {
	return startProcess(dir, "kube-controller-manager", also, nil, filepath.Join(assets, "kube-controller-manager"),
		append([]string{"--kubeconfig=" + kubeconfig, "--leader-elect=false", "--secure-port=0",
			"--use-service-account-credentials=false", "--v=1"}, args...)...)
}

// startControllerManager is StartControllerManager, or, for a node's control plane,
// kube-controller-manager with every controller a cluster runs (Deployments,
// EndpointSlices, service accounts, the CA in every namespace, node lifecycle).
func startControllerManager(dir, assets, kubeconfig string, forNode bool) (*Process, error) {
	if !forNode {
		return StartControllerManager(dir, assets, kubeconfig, nil)
	}
	certs := filepath.Join(dir, "kube-apiserver")
	return runControllerManager(dir, assets, kubeconfig, nil, "--controllers=*",
		"--root-ca-file="+filepath.Join(certs, nodeCAFile), "--service-account-private-key-file="+filepath.Join(certs, "sa-signer.key"))
}

// KubeconfigFor turns a rest.Config into a kubeconfig with one context, name.
func KubeconfigFor(cfg *rest.Config, name string) *clientcmdapi.Config {
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken,
		Impersonate: cfg.Impersonate.UserName, ImpersonateGroups: cfg.Impersonate.Groups}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	return kc
}

// Stop stops kube-scheduler (a node's control plane), kube-controller-manager,
// kube-apiserver and etcd.
func (c *ControlPlane) Stop() {
	c.scheduler.Stop()
	c.kcm.Stop()
	if c.env != nil {
		_ = c.env.Stop()
	}
	if c.apiLog != nil {
		_ = c.apiLog.Close()
	}
}

func labelsNot(key, value string) (labels.Selector, error) {
	req, err := labels.NewRequirement(key, selection.NotEquals, []string{value})
	if err != nil {
		return nil, err
	}
	return labels.NewSelector().Add(*req), nil
}
