package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

const global = "GlobalVitistackIPPool"

// A claim that belongs to no Cluster gets an address of the pool's zone, registered
// under the claim's identity; deleting it releases the address in the IPAM-API.
func TestClaimWithoutCluster(t *testing.T) {
	onA.enter(t)
	g := newG(t)
	ctx := context.Background()
	ns := newNamespace(t, a, "plain")
	newGlobalPool(t, a, "e2e-plain-inet-v4", "inet", ipamv1alpha1.IPv4)

	claim := newClaim(t, a, ns, "web-0", global, "e2e-plain-inet-v4", nil)
	addr := boundAddress(t, a, claim)
	ip := netip.MustParseAddr(addr.Spec.Address)
	g.Expect(netip.MustParsePrefix("83.118.168.0/22").Contains(ip)).To(BeTrue(), "%s is not in zone inet", ip)
	g.Expect(addr.Labels).To(SatisfyAll(HaveKeyWithValue(ipamv1alpha1.ZoneLabel, "inet"), HaveKeyWithValue(ipamv1alpha1.IPFamilyLabel, "ipv4")))
	readyReason(t, a, claim, metav1.ConditionTrue, ipamv1alpha1.ClaimReadyAllocatedReason)
	// A first binding sends no event (its Ready condition says it; writes are budgeted),
	// even when the claim is created right after its pool, before the cache has it.
	var seen []string
	for _, e := range eventsOf(t, a, claim) {
		seen = append(seen, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Message))
	}
	g.Expect(seen).To(BeEmpty(), "a first binding sent events")

	// The IPAM-API holds it for this claim: service_name, namespace_id, cluster_id.
	holders := activeHolders(t, a, addr.Spec.Address)
	g.Expect(holders).To(HaveLen(1))
	g.Expect(holders[0].ServiceRef).To(Equal(sim.ServiceRef{ServiceName: "web-0", NamespaceID: uidOf(t, a, ns), ClusterID: uidOf(t, a, "kube-system")}))

	// The default secret was created where the provider lives, and is protected.
	secret := &corev1.Secret{}
	g.Expect(a.Client.Get(ctx, client.ObjectKey{Namespace: manager.ProviderNamespace, Name: "default"}, secret)).To(Succeed())
	g.Expect(secret.Finalizers).To(ContainElement(ipamv1alpha1.SecretInUseFinalizer))
	reg, _ := registrationOf(t, a, addr.Spec.Address)
	g.Expect(reg.SecretFingerprint).To(Equal(sim.Fingerprint(string(secret.Data["secret"]))))

	deleteAndWait(t, a, claim)
	g.Expect(activeHolders(t, a, addr.Spec.Address)).To(BeEmpty(), "deleting the claim did not release %s", addr.Spec.Address)
}

// Claims of a Cluster wait while it is paused or missing, and are released by the
// garbage collector's deletion when the Cluster is deleted.
func TestClaimsOfACluster(t *testing.T) {
	onA.enter(t)
	g := newG(t)
	ctx := context.Background()
	ns := newNamespace(t, a, "cluster")
	newGlobalPool(t, a, "e2e-cluster-hnet-v4", "hnet-private", ipamv1alpha1.IPv4)
	cluster := newCluster(t, a, ns, "work", false)

	first := newClaim(t, a, ns, "work-cp-0", global, "e2e-cluster-hnet-v4", cluster)
	firstAddr := boundAddress(t, a, first)
	g.Expect(firstAddr.Labels).To(HaveKeyWithValue("cluster.x-k8s.io/cluster-name", "work"))

	// A Cluster paused from the start (pausing one just before creating a claim would
	// race the manager's cache): its claim waits, with no request sent, until unpaused.
	held := newCluster(t, a, ns, "held", true)
	paused := newClaim(t, a, ns, "held-md-0", global, "e2e-cluster-hnet-v4", held)
	newG(t).Consistently(func(g Gomega) {
		c := &ipamv1.IPAddressClaim{}
		g.Expect(a.Client.Get(ctx, client.ObjectKeyFromObject(paused), c)).To(Succeed())
		g.Expect(c.Status.AddressRef.Name).To(BeEmpty())
		g.Expect(c.Annotations).NotTo(HaveKey(ipamv1alpha1.RegistrationAnnotation), "a request was sent for a claim of a paused cluster")
	}).Should(Succeed())
	setPaused(t, a, held, false)
	pausedAddr := boundAddress(t, a, paused)
	g.Expect(pausedAddr.Spec.Address).NotTo(Equal(firstAddr.Spec.Address))

	// A claim of a Cluster that does not exist (yet) is left alone until it does.
	early := &ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "later-cp-0"},
		Spec: ipamv1.IPAddressClaimSpec{ClusterName: "later", PoolRef: ipamv1.IPPoolReference{
			APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: global, Name: "e2e-cluster-hnet-v4"}},
	}
	g.Expect(a.Client.Create(ctx, early)).To(Succeed())
	newG(t).Consistently(func(g Gomega) {
		c := &ipamv1.IPAddressClaim{}
		g.Expect(a.Client.Get(ctx, client.ObjectKeyFromObject(early), c)).To(Succeed())
		g.Expect(c.Status.AddressRef.Name).To(BeEmpty())
	}).Should(Succeed())
	newCluster(t, a, ns, "later", false)
	boundAddress(t, a, early)

	// Deleting the Clusters: the garbage collector deletes their claims (owner
	// references), and the provider releases their addresses.
	deleteAndWait(t, a, cluster)
	deleteAndWait(t, a, held)
	for _, c := range []*ipamv1.IPAddressClaim{first, paused} {
		newG(t).Eventually(func() bool {
			return apierrors.IsNotFound(a.Client.Get(ctx, client.ObjectKeyFromObject(c), &ipamv1.IPAddressClaim{}))
		}).WithTimeout(2*timeout).Should(BeTrue(), "claim %s was not garbage collected", c.Name)
	}
	for _, addr := range []*ipamv1.IPAddress{firstAddr, pausedAddr} {
		g.Expect(activeHolders(t, a, addr.Spec.Address)).To(BeEmpty(), "%s is still held after its Cluster was deleted", addr.Spec.Address)
	}
}

// An exhausted zone shows on the claim (condition and event) and the claim is bound as
// soon as the zone has room again.
func TestExhaustedZone(t *testing.T) {
	onA.enter(t)
	g := newG(t)
	ctx := context.Background()
	ns := newNamespace(t, a, "exhausted")
	newGlobalPool(t, a, "e2e-exhausted-public-v4", "hnet-public", ipamv1alpha1.IPv4)
	g.Expect(ipamAPI.SetExhausted(ctx, "hnet-public", "ipv4", true)).To(Succeed())
	t.Cleanup(func() { _ = ipamAPI.SetExhausted(ctx, "hnet-public", "ipv4", false) })

	claim := newClaim(t, a, ns, "waits", global, "e2e-exhausted-public-v4", nil)
	cond := readyReason(t, a, claim, metav1.ConditionFalse, ipamv1.IPAddressClaimReadyPoolExhaustedReason)
	g.Expect(cond.Message).To(ContainSubstring("hnet-public"))
	newG(t).Eventually(func() []corev1.Event { return eventsOf(t, a, claim) }).Should(ContainElement(
		And(HaveField("Type", corev1.EventTypeWarning), HaveField("Reason", "PoolExhausted"))))

	g.Expect(ipamAPI.SetExhausted(ctx, "hnet-public", "ipv4", false)).To(Succeed())
	addr := boundAddress(t, a, claim)
	g.Expect(activeHolders(t, a, addr.Spec.Address)).To(HaveLen(1))
}

// The leading manager is killed in the middle of a burst of claims and a second
// replica takes over when its Lease expires: every claim ends with its own address, and
// the IPAM-API holds exactly those, nothing more.
func TestLeaderKilledDuringBurst(t *testing.T) {
	onA.enter(t)
	g := newG(t)
	ctx := context.Background()
	const n = 60
	ns := newNamespace(t, a, "burst")
	newGlobalPool(t, a, "e2e-burst-hnet-v4", "hnet-private", ipamv1alpha1.IPv4)
	// Slow IPAM-API answers, so that the kill lands with requests in flight.
	g.Expect(ipamAPI.SetFaults(ctx, sim.Faults{Latency: 150 * time.Millisecond, LatencyJitter: 100 * time.Millisecond})).To(Succeed())
	t.Cleanup(func() { _ = ipamAPI.SetFaults(ctx, sim.Faults{}) })

	// A second replica, as a Deployment with two would run: it serves webhooks and waits
	// for the leader election Lease.
	standby, err := a.StartManager(ctx, nil)
	g.Expect(err).NotTo(HaveOccurred())

	claims := make([]*ipamv1.IPAddressClaim, n)
	for i := range claims {
		claims[i] = newClaim(t, a, ns, fmt.Sprintf("node-%02d", i), global, "e2e-burst-hnet-v4", nil)
	}

	// Kill it once some, not all, are bound, while a registration has been sent and
	// not answered (the claim's record is written before each request).
	var bound, inFlight int
	g.Eventually(func() bool {
		bound, inFlight = countBound(t, ns)
		return bound >= 5 && inFlight >= 1
	}).WithPolling(10*time.Millisecond).Should(BeTrue(), "never saw a registration in flight")
	aMgr.Kill()
	g.Expect(logsOf(t, standby)).NotTo(ContainSubstring("Registered address"), "the standby reconciled while the leader lived")
	aMgr = standby
	t.Logf("leader killed with %d of %d claims bound, %d with a registration sent and no answer", bound, n, inFlight)
	g.Expect(bound).To(BeNumerically("<", n), "the burst ended before the kill; raise n or the latency")

	seen := map[string]string{}
	for _, c := range claims {
		addr := boundAddress(t, a, c)
		g.Expect(seen).NotTo(HaveKey(addr.Spec.Address), "%s handed out twice", addr.Spec.Address)
		seen[addr.Spec.Address] = c.Name
	}
	// The IPAM-API holds, under this namespace's identity, exactly the bound addresses.
	nsUID := uidOf(t, a, ns)
	regs, err := ipamAPI.Registrations(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	held := map[string]string{}
	for _, r := range regs {
		for _, h := range r.Holders {
			if h.NamespaceID == nsUID && h.ExpiresAt == nil {
				g.Expect(held).NotTo(HaveKey(h.ServiceName), "claim %s holds two addresses (leak)", h.ServiceName)
				held[h.ServiceName] = netip.MustParsePrefix(r.Address).Addr().String()
			}
		}
	}
	g.Expect(held).To(HaveLen(n))
	for addr, name := range seen {
		g.Expect(held).To(HaveKeyWithValue(name, addr))
	}
	stats, err := ipamAPI.Stats(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(stats.OverlappingRegistrations).To(BeZero(), "two registrations of one identity were in flight at once")
	// client-go capitalised this message in v0.36: match either spelling.
	g.Expect(logsOf(t, standby)).To(MatchRegexp(`(?i)successfully acquired lease`))

	// Deleting the namespace (namespace controller) releases every address.
	g.Expect(a.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(a.Client.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{}))
	}).WithTimeout(3*timeout).Should(BeTrue(), "namespace %s is not gone", ns)
	for addr := range seen {
		g.Expect(activeHolders(t, a, addr)).To(BeEmpty(), "%s is still held after its namespace was deleted", addr)
	}
}

// countBound counts the namespace's claims that are bound, and those with a
// registration record (written before each request) but no address yet.
func countBound(t *testing.T, ns string) (bound, pending int) {
	t.Helper()
	list := &ipamv1.IPAddressClaimList{}
	newG(t).Expect(a.Client.List(context.Background(), list, client.InNamespace(ns))).To(Succeed())
	for _, c := range list.Items {
		switch _, recorded := c.Annotations[ipamv1alpha1.RegistrationAnnotation]; {
		case c.Status.AddressRef.Name != "":
			bound++
		case recorded:
			pending++
		}
	}
	return bound, pending
}
