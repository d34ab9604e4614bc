package localcluster

import (
	"os"
	"path/filepath"

	"github.com/pkg/errors"
)

// Paths are the binaries and the clusterctl repository a local cluster runs.
type Paths struct {
	// Assets holds kube-apiserver, etcd and kube-controller-manager (KUBEBUILDER_ASSETS).
	Assets string
	// Clusterctl, Manager, Sim and Quickstart are the clusterctl, manager, ipam-api-sim
	// and quickstart binaries; Kubectl is kubectl of the control plane's version.
	Clusterctl, Manager, Sim, Quickstart, Kubectl string
	// Repository is the offline clusterctl repository, with clusterctl.yaml at its root.
	Repository string
	// Version is the provider's version in the repository, Image its default image.
	Version, Image string
	// MetalLB is MetalLB's controller binary, MetalLBCRDs the directory of its CRDs.
	MetalLB, MetalLBCRDs string
	// Prometheus is the Prometheus server's binary, Helm Helm's.
	Prometheus, Helm string
	// Previous is the previous release's folder (make previous-release): its manager,
	// ipam-components.yaml, ipam-components-workload.yaml and metadata.yaml.
	Previous string
}

// PathsFromEnv reads the paths `make e2e-assets` exports. ok is false when
// E2E_REPOSITORY is not set (not run through make).
func PathsFromEnv() (p Paths, ok bool) {
	p = Paths{
		Assets:      os.Getenv("KUBEBUILDER_ASSETS"),
		Clusterctl:  os.Getenv("E2E_CLUSTERCTL"),
		Manager:     os.Getenv("E2E_MANAGER"),
		Sim:         os.Getenv("E2E_IPAM_API_SIM"),
		Quickstart:  os.Getenv("E2E_QUICKSTART"),
		Kubectl:     os.Getenv("E2E_KUBECTL"),
		Repository:  os.Getenv("E2E_REPOSITORY"),
		Version:     os.Getenv("E2E_VERSION"),
		Image:       os.Getenv("E2E_IMAGE"),
		MetalLB:     os.Getenv("E2E_METALLB"),
		MetalLBCRDs: os.Getenv("E2E_METALLB_CRDS"),
		Prometheus:  os.Getenv("E2E_PROMETHEUS"),
		Helm:        os.Getenv("E2E_HELM"),
		Previous:    os.Getenv("E2E_PREVIOUS_RELEASE"),
	}
	return p, p.Repository != ""
}

// ClusterctlConfig is the repository's clusterctl.yaml.
func (p Paths) ClusterctlConfig() string { return filepath.Join(p.Repository, "clusterctl.yaml") }

// Check reports the first missing file, with the make target that builds it.
func (p Paths) Check() error {
	for _, f := range []string{
		filepath.Join(p.Assets, "kube-apiserver"), filepath.Join(p.Assets, "etcd"),
		filepath.Join(p.Assets, "kube-controller-manager"),
		p.Clusterctl, p.Manager, p.Sim, p.Quickstart, p.Kubectl, p.ClusterctlConfig(), p.MetalLB, p.MetalLBCRDs,
	} {
		if _, err := os.Stat(f); err != nil {
			return errors.Errorf("%s is missing: run 'make e2e-assets test-assets'", f)
		}
	}
	if p.Version == "" {
		return errors.New("the provider version is not set (E2E_VERSION)")
	}
	return nil
}
