package controllers_test

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

func subnetPool(zone string, family ipamv1alpha1.IPFamily, subnet, gateway string, excluded ...string) ipamv1alpha1.VitistackIPPoolSpec {
	s := routedPool(zone, family)
	s.Subnet, s.Gateway, s.ExcludedAddresses = subnet, gateway, excluded
	return s
}

// defaultSecretValue is the default Secret's value; a test run alone, before any pool
// made the provider create the Secret, creates it as the provider would.
func defaultSecretValue(t *testing.T) string {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "capi-ipam-vitistack-system", Name: "default"},
		Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"secret": []byte("a-default-secret-value-of-this-test")}}
	if err := env.Client.Create(ctx, sec); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	NewWithT(t).Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: "capi-ipam-vitistack-system", Name: "default"}, sec)
	}, eventually, poll).Should(Succeed())
	return string(sec.Data["secret"])
}

// Candidates come in order, skipping the network, broadcast, gateway and excluded
// addresses; an exhausted subnet waits, and binds when an address frees up.
func TestSubnetModeOrderExhaustionAndRecovery(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pool := newPool(t, ns.Name, "nodes", subnetPool("hnet-private", ipamv1alpha1.IPv4, "10.50.0.0/29", "10.50.0.1",
		"10.50.0.3", "10.50.0.5-10.50.0.5"))
	var claims []*ipamv1.IPAddressClaim
	for i, want := range []string{"10.50.0.2", "10.50.0.4", "10.50.0.6"} {
		c := newClaim(t, ns.Name, fmt.Sprintf("node-%d", i), pool.Name, nil)
		addr := boundAddress(t, c)
		g.Expect(addr.Spec.Address).To(Equal(want))
		g.Expect(addr.Spec.Prefix).To(Equal(ptr.To[int32](29)))
		g.Expect(addr.Spec.Gateway).To(Equal("10.50.0.1"))
		claims = append(claims, c)
	}
	waiting := newClaim(t, ns.Name, "node-3", pool.Name, nil)
	cond := readyCondition(t, waiting, metav1.ConditionFalse, "PoolExhausted")
	g.Expect(cond.Message).To(ContainSubstring("subnet 10.50.0.0/29 of VitistackIPPool nodes has no free address"))
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool)).To(Succeed())
		g.Expect(pool.Status.SubnetSize).To(Equal(ptr.To[int64](3)))
		g.Expect(pool.Status.AddressesInUse).To(Equal(ptr.To[int32](3)))
		g.Expect(pool.Status.Conditions).To(ContainElement(And(HaveField("Type", "Exhausted"), HaveField("Status", metav1.ConditionTrue))))
	}, eventually, poll).Should(Succeed())

	// An address frees up (released, then swept by the IPAM-API): the waiting claim gets it.
	deleteAndWait(t, claims[1])
	g.Eventually(func() string {
		env.Sim.Sweep()
		a := &ipamv1.IPAddress{}
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(waiting), a)
		return a.Spec.Address
	}, eventually, 200*time.Millisecond).Should(Equal("10.50.0.4"))
}

func TestSubnetModeIPv6SkipsTheSubnetRouterAddress(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pool := newPool(t, ns.Name, "v6", subnetPool("inet", ipamv1alpha1.IPv6, "2a05:1234::200/125", "2a05:1234::201"))
	addr := boundAddress(t, newClaim(t, ns.Name, "n6", pool.Name, nil))
	g.Expect(addr.Spec.Address).To(Equal("2a05:1234::202"))
	g.Expect(addr.Spec.Prefix).To(Equal(ptr.To[int32](125)))
}

// A candidate held under another secret is skipped.
func TestSubnetModeSkipsAddressesHeldByOthers(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	registerDirect(t, `{"secret":"somebody-elses-secret","zone":"hnet-private","ip_family":"ipv4","address":"10.60.0.2/32",`+
		`"service":{"service_name":"other","namespace_id":"x","cluster_id":"y"}}`)
	pool := newPool(t, ns.Name, "nodes", subnetPool("hnet-private", ipamv1alpha1.IPv4, "10.60.0.0/24", "10.60.0.1"))
	addr := boundAddress(t, newClaim(t, ns.Name, "n", pool.Name, nil))
	g.Expect(addr.Spec.Address).To(Equal("10.60.0.3"))
	g.Expect(holdersOf("10.60.0.2/32")).To(HaveLen(1))
}

// A candidate another holder of the same secret has is not shared: this claim's hold
// on it is released, and the next candidate is taken.
func TestSubnetModeNeverSharesWithTheSameSecret(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	// Make sure the default secret exists, then let "someone else" use it.
	boundAddress(t, newClaim(t, ns.Name, "warm-up", newPool(t, ns.Name, "routed", routedPool("inet", ipamv1alpha1.IPv4)).Name, nil))
	registerDirect(t, `{"secret":"`+defaultSecretValue(t)+`","zone":"hnet-private","ip_family":"ipv4","address":"10.61.0.2/32",`+
		`"service":{"service_name":"someone-else","namespace_id":"x","cluster_id":"y"}}`)
	pool := newPool(t, ns.Name, "nodes", subnetPool("hnet-private", ipamv1alpha1.IPv4, "10.61.0.0/24", "10.61.0.1"))
	claim := newClaim(t, ns.Name, "n", pool.Name, nil)
	g.Expect(boundAddress(t, claim).Spec.Address).To(Equal("10.61.0.3"))
	holders := holdersOf("10.61.0.2/32")
	g.Expect(holders).To(ContainElement(HaveField("ServiceRef.ServiceName", "someone-else")))
	for _, h := range holders {
		if h.ServiceName == "n" {
			g.Expect(h.ExpiresAt).NotTo(BeNil(), "the claim's hold on the shared address was released")
		}
	}
}

// The candidate is recorded before it is sent. Its answer is lost and the manager
// restarts: the IPAM-API answers the same candidate sent again with "updated", which
// another holder of the same secret would get too, so the claim gives it back and
// binds the next one; nothing stays held for it but the address it is bound to.
func TestSubnetModeLostAnswerGivesTheCandidateBack(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	api, url, stop := env.ExtraSim()
	t.Cleanup(stop)
	spec := subnetPool("hnet-private", ipamv1alpha1.IPv4, "10.62.0.0/24", "10.62.0.1")
	spec.Endpoint = url
	pool := newPool(t, ns.Name, "nodes", spec)
	// The pool checks its subnet against its zone with a registration of its own first:
	// the answer lost must be the claim's.
	poolReady(t, pool, metav1.ConditionTrue, ipamv1alpha1.PoolReadyReason, "")
	api.SetFaultRoutes(sim.RouteRegister)
	g.Expect(api.DropNext(sim.DropAfter, 1)).To(Succeed())

	claim := newClaim(t, ns.Name, "crashy", pool.Name, nil)
	g.Eventually(func() []sim.Holder { return api.Holders("10.62.0.2/32") }, eventually, poll).Should(HaveLen(1))
	g.Expect(recordOf(t, claim)).To(ContainSubstring(`"address":"10.62.0.2/32"`))
	restartManager(t)

	g.Expect(boundAddress(t, claim).Spec.Address).To(Equal("10.62.0.3"))
	for _, h := range api.Holders("10.62.0.2/32") {
		g.Expect(h.ExpiresAt).NotTo(BeNil(), "the candidate given back is still held: %+v", h)
	}
	holders := api.Holders("10.62.0.3/32")
	g.Expect(holders).To(HaveLen(1))
	g.Expect(holders[0].ExpiresAt).To(BeNil())
}

func TestSubnetModeHundredClaimsInParallel(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pool := newPool(t, ns.Name, "nodes", subnetPool("hnet-private", ipamv1alpha1.IPv4, "10.63.0.0/24", "10.63.0.1", "10.63.0.200-10.63.0.254"))
	const n = 100
	var wg sync.WaitGroup
	claims := make([]*ipamv1.IPAddressClaim, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			claims[i] = newClaim(t, ns.Name, fmt.Sprintf("node-%03d", i), pool.Name, nil)
		}()
	}
	wg.Wait()
	subnet := netip.MustParsePrefix("10.63.0.0/24")
	seen := map[string]bool{}
	for _, c := range claims {
		addr := boundAddress(t, c)
		ip := netip.MustParseAddr(addr.Spec.Address)
		g.Expect(subnet.Contains(ip)).To(BeTrue())
		g.Expect(addr.Spec.Address).NotTo(BeElementOf("10.63.0.0", "10.63.0.1", "10.63.0.255"))
		g.Expect(ip.As4()[3]).To(BeNumerically("<", 200), "excluded range")
		g.Expect(seen).NotTo(HaveKey(addr.Spec.Address), "two nodes share %s", addr.Spec.Address)
		seen[addr.Spec.Address] = true
		g.Expect(addr.Spec.Prefix).To(Equal(ptr.To[int32](24)))
		g.Expect(addr.Spec.Gateway).To(Equal("10.63.0.1"))
		active := 0
		for _, h := range holdersOf(addr.Spec.Address + "/32") {
			if h.ExpiresAt == nil {
				active++
			}
		}
		g.Expect(active).To(Equal(1), "one holder of %s in the IPAM-API", addr.Spec.Address)
	}
}

// A subnet that lies outside the pool's zone: the pool finds it itself, before any
// claim (the IPAM-API refuses the subnet's first address as not in the zone, and
// nothing stays registered), and is not Ready until its subnet is fixed; a claim says
// so too.
func TestSubnetOutsideTheZoneMakesThePoolNotReady(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pool := newPool(t, ns.Name, "astray", subnetPool("hnet-private", ipamv1alpha1.IPv4, "192.168.77.0/29", "192.168.77.1"))
	poolReady(t, pool, metav1.ConditionFalse, "SubnetOutsideZone", "subnet 192.168.77.0/29 lies outside zone hnet-private")
	g.Expect(pool.GetAnnotations()).NotTo(HaveKey(ipamv1alpha1.SubnetProbeAnnotation))
	g.Expect(holdersOf("192.168.77.0/32")).To(BeEmpty())
	claim := newClaim(t, ns.Name, "n", pool.Name, nil)
	cond := readyCondition(t, claim, metav1.ConditionFalse, "SubnetOutsideZone")
	g.Expect(cond.Message).To(ContainSubstring("is not in zone hnet-private"))
	g.Expect(holdersOf("192.168.77.2/32")).To(BeEmpty())

	// Fixing the subnet fixes both. The claim may be asking once more just then (a
	// refusal holds only for the pool as it was, and the pool can turn Ready after the
	// first refusal, which wakes the claim); while that request is out, the webhook
	// refuses a new subnet, as for any claim that may be holding an address, so the user
	// tries again.
	g.Eventually(func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
			return err
		}
		pool.Spec.Subnet, pool.Spec.Gateway = "10.67.0.0/29", "10.67.0.1"
		return env.Client.Update(ctx, pool)
	}, 30*time.Second, 50*time.Millisecond).Should(Succeed())
	g.Expect(boundAddress(t, claim).Spec.Address).To(Equal("10.67.0.2"))
	poolReady(t, pool, metav1.ConditionTrue, "Ready", "accepts zone hnet-private")
	// The check of the new subnet registered its first address for a moment, under the
	// pool's own identity, and gave it back.
	g.Expect(holdersOf("10.67.0.0/32")).To(ConsistOf(And(
		HaveField("ServiceRef.ServiceName", "vitistack-ipam-subnet-probe"), HaveField("ExpiresAt", Not(BeNil())))))
	g.Expect(pool.GetAnnotations()).NotTo(HaveKey(ipamv1alpha1.SubnetProbeAnnotation))
}

// A subnet-mode pool whose Secret is being deleted registers nothing under it: its
// subnet check waits, as a claim would, since the Secret protector lets such a Secret go
// (only records hold it), and a check registered under it then could never be given
// back, nor the pool deleted. The zone's check (a release) still runs; the pool goes.
func TestASubnetCheckRegistersNothingUnderASecretBeingDeleted(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "doomed", Finalizers: []string{"test.vitistack.io/hold"}},
		Data: map[string][]byte{"secret": []byte("doomed-secret-value-1")}}
	g.Expect(env.Client.Create(ctx, sec)).To(Succeed())
	g.Expect(env.Client.Delete(ctx, sec)).To(Succeed())
	spec := subnetPool("hnet-private", ipamv1alpha1.IPv4, "10.71.0.0/29", "10.71.0.1")
	spec.SecretRef = &ipamv1alpha1.SecretReference{Name: "doomed"}
	pool := newPool(t, ns.Name, "doomed", spec)
	// The reconcile that checked the zone would have checked the subnet too.
	poolReady(t, pool, metav1.ConditionTrue, "Ready", "accepts zone hnet-private")
	g.Expect(holdersOf("10.71.0.0/32")).To(BeEmpty(), "the subnet check registered under a Secret being deleted")
	g.Expect(pool.GetAnnotations()).NotTo(HaveKey(ipamv1alpha1.SubnetProbeAnnotation))
	deleteAndWait(t, pool)
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(sec), sec)).To(Succeed())
	sec.Finalizers = nil
	g.Expect(env.Client.Update(ctx, sec)).To(Succeed())
}

// A subnet check cut short (the manager gone between registering the subnet's first
// address and releasing it) is finished by the next reconcile of the pool: the record
// on the pool names what to release, with the identity it was registered under.
func TestACutShortSubnetCheckIsFinished(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	// What a manager that died mid-check left: the registration in the IPAM-API and
	// its record on the pool.
	id := oldCheckIdentity(t)
	registerOldCheck(t, "10.68.0.0/32")
	spec := subnetPool("hnet-private", ipamv1alpha1.IPv4, "10.68.0.0/29", "10.68.0.1")
	pool := &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "cut-short",
		Annotations: map[string]string{ipamv1alpha1.SubnetProbeAnnotation: `{"address":"10.68.0.0/32","identity":` + id + `}`}}, Spec: spec}
	g.Expect(env.Client.Create(ctx, pool)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool)).To(Succeed())
		g.Expect(pool.Annotations).NotTo(HaveKey(ipamv1alpha1.SubnetProbeAnnotation))
	}, eventually, poll).Should(Succeed())
	expectOldCheckReleased(g, "10.68.0.0/32")
	poolReady(t, pool, metav1.ConditionTrue, "Ready", "accepts zone hnet-private")
}

// oldCheckPool is the pool UID a cut-short subnet check was registered under: a pool of
// before, not the one the test creates.
const oldCheckPool = "a-pool-uid-of-before"

// oldCheckIdentity is the identity of such a check, as the pool's record names it.
func oldCheckIdentity(t *testing.T) string {
	return `{"serviceName":"vitistack-ipam-subnet-probe","namespaceID":"` + oldCheckPool + `","clusterID":"` + uidOf(t, "kube-system") + `"}`
}

// registerOldCheck registers address in the IPAM-API under that identity, as a manager
// that died mid-check left it.
func registerOldCheck(t *testing.T, address string) {
	registerDirect(t, `{"secret":"`+defaultSecretValue(t)+`","zone":"hnet-private","ip_family":"ipv4","address":"`+address+`","service":`+
		`{"service_name":"vitistack-ipam-subnet-probe","namespace_id":"`+oldCheckPool+`","cluster_id":"`+uidOf(t, "kube-system")+`",`+
		`"retention_period_days":0,"deny_external_cleanup":false}}`)
}

// expectOldCheckReleased asserts that the registration of a cut-short subnet check (under
// the identity of the pool of before) is released: expiring, or swept already. The pool's
// own check of its subnet may hold the address at that moment, under its own identity.
func expectOldCheckReleased(g Gomega, address string) {
	var old []sim.Holder
	for _, h := range holdersOf(address) {
		if h.NamespaceID == oldCheckPool {
			old = append(old, h)
		}
	}
	g.Expect(old).To(HaveEach(HaveField("ExpiresAt", Not(BeNil()))), "the old check's address is released (expiring, or swept already)")
}

// A subnet check cut short right after its registration was sent (the record names
// when) is given back only once that registration can no longer be carried out: a
// release that overtook a late registration would leave the address registered for
// good. The manager's quarantine is twice its 2 s IPAM-API timeout.
func TestACutShortSubnetCheckWaitsOutItsRequest(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	const quarantine = 4 * time.Second
	id := oldCheckIdentity(t)
	registerOldCheck(t, "10.69.0.0/32")
	sent := time.Now()
	spec := subnetPool("hnet-private", ipamv1alpha1.IPv4, "10.69.0.0/29", "10.69.0.1")
	pool := &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "cut-short-just-now",
		Annotations: map[string]string{ipamv1alpha1.SubnetProbeAnnotation: `{"address":"10.69.0.0/32","identity":` + id +
			`,"attempt":"` + sent.UTC().Format(time.RFC3339Nano) + `"}`}}, Spec: spec}
	g.Expect(env.Client.Create(ctx, pool)).To(Succeed())
	// The pool controller met the record and waits (its log says so) ...
	g.Eventually(func() string { return env.Logs.String() }, eventually, poll).Should(
		MatchRegexp(`subnet check may still be carried out.*"address"="10\.69\.0\.0/32"`))
	// ... and releases the address once the quarantine has passed, not before.
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool)).To(Succeed())
		g.Expect(pool.Annotations).NotTo(HaveKey(ipamv1alpha1.SubnetProbeAnnotation))
	}, eventually, poll).Should(Succeed())
	g.Expect(time.Since(sent)).To(BeNumerically(">=", quarantine), "the record went before the quarantine ended")
	expectOldCheckReleased(g, "10.69.0.0/32")
	poolReady(t, pool, metav1.ConditionTrue, "Ready", "accepts zone hnet-private")
}

// A subnet check cut short whose address cannot be given back (the pool's IPAM-API does
// not answer) says so on the pool at once, the record staying until it is given back;
// it is tried again a minute later, not after the controller's back-off.
func TestACutShortSubnetCheckThatCannotBeFinishedSaysWhy(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	id := oldCheckIdentity(t)
	spec := subnetPool("hnet-private", ipamv1alpha1.IPv4, "10.70.0.0/29", "10.70.0.1")
	spec.Endpoint = "http://127.0.0.1:1"
	pool := &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "cut-short-unreachable",
		Annotations: map[string]string{ipamv1alpha1.SubnetProbeAnnotation: `{"address":"10.70.0.0/32","identity":` + id + `}`}}, Spec: spec}
	g.Expect(env.Client.Create(ctx, pool)).To(Succeed())
	poolReady(t, pool, metav1.ConditionFalse, "IPAMAPIUnreachable",
		"the address 10.70.0.0/32, which a check of the pool's subnet that was cut short registered, could not be given back")
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool)).To(Succeed())
	g.Expect(pool.Annotations).To(HaveKey(ipamv1alpha1.SubnetProbeAnnotation), "the record stays until the address is given back")
}
