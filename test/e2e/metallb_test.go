package e2e

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
// changed, a family dropped and asked for again, a single-stack Service switched to dual
// stack with no version of either announcing an address the IPAM-API did not register
// for it, a move to another pool of the zone that keeps the address); a third Service
// asking for a shared address without the share key gets nothing MetalLB could
// announce; deleting them releases every address. The Service
// webhook refuses the updates MetalLB would answer by announcing nothing for a Service:
// the ip-family annotation alone dropping a family of a dual-stack Service, and a port
// of a sharing Service moved onto the other's (no version of either sharing Service
// lacks the shared address). A MetalLB pool with autoAssign on is named in a warning on
// the Service MetalLB gave an address of its own. A Service whose registered address no
// MetalLB pool covers gets nothing from MetalLB, and the provider relays MetalLB's
// refusal on it (MetalLBRefused); it gets the address once the pool covers it. The
// accounting oracle finds nothing wrong.
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
	// The second moves its port onto the first's: refused, naming the first and the
	// port (MetalLB would withdraw the shared address from one of them); a port of its
	// own is admitted. Neither loses the address in any version of it from here to the
	// end of the steps below: MetalLB's controller handles one Service at a time, in
	// order, so it has seen these updates once it has announced the later steps'.
	firstVersions, secondVersions := watchService(t, w, first), watchService(t, w, second)
	err = tryUpdate(w, second, func(s *corev1.Service) { s.Spec.Ports[0].Port = 443 })
	g.Expect(err).To(MatchError(SatisfyAll(ContainSubstring("Service "+ns+"/first"), ContainSubstring("TCP/443"),
		ContainSubstring(ipamv1alpha1.AllowLocalSharedIPAnnotation))), "the second's port moved onto the first's")
	update(t, w, second, func(s *corev1.Service) { s.Spec.Ports[0].Port = 8080 })

	// An address asked for, then another: MetalLB moves to it, and the first is released.
	old := announced(v4, 1)[0]
	update(t, w, v4, func(s *corev1.Service) { s.Annotations[ipamv1alpha1.AddressesAnnotation] = "10.99.0.7" })
	g.Eventually(func() []string { return announcedNow(t, w, v4) }).Should(Equal([]string{"10.99.0.7"}))
	registeredFor([]string{"10.99.0.7"}, "v4")
	g.Eventually(func() int { return len(activeHolders(t, w, old)) }).Should(BeZero(), "the old address %s is released", old)

	// A family dropped, then asked for again. The ip-family annotation alone is refused,
	// naming the fix: MetalLB refuses one address for a Service of two families, and
	// would announce none for good. With the Service's families and
	// metallb.io/loadBalancerIPs set to its IPv4 address in the same patch (as
	// docs/services.md says), MetalLB goes straight from the pair to the IPv4 address
	// alone, and the IPv6 one is released: every version of the Service shows the pair
	// until MetalLB has seen the patch, then the IPv4 address alone, never none and
	// never another address. (Without loadBalancerIPs in the patch, MetalLB refuses the
	// single-stack Service whose loadBalancerIPs still name two addresses, and withdraws
	// both until the provider writes the IPv4 address alone.) Then a new IPv6 address
	// joins it.
	dualIPs := announcedNow(t, w, dual)
	slices.SortFunc(dualIPs, func(a, b string) int { return netip.MustParseAddr(a).Compare(netip.MustParseAddr(b)) })
	dualVersions := watchService(t, w, dual)
	err = tryUpdate(w, dual, func(s *corev1.Service) { s.Annotations[ipamv1alpha1.IPFamilyAnnotation] = "ipv4" })
	g.Expect(err).To(MatchError(SatisfyAll(ContainSubstring(ipamv1alpha1.IPFamilyAnnotation), ContainSubstring("spec.ipFamilyPolicy SingleStack"))),
		"the ip-family annotation alone on a dual-stack Service")
	update(t, w, dual, func(s *corev1.Service) {
		s.Annotations[ipamv1alpha1.IPFamilyAnnotation] = "ipv4"
		s.Annotations["metallb.io/loadBalancerIPs"] = dualIPs[0]
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	})
	g.Eventually(func() []string { return announcedNow(t, w, dual) }).Should(Equal(dualIPs[:1]))
	g.Eventually(func() int { return len(activeHolders(t, w, dualIPs[1])) }).Should(BeZero(), "the dropped %s is released", dualIPs[1])
	registeredFor(dualIPs[:1], "dual")
	patched, alone := false, false
	for _, v := range dualVersions.Stop() {
		ips := ingressOf(v)
		patched = patched || ptr.Deref(v.Spec.IPFamilyPolicy, "") == corev1.IPFamilyPolicySingleStack
		alone = alone || slices.Equal(ips, dualIPs[:1])
		switch {
		case !patched:
			g.Expect(ips).To(ConsistOf(dualIPs), "version %s of Service dual, before the patch: MetalLB announced another address, or none", v.ResourceVersion)
		case !alone:
			g.Expect(ips).To(ConsistOf(dualIPs), "version %s of Service dual, after the patch: MetalLB announced another address, or none", v.ResourceVersion)
		default:
			g.Expect(ips).To(Equal(dualIPs[:1]), "version %s of Service dual, once it announced the IPv4 address alone: MetalLB announced another address, or none", v.ResourceVersion)
		}
	}
	g.Expect(alone).To(BeTrue(), "no version of Service dual announced the IPv4 address alone")
	update(t, w, dual, func(s *corev1.Service) {
		s.Annotations[ipamv1alpha1.IPFamilyAnnotation] = "dual"
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	})
	ips = announced(dual, 2)
	g.Expect(ips).To(ContainElement(dualIPs[0]), "the IPv4 address stays")
	registeredFor(ips, "dual")

	// A single-stack IPv4 Service switched to dual stack in one patch, while a claim that
	// is no Service holds an IPv6 address of the zone in the IPAM-API (a machine's, say),
	// one MetalLB knows nothing of. The patch is the one docs/services.md gives: the
	// ip-family annotation, spec.ipFamilyPolicy RequireDualStack and spec.ipFamilies. No
	// version of the Service on the way shows an address the IPAM-API did not register
	// for it: the IPv4 address, none while MetalLB refuses the dual-stack Service whose
	// metallb.io/loadBalancerIPs names one address, then the pair the provider handed it.
	// (With PreferDualStack instead, MetalLB v0.15's controller gives the Service with
	// one address an IPv6 address of its own from the pool of the first, whatever
	// autoAssign says: here the claim's. A MetalLB pool cannot hold one family only
	// either: MetalLB takes a dual-stack Service's two addresses from one pool.)
	taken := newClaim(t, w, ns, "machine-ipv6", global, "inet-ipv6", nil)
	takenIP := boundAddress(t, w, taken).Spec.Address
	grow := service("grow", 443, map[string]string{ipamv1alpha1.ZoneAnnotation: "inet", ipamv1alpha1.IPFamilyAnnotation: "ipv4"}, corev1.IPv4Protocol)
	growV4 := announced(grow, 1)
	registeredFor(growV4, "grow")
	growVersions := watchService(t, w, grow)
	update(t, w, grow, func(s *corev1.Service) {
		s.Annotations[ipamv1alpha1.IPFamilyAnnotation] = "dual"
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	})
	var growIPs []string
	g.Eventually(func(g Gomega) {
		got := &corev1.Service{}
		g.Expect(w.Client.Get(ctx, client.ObjectKeyFromObject(grow), got)).To(Succeed())
		growIPs = strings.Split(got.Annotations["metallb.io/loadBalancerIPs"], ",")
		g.Expect(growIPs).To(HaveLen(2))
		g.Expect(ingressOf(got)).To(ConsistOf(growIPs))
	}).Should(Succeed(), "MetalLB announces the pair the provider handed it")
	g.Expect(growIPs).To(ContainElement(growV4[0]), "the IPv4 address stays")
	registeredFor(growIPs, "grow")
	paired := false
	for _, v := range growVersions.Stop() {
		ips := ingressOf(v)
		paired = paired || len(ips) == 2
		if paired {
			g.Expect(ips).To(ConsistOf(growIPs), "version %s of Service grow, once it announced two addresses: MetalLB announced "+
				"an address the IPAM-API did not register for it (it holds %v for it, and %s for a claim), or withdrew them",
				v.ResourceVersion, growIPs, takenIP)
			continue
		}
		g.Expect(ips).To(Or(BeEmpty(), Equal(growV4)), "version %s of Service grow, switched to dual stack: MetalLB announced an "+
			"address the IPAM-API did not register for it (it holds %v for it, and %s for a claim)", v.ResourceVersion, growIPs, takenIP)
	}
	deleteAndWait(t, w, taken)
	g.Eventually(func() int { return len(activeHolders(t, w, takenIP)) }).Should(BeZero(), "the claim's %s is released", takenIP)

	// A move to another pool of the same zone and family keeps the address: MetalLB
	// announces it in every version of the Service on the way, and the IPAM-API holds it
	// for the Service alone.
	newGlobalPool(t, w, "inet-ipv4-b", "inet", ipamv1alpha1.IPv4)
	mover := service("mover", 443, map[string]string{ipamv1alpha1.ZoneAnnotation: "inet", ipamv1alpha1.PoolAnnotation: "inet-ipv4"})
	kept := announced(mover, 1)
	versions := watchService(t, w, mover)
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
	for name, versions := range map[string]*testenv.Versions[*corev1.Service]{"first": firstVersions, "second": secondVersions} {
		for _, v := range versions.Stop() {
			g.Expect(ingressOf(v)).To(Equal([]string{shared}),
				"version %s of Service %s: MetalLB withdrew the shared address, or announced another", v.ResourceVersion, name)
		}
	}

	all := []*corev1.Service{v4, v6, dual, first, second, third, mover, grow}
	// With autoAssign off, MetalLB announced nothing of its own through all of that, and
	// refused nothing the provider handed it: the provider warned of nothing, moves and
	// family switches included (MetalLB refuses the one address of a Service switched to
	// two families, dual and grow here, until the provider hands it the pair: that is no
	// refusal to relay).
	for _, s := range all {
		for _, e := range eventsOf(t, w, s) {
			g.Expect(e.Reason).NotTo(BeElementOf(ipamv1alpha1.EventMetalLBAssignedReason, ipamv1alpha1.EventMetalLBRefusedReason),
				"Service %s: %s", s.Name, e.Message)
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

	// A Service of a zone whose addresses no MetalLB pool covers (MetalLB's hnet-public
	// pool holds other addresses for this step): the provider registers an address and
	// hands it to MetalLB, which refuses it ("… is not allowed in config", a Warning
	// AllocationFailed of its own) and announces nothing. The provider relays the refusal
	// on the Service, where on-call looks: MetalLBRefused, naming the address and quoting
	// MetalLB. Once the pool covers the address again, MetalLB announces it.
	newGlobalPool(t, w, "hnet-public-ipv4", "hnet-public", ipamv1alpha1.IPv4)
	elsewhere := localcluster.StandInPools()
	for i := range elsewhere {
		if elsewhere[i].Name == "hnet-public" {
			elsewhere[i].Addresses = []string{"192.0.2.0/24"} // TEST-NET-1: no zone's
		}
	}
	g.Expect(w.SetMetalLBPools(ctx, elsewhere)).To(Succeed())
	// MetalLB's controller counts the pool's addresses from what it uses: once it counts
	// the /24, it refuses the zone's addresses.
	g.Eventually(func() int64 { return metalLBAvailableIPv4(t, w, "hnet-public") }).Should(BeEquivalentTo(256))
	outside := service("outside", 443, map[string]string{ipamv1alpha1.ZoneAnnotation: "hnet-public"})
	var refused string
	g.Eventually(func(g Gomega) {
		got := &corev1.Service{}
		g.Expect(w.Client.Get(ctx, client.ObjectKeyFromObject(outside), got)).To(Succeed())
		refused = got.Annotations["metallb.io/loadBalancerIPs"]
		g.Expect(refused).NotTo(BeEmpty())
	}).Should(Succeed(), "the provider hands the address to MetalLB")
	registeredFor([]string{refused}, "outside")
	g.Eventually(func() []string {
		var notes []string
		for _, e := range eventsOf(t, w, outside) {
			if e.Reason == ipamv1alpha1.EventMetalLBRefusedReason && e.Type == corev1.EventTypeWarning {
				notes = append(notes, e.Message)
			}
		}
		return notes
	}).Should(ContainElement(And(ContainSubstring("handed it ("+refused+")"), ContainSubstring(`["`+refused+`"] is not allowed in config`),
		ContainSubstring("IPAddressPool"))), "the provider relays MetalLB's refusal of %s", refused)
	g.Expect(announcedNow(t, w, outside)).To(BeEmpty(), "MetalLB announces an address it refuses")
	g.Expect(w.SetMetalLBPools(ctx, localcluster.StandInPools())).To(Succeed())
	g.Eventually(func() []string { return announcedNow(t, w, outside) }).Should(Equal([]string{refused}),
		"MetalLB announces the handed address once its pool covers it")
	deleteAndWait(t, w, outside)
	g.Expect(activeHolders(t, w, refused)).To(BeEmpty(), "%s is released", refused)

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
	newG(t).Expect(tryUpdate(w, svc, change)).To(Succeed())
}

// tryUpdate changes the Service with change and patches it, and returns the API
// server's answer (a webhook's refusal, say).
func tryUpdate(w *localcluster.ControlPlane, svc *corev1.Service, change func(*corev1.Service)) error {
	got := &corev1.Service{}
	if err := w.Client.Get(context.Background(), client.ObjectKeyFromObject(svc), got); err != nil {
		return err
	}
	patch := client.MergeFrom(got.DeepCopy())
	change(got)
	return w.Client.Patch(context.Background(), got, patch)
}

// watchService records every version of the Service from now on (Stop returns them).
func watchService(t *testing.T, w *localcluster.ControlPlane, svc *corev1.Service) *testenv.Versions[*corev1.Service] {
	t.Helper()
	g := newG(t)
	current := &corev1.Service{}
	g.Expect(w.Client.Get(context.Background(), client.ObjectKeyFromObject(svc), current)).To(Succeed())
	versions, err := testenv.WatchVersions(context.Background(), w.Config, &corev1.ServiceList{}, current)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { versions.Stop() })
	return versions
}

// metalLBAvailableIPv4 is how many IPv4 addresses MetalLB's controller counts in its
// IPAddressPool name (the pool's status.availableIPv4).
func metalLBAvailableIPv4(t *testing.T, w *localcluster.ControlPlane, name string) int64 {
	t.Helper()
	pool := &unstructured.Unstructured{}
	pool.SetAPIVersion("metallb.io/v1beta1")
	pool.SetKind("IPAddressPool")
	newG(t).Expect(w.Client.Get(context.Background(), client.ObjectKey{Namespace: localcluster.MetalLBNamespace, Name: name}, pool)).To(Succeed())
	n, _, _ := unstructured.NestedInt64(pool.Object, "status", "availableIPv4")
	return n
}

// announcedNow is what MetalLB's status of the Service lists now.
func announcedNow(t *testing.T, w *localcluster.ControlPlane, svc *corev1.Service) []string {
	t.Helper()
	got := &corev1.Service{}
	newG(t).Expect(w.Client.Get(context.Background(), client.ObjectKeyFromObject(svc), got)).To(Succeed())
	return ingressOf(got)
}

// ingressOf is the addresses the Service's status.loadBalancer.ingress lists.
func ingressOf(svc *corev1.Service) []string {
	var ips []string
	for _, in := range svc.Status.LoadBalancer.Ingress {
		ips = append(ips, in.IP)
	}
	return ips
}
