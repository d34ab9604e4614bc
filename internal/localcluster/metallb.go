package localcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// MetalLBNamespace is where MetalLB's controller reads its IPAddressPools.
const MetalLBNamespace = "metallb-system"

// MetalLBPool is a MetalLB IPAddressPool.
type MetalLBPool struct {
	Name      string
	Addresses []string
	// AutoAssign lets MetalLB pick addresses itself; the provider's users set it false.
	AutoAssign bool
}

// StandInPools are MetalLB pools covering the IPAM-API stand-in's zones, one per zone,
// with autoAssign false, as the provider's documentation tells users to set them. A
// zone's pool holds both its families: MetalLB (v0.15) takes a dual-stack Service's
// two addresses from one pool, and refuses a pair that no single pool holds.
func StandInPools() []MetalLBPool {
	return []MetalLBPool{
		{Name: "inet", Addresses: []string{"83.118.168.0/22", "2a05:1234::/64"}},
		{Name: "hnet-private", Addresses: []string{"10.0.0.0/8", "172.16.0.0/12"}},
		{Name: "hnet-public", Addresses: []string{"83.118.128.0/22", "91.186.80.0/20"}},
	}
}

// StartMetalLB installs MetalLB's CRDs and pools on the control plane and starts its
// controller (no speaker: nothing needs announcing on loopback; its webhooks off, as
// nothing creates MetalLB objects through them here). It assigns the addresses a
// Service's metallb.io/loadBalancerIPs asks for to status.loadBalancer.ingress.
func (c *ControlPlane) StartMetalLB(ctx context.Context, pools []MetalLBPool) (*Process, error) {
	crds, err := filepath.Glob(filepath.Join(c.paths.MetalLBCRDs, "*.yaml"))
	if err != nil || len(crds) == 0 {
		return nil, errors.Errorf("no MetalLB CRDs in %q: run 'make e2e-assets'", c.paths.MetalLBCRDs)
	}
	for _, f := range crds {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if _, err := c.Apply(ctx, string(b)); err != nil {
			return nil, errors.Wrapf(err, "installing MetalLB's CRD %s", filepath.Base(f))
		}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: MetalLBNamespace}}
	if err := c.Client.Create(ctx, ns); client.IgnoreAlreadyExists(err) != nil {
		return nil, errors.Wrap(err, "creating MetalLB's namespace")
	}
	if err := c.SetMetalLBPools(ctx, pools); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p, err := startProcess(c.Dir, "metallb-controller", nil, nil, c.paths.MetalLB,
		"--kubeconfig", c.Kubeconfig, "--namespace", MetalLBNamespace, "--webhook-mode", "disabled",
		"--port", strconv.Itoa(port), "--log-level", "info")
	if err != nil {
		return nil, err
	}
	return p, nil
}

// SetMetalLBPools creates or updates MetalLB IPAddressPools (applied until the CRD just
// created is served).
func (c *ControlPlane) SetMetalLBPools(ctx context.Context, pools []MetalLBPool) error {
	var doc strings.Builder
	for _, p := range pools {
		fmt.Fprintf(&doc, "---\napiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: %s, namespace: %s}\n"+
			"spec: {addresses: [%s], autoAssign: %t}\n", p.Name, MetalLBNamespace, strings.Join(p.Addresses, ", "), p.AutoAssign)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.Apply(ctx, doc.String())
		if err == nil || time.Now().After(deadline) {
			return errors.Wrap(err, "applying MetalLB's IPAddressPools")
		}
		time.Sleep(200 * time.Millisecond)
	}
}
