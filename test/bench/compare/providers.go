package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

const (
	// claimNamespace holds the pool and the claims of every run.
	claimNamespace = "bench"
	// secretNamespace is this provider's --default-secret-namespace.
	secretNamespace = "bench-secrets"
	poolName        = "pool"
	// subnet and gateway of this provider's subnet-mode pool: inside the stand-in's
	// hnet-private zone (10.0.0.0/8), room for --big-n claims.
	subnet, gateway = "10.20.0.0/16", "10.20.0.1"
	// inClusterRange is the in-cluster provider's pool: 65,534 addresses.
	inClusterRange, inClusterPrefix, inClusterGateway = "10.0.0.0/16", 16, "10.0.0.1"
)

// running is a provider started on a control plane, ready to serve claims.
type running struct {
	proc    *localcluster.Process
	sim     *localcluster.Sim // nil for the in-cluster provider
	poolRef ipamv1.IPPoolReference
	// diagnostics is the provider's metrics (and, for this provider, pprof) address.
	diagnostics string
}

func (p *running) stop() {
	if p.proc != nil {
		p.proc.Stop()
	}
	if p.sim != nil {
		p.sim.Stop()
	}
}

// logs is the end of the provider's and the stand-in's logs, for a failed run.
func (p *running) logs() string {
	var b strings.Builder
	for _, proc := range []*localcluster.Process{p.proc, simProcess(p.sim)} {
		if proc != nil {
			fmt.Fprintf(&b, "--- last lines of %s:\n%s\n", proc.LogFile, proc.Tail(30))
		}
	}
	return b.String()
}

func simProcess(s *localcluster.Sim) *localcluster.Process {
	if s == nil {
		return nil
	}
	return s.Process
}

// startProvider installs the CRDs, the namespaces and the pool of spec's provider on
// cp, and starts the provider. The returned provider is stopped by the caller, also
// on error (what was started so far).
func startProvider(ctx context.Context, o *options, cp *localcluster.ControlPlane, spec runSpec) (*running, error) {
	p := &running{}
	crds := o.crds
	if spec.provider == inCluster {
		crds = o.inClusterCRDs
	}
	if err := cp.InstallCRDs(ctx, o.capiCRDs, crds); err != nil {
		return p, err
	}
	for _, ns := range []string{claimNamespace, secretNamespace} {
		if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return p, errors.Wrapf(err, "creating namespace %s", ns)
		}
	}
	ports, err := localcluster.FreePorts(2)
	if err != nil {
		return p, err
	}
	health, metrics := ports[0], ports[1]
	env := []string{"KUBECONFIG=" + cp.Kubeconfig}
	p.diagnostics = localcluster.HostPort(metrics)
	diagnostics := []string{"--diagnostics-address=" + p.diagnostics, "--leader-elect=false"}
	if o.heapProfile == "" || spec.provider != vitistack || !spec.memoryOnly {
		diagnostics = append(diagnostics, "--insecure-diagnostics")
	}
	switch spec.provider {
	case vitistack:
		paths := localcluster.Paths{Assets: o.assets, Manager: o.manager, Sim: o.sim}
		if p.sim, err = localcluster.StartSim(cp.Dir, paths, nil, "--latency", spec.latency.String()); err != nil {
			return p, err
		}
		pool := &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: claimNamespace, Name: poolName},
			Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4}}
		if spec.subnet {
			pool.Spec.Subnet, pool.Spec.Gateway = subnet, gateway
		}
		if err := cp.Client.Create(ctx, pool); err != nil {
			return p, errors.Wrap(err, "creating the VitistackIPPool")
		}
		p.poolRef = ipamv1.IPPoolReference{APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: "VitistackIPPool", Name: poolName}
		args := append([]string{"--ipam-api-url=" + p.sim.URL, "--enable-webhooks=false",
			"--default-secret-namespace=" + secretNamespace, "--health-addr=" + localcluster.HostPort(health)}, diagnostics...)
		args = append(args, o.managerArgs...)
		if p.proc, err = localcluster.StartProcess(cp.Dir, "manager", append(env, o.managerEnv...), o.manager, args...); err != nil {
			return p, err
		}
	case inCluster:
		pool := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "ipam.cluster.x-k8s.io/v1alpha2", "kind": "InClusterIPPool",
			"metadata": map[string]any{"namespace": claimNamespace, "name": poolName},
			"spec":     map[string]any{"addresses": []any{inClusterRange}, "prefix": int64(inClusterPrefix), "gateway": inClusterGateway},
		}}
		if err := cp.Client.Create(ctx, pool); err != nil {
			return p, errors.Wrap(err, "creating the InClusterIPPool")
		}
		p.poolRef = ipamv1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool", Name: poolName}
		args := append([]string{"--webhook-port=0", "--health-probe-bind-address=" + localcluster.HostPort(health)}, diagnostics...)
		if p.proc, err = localcluster.StartProcess(cp.Dir, "ipam-incluster", env, o.inCluster, args...); err != nil {
			return p, err
		}
	}
	if err := p.proc.WaitReady(ctx, localcluster.HTTPURL(health)+"/readyz", time.Minute); err != nil {
		return p, err
	}
	return p, waitPoolReady(ctx, cp, p, time.Minute)
}

// waitPoolReady waits until the provider has looked at its pool: Ready=True on a
// VitistackIPPool, a counted status.ipAddresses on an InClusterIPPool. The burst then
// measures claims, not the provider's start.
func waitPoolReady(ctx context.Context, cp *localcluster.ControlPlane, p *running, timeout time.Duration) error {
	key := client.ObjectKey{Namespace: claimNamespace, Name: poolName}
	ready := func() bool {
		if p.sim != nil {
			pool := &ipamv1alpha1.VitistackIPPool{}
			return cp.Client.Get(ctx, key, pool) == nil && meta.IsStatusConditionTrue(pool.Status.Conditions, ipamv1alpha1.PoolReadyCondition)
		}
		pool := &unstructured.Unstructured{}
		pool.SetAPIVersion("ipam.cluster.x-k8s.io/v1alpha2")
		pool.SetKind("InClusterIPPool")
		if cp.Client.Get(ctx, key, pool) != nil {
			return false
		}
		total, _, _ := unstructured.NestedInt64(pool.Object, "status", "ipAddresses", "total")
		return total > 0
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		if exited, err := p.proc.Exited(); exited {
			return false, errors.Errorf("%s exited (%v) before its pool was ready", p.proc.Name, err)
		}
		return ready(), nil
	})
	return errors.Wrapf(err, "waiting for the pool to be ready")
}
