package e2e

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/testenv"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// MetalLB's controller in the loop, with the Services flavour: every LoadBalancer
// Service ends with status.loadBalancer.ingress equal to exactly the addresses the
// IPAM-API registered for it, under its identity (single stack IPv4 and IPv6, dual
// stack, two Services sharing an address by consent, an address requested and then
// changed, a family dropped and asked for again, a move to another pool of the zone
// that keeps the address); a third Service asking for a shared address without the share key gets
// nothing MetalLB could announce; deleting them releases every address. A MetalLB pool
// with autoAssign on is named in a warning on the Service MetalLB gave an address of
// its own. The accounting oracle finds nothing wrong.
func TestMetalLBAnnouncesWhatTheIPAMAPIRegistered(t *testing.T) {
	onOwn.enter(t)
	g := newG(t)
	ctx := context.Background()
	w := newControlPlane(t, "metallb", nil)
	installWorkloadFlavour(t, w)
	mgr, err := w.StartManager(ctx, nil)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(mgr.Stop)
	metallb, err := w.StartMetalLB(ctx, localcluster.StandInPools())
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(metallb.Stop)
	newGlobalPool(t, w, "hnet-private-ipv4", "hnet-private", ipamv1alpha1.IPv4)
	newGlobalPool(t, w, "inet-ipv4", "inet", ipamv1alpha1.IPv4)
	newGlobalPool(t, w, "inet-ipv6", "inet", ipamv1alpha1.IPv6)
	ns := newNamespace(t, w, "lb")
	nsUID := uidOf(t, w, ns)

	service := func(name string, port int32, annotations map[string]string, families ...corev1.IPFamily) *corev1.Service {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Name: "p", Port: port, Protocol: corev1.ProtocolTCP}}, IPFamilies: families},
		}
		if len(families) == 2 {
			svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
		}
		g.Expect(w.Client.Create(ctx, svc)).To(Succeed())
		return svc
	}
	// announced waits until MetalLB's status of the Service lists n addresses and
	// returns them.
	announced := func(svc *corev1.Service, n int) []string {
		t.Helper()
		var ips []string
		g.Eventually(func() []string { ips = announcedNow(t, w, svc); return ips }).Should(HaveLen(n))
		return ips
	}
	// registeredFor checks that the IPAM-API holds every address for the Service's
	// identity (its name, its namespace's UID), and only for the Services named.
	registeredFor := func(ips []string, names ...string) {
		t.Helper()
		for _, ip := range ips {
			var holders []string
			for _, h := range activeHolders(t, w, ip) {
				g.Expect(h.NamespaceID).To(Equal(nsUID))
				holders = append(holders, h.ServiceName)
			}
			g.Expect(holders).To(ConsistOf(names), "the holders of %s in the IPAM-API", ip)
		}
	}

	v4 := service("v4", 443, map[string]string{ipamv1alpha1.ZoneAnnotation: "hnet-private"})
	ips := announced(v4, 1)
	g.Expect(netip.MustParsePrefix("10.0.0.0/8").Contains(netip.MustParseAddr(ips[0]))).To(BeTrue(), ips[0])
	registeredFor(ips, "v4")

	v6 := service("v6", 443, map[string]string{ipamv1alpha1.ZoneAnnotation: "inet", ipamv1alpha1.IPFamilyAnnotation: "ipv6"}, corev1.IPv6Protocol)
	ips = announced(v6, 1)
	g.Expect(netip.MustParsePrefix("2a05:1234::/64").Contains(netip.MustParseAddr(ips[0]))).To(BeTrue(), ips[0])
	registeredFor(ips, "v6")

	dual := service("dual", 443, map[string]string{ipamv1alpha1.ZoneAnnotation: "inet", ipamv1alpha1.IPFamilyAnnotation: "dual"},
		corev1.IPv4Protocol, corev1.IPv6Protocol)
	ips = announced(dual, 2)
	slices.SortFunc(ips, func(a, b string) int { return netip.MustParseAddr(a).Compare(netip.MustParseAddr(b)) })
	g.Expect(netip.MustParseAddr(ips[0]).Is4() && netip.MustParseAddr(ips[1]).Is6()).To(BeTrue(), "%v", ips)
	registeredFor(ips, "dual")

	// Two Services share one address by consent (the same key, ports that do not
	// overlap); MetalLB announces it for both.
	const key = "pre-shared-key-e2e-metallb-sharing-0001"
	first := service("first", 443, map[string]string{ipamv1alpha1.ZoneAnnotation: "inet", ipamv1alpha1.AllowLocalSharedIPAnnotation: key})
	shared := announced(first, 1)[0]
	second := service("second", 8443, map[string]string{ipamv1alpha1.ZoneAnnotation: "inet",
		ipamv1alpha1.AllowLocalSharedIPAnnotation: key, ipamv1alpha1.AddressesAnnotation: shared})
	g.Expect(announced(second, 1)).To(Equal([]string{shared}))
	registeredFor([]string{shared}, "first", "second")
	// A third asks for it without the key: its claim says so, and MetalLB is never
	// handed the address for it.
	third := service("third", 9443, map[string]string{ipamv1alpha1.ZoneAnnotation: "inet", ipamv1alpha1.AddressesAnnotation: shared})
	g.Eventually(func() []string {
		var reasons []string
		for _, e := range eventsOf(t, w, third) {
			reasons = append(reasons, e.Reason)
		}
		return reasons
	}).Should(ContainElement(ipamv1alpha1.ClaimReadyAddressInUseReason))
	got := &corev1.Service{}
	g.Expect(w.Client.Get(ctx, client.ObjectKeyFromObject(third), got)).To(Succeed())
	g.Expect(got.Annotations).NotTo(HaveKey("metallb.io/loadBalancerIPs"))
	g.Expect(got.Status.LoadBalancer.Ingress).To(BeEmpty())
	registeredFor([]string{shared}, "first", "second")

	// An address asked for, then another: MetalLB moves to it, and the first is released.
	old := announced(v4, 1)[0]
	update(t, w, v4, func(s *corev1.Service) { s.Annotations[ipamv1alpha1.AddressesAnnotation] = "10.99.0.7" })
	g.Eventually(func() []string { return announcedNow(t, w, v4) }).Should(Equal([]string{"10.99.0.7"}))
	registeredFor([]string{"10.99.0.7"}, "v4")
	g.Eventually(func() int { return len(activeHolders(t, w, old)) }).Should(BeZero(), "the old address %s is released", old)

	// A family dropped (as the README says: the ip-family annotation, and the Service's
	// policy single stack), then asked for again: MetalLB announces the IPv4 address
	// alone and the IPv6 one is released; then a new IPv6 address joins it.
	dualIPs := announcedNow(t, w, dual)
	slices.SortFunc(dualIPs, func(a, b string) int { return netip.MustParseAddr(a).Compare(netip.MustParseAddr(b)) })
	update(t, w, dual, func(s *corev1.Service) {
		s.Annotations[ipamv1alpha1.IPFamilyAnnotation] = "ipv4"
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
	})
	g.Eventually(func() []string { return announcedNow(t, w, dual) }).Should(Equal(dualIPs[:1]))
	g.Eventually(func() int { return len(activeHolders(t, w, dualIPs[1])) }).Should(BeZero(), "the dropped %s is released", dualIPs[1])
	registeredFor(dualIPs[:1], "dual")
	update(t, w, dual, func(s *corev1.Service) {
		s.Annotations[ipamv1alpha1.IPFamilyAnnotation] = "dual"
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	})
	ips = announced(dual, 2)
	g.Expect(ips).To(ContainElement(dualIPs[0]), "the IPv4 address stays")
	registeredFor(ips, "dual")

	// A move to another pool of the same zone and family keeps the address: MetalLB
	// announces it in every version of the Service on the way, and the IPAM-API holds it
	// for the Service alone.
	newGlobalPool(t, w, "inet-ipv4-b", "inet", ipamv1alpha1.IPv4)
	mover := service("mover", 443, map[string]string{ipamv1alpha1.ZoneAnnotation: "inet", ipamv1alpha1.PoolAnnotation: "inet-ipv4"})
	kept := announced(mover, 1)
	current := &corev1.Service{}
	g.Expect(w.Client.Get(ctx, client.ObjectKeyFromObject(mover), current)).To(Succeed())
	versions, err := testenv.WatchVersions(ctx, w.Config, &corev1.ServiceList{}, current)
	g.Expect(err).NotTo(HaveOccurred())
	update(t, w, mover, func(s *corev1.Service) { s.Annotations[ipamv1alpha1.PoolAnnotation] = "inet-ipv4-b" })
	g.Eventually(func(g Gomega) {
		claims := &ipamv1.IPAddressClaimList{}
		g.Expect(w.Client.List(ctx, claims, client.InNamespace(ns), client.MatchingLabels{ipamv1alpha1.ServiceNameLabel: "mover"})).To(Succeed())
		g.Expect(claims.Items).To(ConsistOf(And(HaveField("Spec.PoolRef.Name", "inet-ipv4-b"), HaveField("Status.AddressRef.Name", Not(BeEmpty())))))
	}).Should(Succeed())
	g.Expect(announcedNow(t, w, mover)).To(Equal(kept))
	for _, v := range versions.Stop() {
		g.Expect(v.Status.LoadBalancer.Ingress).To(ConsistOf(HaveField("IP", kept[0])),
			"version %s of the Service: MetalLB announced another address, or none", v.ResourceVersion)
	}
	registeredFor(kept, "mover")

	all := []*corev1.Service{v4, v6, dual, first, second, third, mover}
	// With autoAssign off, MetalLB announced nothing of its own through all of that: the
	// provider warned of nothing, moves and family switches included.
	for _, s := range all {
		for _, e := range eventsOf(t, w, s) {
			g.Expect(e.Reason).NotTo(Equal(ipamv1alpha1.EventMetalLBAssignedReason), "Service %s: %s", s.Name, e.Message)
		}
	}
	var addresses []string
	for _, s := range slices.Concat(all[:5], all[6:]) {
		addresses = append(addresses, announcedNow(t, w, s)...)
	}
	for _, s := range all {
		deleteAndWait(t, w, s)
	}
	for _, ip := range addresses {
		g.Expect(activeHolders(t, w, ip)).To(BeEmpty(), "%s is released", ip)
	}

	// A MetalLB pool with autoAssign on, by mistake, and a new Service whose claim
	// cannot bind yet (the IPAM-API answers 503): MetalLB announces an address it picked
	// itself, and the provider says so on the Service, naming MetalLB's pool. Once the
	// claim binds, MetalLB moves to the registered address. (One pool only: MetalLB
	// knows nothing of zones, and picks from any pool that assigns by itself.)
	pools := localcluster.StandInPools()
	for i := range pools {
		pools[i].AutoAssign = pools[i].Name == "hnet-private"
	}
	g.Expect(w.SetMetalLBPools(ctx, pools)).To(Succeed())
	g.Expect(simOf(w).SetFaults(ctx, sim.Faults{ErrorRate: 1, ErrorStatus: 503, ErrorBody: `{"message":"service unavailable"}`,
		Routes: []sim.Route{sim.RouteRegister}})).To(Succeed())
	t.Cleanup(func() { _ = simOf(w).SetFaults(context.Background(), sim.Faults{}) })
	eager := service("eager", 443, map[string]string{ipamv1alpha1.ZoneAnnotation: "hnet-private"})
	own := announced(eager, 1)[0]
	g.Eventually(func() []string {
		var notes []string
		for _, e := range eventsOf(t, w, eager) {
			if e.Reason == ipamv1alpha1.EventMetalLBAssignedReason {
				notes = append(notes, e.Message)
			}
		}
		return notes
	}).Should(ContainElement(And(ContainSubstring(own), ContainSubstring(`IPAddressPool "hnet-private"`), ContainSubstring("autoAssign: false"))))
	g.Expect(simOf(w).SetFaults(ctx, sim.Faults{})).To(Succeed())
	var handed string
	g.Eventually(func(g Gomega) {
		got := &corev1.Service{}
		g.Expect(w.Client.Get(ctx, client.ObjectKeyFromObject(eager), got)).To(Succeed())
		handed = got.Annotations["metallb.io/loadBalancerIPs"]
		g.Expect(handed).NotTo(BeEmpty())
		g.Expect(got.Status.LoadBalancer.Ingress).To(ConsistOf(HaveField("IP", handed)))
	}).WithTimeout(2 * timeout).Should(Succeed())
	registeredFor([]string{handed}, "eager")
	deleteAndWait(t, w, eager)
	g.Expect(activeHolders(t, w, handed)).To(BeEmpty(), "%s is released", handed)
	settledAccounts(t, w, map[string]bool{nsUID: true})
}

// update changes the Service with change and patches it.
func update(t *testing.T, w *localcluster.ControlPlane, svc *corev1.Service, change func(*corev1.Service)) {
	t.Helper()
	got := &corev1.Service{}
	g := newG(t)
	g.Expect(w.Client.Get(context.Background(), client.ObjectKeyFromObject(svc), got)).To(Succeed())
	patch := client.MergeFrom(got.DeepCopy())
	change(got)
	g.Expect(w.Client.Patch(context.Background(), got, patch)).To(Succeed())
}

// announcedNow is what MetalLB's status of the Service lists now.
func announcedNow(t *testing.T, w *localcluster.ControlPlane, svc *corev1.Service) []string {
	t.Helper()
	got := &corev1.Service{}
	newG(t).Expect(w.Client.Get(context.Background(), client.ObjectKeyFromObject(svc), got)).To(Succeed())
	var ips []string
	for _, in := range got.Status.LoadBalancer.Ingress {
		ips = append(ips, in.IP)
	}
	return ips
}
