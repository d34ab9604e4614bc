package controllers_test

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// restartManager stops the manager as a crash would and starts a new one.
func restartManager(t *testing.T) {
	t.Helper()
	g := NewWithT(t)
	g.Expect(env.StopManager()).To(Succeed())
	g.Expect(env.StartManager(ctx, mgrOpts)).To(Succeed())
}

func recordOf(t *testing.T, claim *ipamv1.IPAddressClaim) string {
	c := &ipamv1.IPAddressClaim{}
	NewWithT(t).Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(claim), c)).To(Succeed())
	return c.Annotations[ipamv1alpha1.RegistrationAnnotation]
}

// poolOnOwnSim creates a routed pool (zone inet, IPv4) on a stand-in of its own, whose
// faults the test sets without touching other tests' pools.
func poolOnOwnSim(t *testing.T, ns string) (*sim.Server, *ipamv1alpha1.VitistackIPPool) {
	t.Helper()
	api, url, stop := env.ExtraSim()
	t.Cleanup(stop)
	spec := routedPool("inet", ipamv1alpha1.IPv4)
	spec.Endpoint = url
	return api, newPool(t, ns, "pool", spec)
}

// answerLostOnce creates a pool on a stand-in of its own, which registers the first
// address it is asked for but drops the connection before answering.
func answerLostOnce(t *testing.T, ns string) (*sim.Server, *ipamv1alpha1.VitistackIPPool) {
	t.Helper()
	api, pool := poolOnOwnSim(t, ns)
	api.SetFaultRoutes(sim.RouteRegister)
	NewWithT(t).Expect(api.DropNext(sim.DropAfter, 1)).To(Succeed())
	return api, pool
}

// The IPAM-API registers the address, but its answer never reaches the manager, which
// then dies: the restarted manager must find the same registration, not make a second.
func TestCrashBetweenAnswerAndIPAddressLeavesOneRegistration(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	api, pool := answerLostOnce(t, ns.Name)

	claim := newClaim(t, ns.Name, "crash", pool.Name, nil)
	me := identity(t, ns, "crash")
	g.Eventually(func() []sim.Registration { return api.HeldBy(me) }, eventually, poll).Should(HaveLen(1),
		"the stand-in must have registered the address although the answer was dropped")
	readyCondition(t, claim, metav1.ConditionFalse, "AllocationFailed")
	record := recordOf(t, claim)
	g.Expect(record).To(ContainSubstring(`"serviceName":"crash"`), "the registration was recorded before it was sent")
	g.Expect(record).To(ContainSubstring(`"phase":"Pending"`), "not registered: the answer was lost")
	registered := api.HeldBy(me)[0].Address

	restartManager(t)

	addr := boundAddress(t, claim)
	g.Expect(addr.Spec.Address + "/32").To(Equal(registered))
	g.Expect(api.HeldBy(me)).To(HaveLen(1), "no second address after the restart")
	g.Expect(api.Stats().OverlappingRegistrations).To(BeZero())
}

// The answer is lost and the claim is deleted before it ever got an IPAddress: the
// registration must still be released.
func TestCrashThenDeleteReleasesPendingRegistration(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	api, pool := answerLostOnce(t, ns.Name)

	claim := newClaim(t, ns.Name, "doomed", pool.Name, nil)
	me := identity(t, ns, "doomed")
	g.Eventually(func() []sim.Registration { return api.HeldBy(me) }, eventually, poll).Should(HaveLen(1))
	g.Expect(env.StopManager()).To(Succeed())
	g.Expect(env.Client.Delete(ctx, claim)).To(Succeed())
	g.Expect(env.StartManager(ctx, mgrOpts)).To(Succeed())

	deleteAndWait(t, claim)
	regs := api.HeldBy(me)
	g.Expect(regs).To(HaveLen(1))
	g.Expect(regs[0].Holders[0].ExpiresAt).NotTo(BeNil(), "the pending registration was released")
	api.Sweep()
	g.Expect(api.HeldBy(me)).To(BeEmpty())
}

func TestPausedClusterIsNotTouched(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "workload"},
		Spec:       clusterv1.ClusterSpec{Paused: ptr.To(true)},
	}
	g.Expect(env.Client.Create(ctx, cluster)).To(Succeed())
	pool := newPool(t, ns.Name, "pool", routedPool("inet", ipamv1alpha1.IPv4))
	claim := &ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "paused-node"},
		Spec: ipamv1.IPAddressClaimSpec{ClusterName: "workload", PoolRef: ipamv1.IPPoolReference{
			APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: ipamv1alpha1.VitistackIPPoolKind, Name: pool.Name,
		}},
	}
	g.Expect(env.Client.Create(ctx, claim)).To(Succeed())
	me := identity(t, ns, "paused-node")
	g.Consistently(func(g Gomega) {
		c := &ipamv1.IPAddressClaim{}
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(claim), c)).To(Succeed())
		g.Expect(c.Finalizers).To(BeEmpty())
		g.Expect(c.Status.AddressRef.Name).To(BeEmpty())
		g.Expect(env.Sim.HeldBy(me)).To(BeEmpty())
	}, 2*time.Second, 100*time.Millisecond).Should(Succeed())

	patch := client.MergeFrom(cluster.DeepCopy())
	cluster.Spec.Paused = ptr.To(false)
	g.Expect(env.Client.Patch(ctx, cluster, patch)).To(Succeed())
	boundAddress(t, claim)
	g.Expect(env.Sim.HeldBy(me)).To(HaveLen(1))
}

func TestManyClaimsBindWithoutDuplicates(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pool := &ipamv1alpha1.GlobalVitistackIPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "burst-" + ns.Name},
		Spec:       routedPool("hnet-private", ipamv1alpha1.IPv4),
	}
	g.Expect(env.Client.Create(ctx, pool)).To(Succeed())
	// A little latency between lookup and commit, so overlapping registrations would
	// really leak (as on the real server) if the provider ever sent them.
	g.Expect(env.Sim.SetLatency(2*time.Millisecond, 3*time.Millisecond)).To(Succeed())
	t.Cleanup(env.Sim.ClearFaults)
	before := env.Sim.Stats().OverlappingRegistrations

	const n = 200
	var wg sync.WaitGroup
	claims := make([]*ipamv1.IPAddressClaim, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			claims[i] = createClaim(t, ns.Name, fmt.Sprintf("node-%03d", i), ipamv1alpha1.GlobalVitistackIPPoolKind, pool.Name, nil)
		}()
	}
	wg.Wait()

	seen := map[string]string{}
	g.Eventually(func(g Gomega) {
		list := &ipamv1.IPAddressList{}
		g.Expect(env.Client.List(ctx, list, client.InNamespace(ns.Name))).To(Succeed())
		g.Expect(list.Items).To(HaveLen(n))
	}, 2*time.Minute, 200*time.Millisecond).Should(Succeed())
	for _, c := range claims {
		addr := boundAddress(t, c)
		g.Expect(seen).NotTo(HaveKey(addr.Spec.Address), "address %s handed out twice", addr.Spec.Address)
		seen[addr.Spec.Address] = c.Name
		g.Expect(netip.MustParsePrefix("10.0.0.0/8").Contains(netip.MustParseAddr(addr.Spec.Address))).To(BeTrue())
	}
	// The stand-in agrees: n registrations for this namespace, one holder each.
	held := 0
	for _, r := range env.Sim.Registrations() {
		for _, h := range r.Holders {
			if h.NamespaceID == string(ns.UID) {
				held++
				g.Expect(r.Holders).To(HaveLen(1))
				g.Expect(seen).To(HaveKey(strings.TrimSuffix(r.Address, "/32")))
			}
		}
	}
	g.Expect(held).To(Equal(n))
	g.Expect(env.Sim.Stats().OverlappingRegistrations-before).To(BeZero(), "two registrations of one identity were in flight at once")

	// The pool counts them.
	g.Eventually(func() *int32 {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool)
		return pool.Status.AddressesInUse
	}, eventually, poll).Should(Equal(ptr.To[int32](n)))
}

// Two claims given the same IPAM-API identity would get the same address from the
// IPAM-API; the second is refused instead.
func TestDuplicateIdentityIsRefused(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pool := newPool(t, ns.Name, "pool", withOverrides(routedPool("inet", ipamv1alpha1.IPv4)))
	a := newClaim(t, ns.Name, "a", pool.Name, map[string]string{"ipam.vitistack.io/service-name": "same"})
	boundAddress(t, a)
	b := newClaim(t, ns.Name, "b", pool.Name, map[string]string{"ipam.vitistack.io/service-name": "same"})
	cond := readyCondition(t, b, metav1.ConditionFalse, "IdentityInUse")
	g.Expect(cond.Message).To(MatchRegexp(`already used by IPAddress(Claim)? ` + ns.Name + `/a;`))
	hasEvent(t, b, corev1.EventTypeWarning, "IdentityInUse", "ipam.vitistack.io/service-name")
}

// Two claims created at once with one identity: only one registers it.
func TestSimultaneousDuplicateIdentityRegistersOnce(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pool := newPool(t, ns.Name, "pool", withOverrides(routedPool("inet", ipamv1alpha1.IPv4)))
	var wg sync.WaitGroup
	for _, name := range []string{"twin-a", "twin-b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			newClaim(t, ns.Name, name, pool.Name, map[string]string{"ipam.vitistack.io/service-name": "twin"})
		}()
	}
	wg.Wait()
	me := identity(t, ns, "twin")
	g.Eventually(func() int {
		list := &ipamv1.IPAddressList{}
		g.Expect(env.Client.List(ctx, list, client.InNamespace(ns.Name))).To(Succeed())
		return len(list.Items)
	}, eventually, poll).Should(Equal(1))
	g.Consistently(func(g Gomega) {
		list := &ipamv1.IPAddressList{}
		g.Expect(env.Client.List(ctx, list, client.InNamespace(ns.Name))).To(Succeed())
		g.Expect(list.Items).To(HaveLen(1), "one identity, one IPAddress")
		g.Expect(env.Sim.HeldBy(me)).To(HaveLen(1))
	}, 2*time.Second, 100*time.Millisecond).Should(Succeed())
}

// An IPAddress deleted by hand while its claim lives stays, as in every provider on
// ipamutil: the claim keeps its address, registered once, until the claim goes.
func TestAnIPAddressDeletedByHandStaysUntilItsClaimGoes(t *testing.T) {
	g := NewWithT(t)
	ns, claim, addr := boundRoutedClaim(t, "by-hand")
	g.Expect(env.Client.Delete(ctx, addr)).To(Succeed())
	// ipamutil's loop sees it being deleted (its ProtectAddress finalizer holds it), and
	// says so; the claim stays bound to it, the address held once.
	g.Eventually(func() string { return managerLines("by-hand") }, eventually, poll).Should(
		ContainSubstring("deletion is prevented until the claim is deleted as well"))
	kept := &ipamv1.IPAddress{}
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(addr), kept)).To(Succeed())
	g.Expect(kept.DeletionTimestamp.IsZero()).To(BeFalse())
	g.Expect(kept.Spec.Address).To(Equal(addr.Spec.Address))
	readyCondition(t, claim, metav1.ConditionTrue, "Allocated")
	me := identity(t, ns, "by-hand")
	g.Expect(env.Sim.HeldBy(me)).To(HaveLen(1))

	// The claim goes: the address is released, and the IPAddress goes with it.
	deleteAndWait(t, claim)
	waitGone(t, addr)
	regs := env.Sim.HeldBy(me)
	g.Expect(regs).To(HaveLen(1))
	g.Expect(regs[0].Holders[0].ExpiresAt).NotTo(BeNil(), "the registration was released")
}

// An IPAddress written by an earlier version carries ipamutil's ProtectAddress
// finalizer: deleting its claim takes it off, and both go, the address released.
func TestProtectAddressFinalizerOfAnEarlierVersionGoes(t *testing.T) {
	g := NewWithT(t)
	ns, claim, addr := boundRoutedClaim(t, "upgraded")
	patch := client.MergeFrom(addr.DeepCopy())
	addr.Finalizers = append(addr.Finalizers, "ipam.cluster.x-k8s.io/ProtectAddress")
	g.Expect(env.Client.Patch(ctx, addr, patch)).To(Succeed())
	// An earlier version wrote it long before: the manager has seen it when the claim goes.
	g.Eventually(func(g Gomega) {
		seen := &ipamv1.IPAddress{}
		g.Expect(env.Cache.Get(ctx, client.ObjectKeyFromObject(addr), seen)).To(Succeed())
		g.Expect(seen.Finalizers).To(ContainElement("ipam.cluster.x-k8s.io/ProtectAddress"))
	}, eventually, poll).Should(Succeed())

	deleteAndWait(t, claim)
	waitGone(t, addr) // with the old finalizer on, it would stay Terminating
	me := identity(t, ns, "upgraded")
	regs := env.Sim.HeldBy(me)
	g.Expect(regs).To(HaveLen(1))
	g.Expect(regs[0].Holders[0].ExpiresAt).NotTo(BeNil(), "the registration was released")
}

// A bound claim whose IPAddress is lost (deleted by hand, not restored) gets the same
// address back: it is registered again with its address, never without.
func TestLostIPAddressComesBackWithTheSameAddress(t *testing.T) {
	g := NewWithT(t)
	ns, _, addr := boundRoutedClaim(t, "keeper")

	// Lost while the provider was not running (a restore without it, a hand-made mess).
	g.Expect(env.StopManager()).To(Succeed())
	patch := client.MergeFrom(addr.DeepCopy())
	addr.Finalizers = nil
	g.Expect(env.Client.Patch(ctx, addr, patch)).To(Succeed())
	g.Expect(env.Client.Delete(ctx, addr)).To(Succeed())
	g.Expect(env.StartManager(ctx, mgrOpts)).To(Succeed())

	comesBack(t, addr)
	me := identity(t, ns, "keeper")
	g.Expect(env.Sim.HeldBy(me)).To(HaveLen(1))
}

// comesBack waits until the claim's IPAddress, once lost, is there again as a new object
// with the address lost had.
func comesBack(t *testing.T, lost *ipamv1.IPAddress) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		again := &ipamv1.IPAddress{}
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(lost), again)).To(Succeed())
		g.Expect(again.UID).NotTo(Equal(lost.UID))
		g.Expect(again.Spec.Address).To(Equal(lost.Spec.Address))
	}, eventually, poll).Should(Succeed())
}
