package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/duration"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/lbservice"
)

// printStatus writes three tables: the claims of this provider's pools (Ready reason,
// address, zone, pool, age), the LoadBalancer Services it serves (their addresses), and
// the pools (zone, family, Ready, addresses in use). It is what the quickstart ends with
// and what `make status` (quickstart status) prints for any cluster: one look instead of
// three kubectl commands, since CAPI's IPAddressClaim has no printer column for Ready or
// the address.
func printStatus(ctx context.Context, c client.Reader, out io.Writer, now time.Time) error {
	pools, err := listPools(ctx, c)
	if err != nil {
		return err
	}
	claims := &ipamv1.IPAddressClaimList{}
	if err := c.List(ctx, claims); err != nil {
		return err
	}
	addrs := &ipamv1.IPAddressList{}
	if err := c.List(ctx, addrs); err != nil {
		return err
	}
	svcs := &corev1.ServiceList{}
	if err := c.List(ctx, svcs); err != nil {
		return err
	}
	addrOf := map[string]*ipamv1.IPAddress{}
	for i := range addrs.Items {
		a := &addrs.Items[i]
		addrOf[a.Namespace+"/"+a.Name] = a
	}

	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	row := func(cells ...string) { _, _ = fmt.Fprintln(w, strings.Join(cells, "\t")) }
	row("CLAIM", "READY", "ADDRESS", "ZONE", "POOL", "AGE")
	sort.Slice(claims.Items, func(i, j int) bool {
		return claims.Items[i].Namespace+"/"+claims.Items[i].Name < claims.Items[j].Namespace+"/"+claims.Items[j].Name
	})
	for _, cl := range claims.Items {
		if cl.Spec.PoolRef.APIGroup != ipamv1alpha1.GroupVersion.Group {
			continue // another provider's
		}
		key := cl.Namespace + "/" + cl.Name
		ready := "-"
		if cond := meta.FindStatusCondition(cl.Status.Conditions, ipamv1.IPAddressClaimReadyCondition); cond != nil {
			ready = string(cond.Status) + " " + cond.Reason
		}
		address, zone := "-", "-"
		if a := addrOf[cl.Namespace+"/"+cl.Status.AddressRef.Name]; cl.Status.AddressRef.Name != "" && a != nil {
			address, zone = a.Spec.Address, a.Labels[ipamv1alpha1.ZoneLabel]
		}
		row(key, ready, address, zone, cl.Spec.PoolRef.Kind+"/"+cl.Spec.PoolRef.Name, age(now, cl.CreationTimestamp.Time))
	}
	_ = w.Flush()

	_, _ = fmt.Fprintln(out)
	row("SERVICE", "ZONE", "FAMILY", "ADDRESSES", "EXTERNAL-IP", "AGE")
	sort.Slice(svcs.Items, func(i, j int) bool {
		return svcs.Items[i].Namespace+"/"+svcs.Items[i].Name < svcs.Items[j].Namespace+"/"+svcs.Items[j].Name
	})
	for _, s := range svcs.Items {
		if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
			continue
		}
		addresses := s.Annotations[lbservice.MetalLBLoadBalancerIPsAnnotation]
		if addresses == "" {
			addresses = "-"
		}
		var external []string // what MetalLB announces, IPv4 first as in ADDRESSES
		for _, in := range s.Status.LoadBalancer.Ingress {
			external = append(external, in.IP)
		}
		sort.SliceStable(external, func(i, j int) bool { return !strings.Contains(external[i], ":") && strings.Contains(external[j], ":") })
		row(s.Namespace+"/"+s.Name, orDash(s.Annotations[ipamv1alpha1.ZoneAnnotation]), orDash(s.Annotations[ipamv1alpha1.IPFamilyAnnotation]),
			addresses, orDash(strings.Join(external, ",")), age(now, s.CreationTimestamp.Time))
	}
	_ = w.Flush()

	_, _ = fmt.Fprintln(out)
	row("POOL", "ZONE", "FAMILY", "READY", "IN USE")
	for _, p := range pools {
		ready := "-"
		if cond := meta.FindStatusCondition(p.PoolStatus().Conditions, ipamv1alpha1.PoolReadyCondition); cond != nil {
			ready = string(cond.Status) + " " + cond.Reason
		}
		inUse := "0"
		if n := p.PoolStatus().AddressesInUse; n != nil {
			inUse = fmt.Sprint(*n)
		}
		row(poolName(p), p.PoolSpec().Zone, string(p.PoolSpec().IPFamily), ready, inUse)
	}
	return w.Flush()
}

// listPools returns every pool, global ones first, each sorted by name.
func listPools(ctx context.Context, c client.Reader) ([]ipamv1alpha1.Pool, error) {
	global := &ipamv1alpha1.GlobalVitistackIPPoolList{}
	if err := c.List(ctx, global); err != nil {
		return nil, err
	}
	local := &ipamv1alpha1.VitistackIPPoolList{}
	if err := c.List(ctx, local); err != nil {
		return nil, err
	}
	var out []ipamv1alpha1.Pool
	for i := range global.Items {
		out = append(out, &global.Items[i])
	}
	for i := range local.Items {
		out = append(out, &local.Items[i])
	}
	sort.SliceStable(out, func(i, j int) bool { return poolName(out[i]) < poolName(out[j]) })
	return out, nil
}

func poolName(p ipamv1alpha1.Pool) string {
	if p.GetNamespace() == "" {
		return ipamv1alpha1.GlobalVitistackIPPoolKind + "/" + p.GetName()
	}
	return ipamv1alpha1.VitistackIPPoolKind + "/" + p.GetNamespace() + "/" + p.GetName()
}

func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return duration.HumanDuration(now.Sub(t))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
