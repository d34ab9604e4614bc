package localcluster

import (
	"io"
	"os"
	"path/filepath"

	"github.com/pkg/errors"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
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
	// ClusterctlConfig is the clusterctl.yaml Clusterctl uses: the repository's, unless
	// set otherwise (to add an images: override, say).
	ClusterctlConfig string

	paths       Paths
	env         *envtest.Environment
	kcm         *Process
	apiLog      *os.File
	webhookPort int
	managers    int
	certDir     string
	caBundle    []byte
}

// StartControlPlane starts a control plane whose files and logs live in dir/name.
func StartControlPlane(dir, name string, p Paths) (*ControlPlane, error) {
	dir = filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errors.Wrap(err, "creating the control plane's directory")
	}
	apiLog, err := os.OpenFile(filepath.Join(dir, "kube-apiserver.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, errors.Wrap(err, "opening kube-apiserver's log")
	}
	env := &envtest.Environment{BinaryAssetsDirectory: p.Assets}
	api := env.ControlPlane.GetAPIServer()
	api.Out, api.Err = apiLog, apiLog
	// Dual-stack Services, as on the clusters the Service controller serves.
	api.Configure().Set("service-cluster-ip-range", "10.96.0.0/16,fd00:10:96::/112")
	cfg, err := env.Start()
	if err != nil {
		_ = apiLog.Close()
		return nil, errors.Wrapf(err, "starting etcd and kube-apiserver (see %s)", apiLog.Name())
	}
	cp := &ControlPlane{Name: name, Dir: dir, Config: cfg, paths: p, env: env, apiLog: apiLog,
		Kubeconfig: filepath.Join(dir, "kubeconfig"), ClusterctlConfig: p.ClusterctlConfig()}
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
	if cp.kcm, err = StartControllerManager(dir, p.Assets, cp.Kubeconfig, nil); err != nil {
		cp.Stop()
		return nil, err
	}
	return cp, nil
}

func (c *ControlPlane) restartControllerManager() error {
	c.kcm.Stop()
	var err error
	c.kcm, err = StartControllerManager(c.Dir, c.paths.Assets, c.Kubeconfig, nil)
	return err
}

// StartControllerManager runs kube-controller-manager's garbage collector and namespace
// controller against the API server of kubeconfig, its log in dir.
func StartControllerManager(dir, assets, kubeconfig string, also io.Writer) (*Process, error) {
	return startProcess(dir, "kube-controller-manager", also, nil, filepath.Join(assets, "kube-controller-manager"),
		"--kubeconfig="+kubeconfig, "--controllers=garbagecollector,namespace",
		"--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false", "--v=1")
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

// Stop stops kube-controller-manager, kube-apiserver and etcd.
func (c *ControlPlane) Stop() {
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
