package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// The chaos scenarios run short in make test and at full size in make test-chaos
// (E2E_CHAOS=full), which also writes their table to out/chaos/summary.md. Each one
// ends with the accounting oracle (account) finding nothing leaked, duplicated,
// orphaned or stuck, and no canary secret value anywhere.

// chaosManagerArgs are the leader-election timings of the replicas the scenarios start:
// a killed leader's Lease runs out in seconds, not the default 15.
var chaosManagerArgs = []string{"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms"}

// chaosPools creates, in a new namespace, a Secret with a canary value and two pools
// owned by it: routed (zone hnet-private) and subnet mode (a /22 of that zone).
func chaosPools(t *testing.T, prefix, subnet, gateway string) (ns, secretValue string) {
	t.Helper()
	ns = newNamespace(t, a, prefix)
	secretValue = canary(prefix)
	newSecret(t, a, ns, "owner", secretValue)
	g := newG(t)
	ctx := context.Background()
	ref := &ipamv1alpha1.SecretReference{Name: "owner"}
	g.Expect(a.Client.Create(ctx, &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "routed"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4, SecretRef: ref}})).To(Succeed())
	g.Expect(a.Client.Create(ctx, &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "subnet"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4, SecretRef: ref,
			Subnet: subnet, Gateway: gateway}})).To(Succeed())
	return ns, secretValue
}

// createClaims creates n claims in ns, half of each pool, from 8 goroutines.
func createClaims(t *testing.T, ns string, n int) []*ipamv1.IPAddressClaim {
	t.Helper()
	claims := make([]*ipamv1.IPAddressClaim, n)
	for i := range claims {
		pool := "routed"
		if i%2 == 1 {
			pool = "subnet"
		}
		claims[i] = &ipamv1.IPAddressClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("node-%04d", i)},
			Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{
				APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: ipamv1alpha1.VitistackIPPoolKind, Name: pool}},
		}
	}
	parallel(t, claims, func(c *ipamv1.IPAddressClaim) error { return a.Client.Create(context.Background(), c) })
	return claims
}

// parallel runs do for every claim from 8 goroutines and fails on the first error.
func parallel(t *testing.T, claims []*ipamv1.IPAddressClaim, do func(*ipamv1.IPAddressClaim) error) {
	t.Helper()
	work := make(chan *ipamv1.IPAddressClaim)
	errs := make(chan error, len(claims))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for c := range work {
				if err := do(c); err != nil {
					errs <- fmt.Errorf("%s: %w", c.Name, err)
				}
			}
		})
	}
	for _, c := range claims {
		work <- c
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// countClaims returns how many of ns's claims are bound, and how many there are.
func countClaims(ctx context.Context, ns string) (bound, total int, err error) {
	list := &ipamv1.IPAddressClaimList{}
	if err := a.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
		return 0, 0, err
	}
	for _, c := range list.Items {
		if c.Status.AddressRef.Name != "" {
			bound++
		}
	}
	return bound, len(list.Items), nil
}

// waitClaims waits until ns's claims are all bound (n > 0) or all gone (n == 0).
func waitClaims(t *testing.T, ns string, n int, within time.Duration) {
	t.Helper()
	newG(t).Eventually(func(g Gomega) {
		bound, total, err := countClaims(context.Background(), ns)
		g.Expect(err).NotTo(HaveOccurred())
		if n == 0 {
			g.Expect(total).To(BeZero(), "not every claim was deleted")
		} else {
			g.Expect(bound).To(Equal(n), "not every claim was bound")
		}
	}).WithTimeout(within).WithPolling(time.Second).Should(Succeed())
}

// killer kills the leading manager at random moments and keeps one standby replica
// running besides the leader: after a kill, one of the replicas left takes the Lease
// over, and a new standby is started.
type killer struct {
	t        *testing.T
	managers []*localcluster.Manager // every one started, for the canary scan
	live     []*localcluster.Manager // the leader (aMgr) and the standbys
	kills    int
}

func newKiller(t *testing.T) *killer {
	k := &killer{t: t, managers: []*localcluster.Manager{aMgr}, live: []*localcluster.Manager{aMgr}}
	k.startStandby()
	return k
}

func (k *killer) startStandby() {
	k.t.Helper()
	m, err := a.StartManager(context.Background(), nil, chaosManagerArgs...)
	newG(k.t).Expect(err).NotTo(HaveOccurred())
	k.managers = append(k.managers, m)
	k.live = append(k.live, m)
}

var acquiredLease = regexp.MustCompile(`(?i)successfully acquired lease`)

// leader returns the live replica that holds the Lease (a replica takes it once in its
// life: it exits when it loses it), or nil.
func (k *killer) leader() *localcluster.Manager {
	for _, m := range k.live {
		if acquiredLease.MatchString(m.Logs()) {
			return m
		}
	}
	return nil
}

// killSome kills the leader n times at random moments of some work: kill i comes once
// progress reports a random share, within the i-th of n slices, of the work done; it
// stops early when the work is done.
func (k *killer) killSome(n int, progress func() (done, total int)) {
	k.t.Helper()
	for i := range n {
		share := (float64(i) + rand.Float64()) / float64(n+1)
		var done, total int
		newG(k.t).Eventually(func() bool {
			done, total = progress()
			return total > 0 && (done >= total || float64(done) >= share*float64(total))
		}).WithTimeout(10 * timeout).WithPolling(10 * time.Millisecond).Should(BeTrue())
		if done >= total {
			return
		}
		var leader *localcluster.Manager
		newG(k.t).Eventually(func() *localcluster.Manager {
			leader = k.leader()
			return leader
		}).WithTimeout(timeout).ShouldNot(BeNil(), "no replica leads")
		leader.Kill()
		k.kills++
		k.live = slices.DeleteFunc(k.live, func(m *localcluster.Manager) bool { return m == leader })
		k.startStandby()
		// One of the others takes over once the dead one's Lease runs out.
		newG(k.t).Eventually(func() *localcluster.Manager { return k.leader() }).WithTimeout(timeout).
			ShouldNot(BeNil(), "no standby took over")
	}
}

// stop ends the standbys; the leader runs on as aMgr for the next tests and serves the
// webhooks.
func (k *killer) stop() {
	k.t.Helper()
	leader := k.leader()
	newG(k.t).Expect(leader).NotTo(BeNil(), "no replica leads")
	for _, m := range k.live {
		if m != leader {
			m.Stop()
		}
	}
	k.live = []*localcluster.Manager{leader}
	aMgr = leader
	newG(k.t).Expect(a.RouteWebhooksTo(context.Background(), leader)).To(Succeed())
}

// A burst of claims (routed and subnet pools mixed) while the leading manager is
// killed with kill -9 again and again and a standby replica takes over each time; then
// every claim is deleted, again with kills. Nothing leaks, nothing is bound twice, no
// finalizer is left behind, and no secret value shows anywhere.
func TestChaosManagerKilled(t *testing.T) {
	n, kills := 60, 2
	if chaosFull() {
		n, kills = 1000, 5
	}
	g := newG(t)
	ctx := context.Background()
	start := time.Now()
	ns, secretValue := chaosPools(t, "chaos-kill", "10.60.0.0/22", "10.60.0.1")
	nsUIDs := map[string]bool{uidOf(t, a, ns): true}
	// Slower answers, so that kills land with registrations in flight.
	g.Expect(ipamAPI.SetFaults(ctx, sim.Faults{Latency: 100 * time.Millisecond, LatencyJitter: 100 * time.Millisecond})).To(Succeed())
	t.Cleanup(func() { _ = ipamAPI.SetFaults(ctx, sim.Faults{}) })
	k := newKiller(t)
	t.Cleanup(k.stop)

	claims := createClaims(t, ns, n)
	k.killSome(kills, func() (int, int) {
		bound, _, _ := countClaims(ctx, ns)
		return bound, n
	})
	waitClaims(t, ns, n, 10*timeout)
	bound := settledAccounts(t, a, nsUIDs)
	g.Expect(bound.zero()).To(BeTrue())

	// Delete everything, with kills.
	killsWhileBinding := k.kills
	parallel(t, claims, func(c *ipamv1.IPAddressClaim) error { return client.IgnoreNotFound(a.Client.Delete(ctx, c)) })
	k.killSome(kills, func() (int, int) {
		_, left, _ := countClaims(ctx, ns)
		return n - left, n
	})
	waitClaims(t, ns, 0, 10*timeout)
	end := settledAccounts(t, a, nsUIDs)
	stats, err := ipamAPI.Stats(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(stats.OverlappingRegistrations).To(BeZero(), "two registrations of one identity were in flight at once")
	found := canariesFound(t, a, k.managers, []string{secretValue})
	g.Expect(found).To(BeEmpty(), "a secret value shows")
	t.Logf("%d claims, %d kills while binding, %d while deleting", n, killsWhileBinding, k.kills-killsWhileBinding)
	g.Expect(killsWhileBinding).To(BeNumerically(">", 0), "no kill landed while the claims were binding: the scenario proved nothing")
	recordChaos(chaosRow{Scenario: "manager kill -9 during burst and deletes (standby takes over)", Claims: n, Kills: k.kills,
		Duration: time.Since(start), Leaked: len(end.Leaked), Duplicated: len(end.Duplicated), Orphaned: len(end.Orphaned),
		Stuck: len(end.Stuck), Canaries: len(found)})
}

// The IPAM-API misbehaves for the whole run: 20 % of requests answered 503 and 500 ms
// more latency; for a while its HTML catch-all page instead of answers; for a while
// connections reset after it processed a request (the answer is lost, the registration
// or release is done). Every claim is bound once, and every one released on deletion.
func TestChaosIPAMAPIFaults(t *testing.T) {
	n, phase := 30, 3*time.Second
	latency := 500 * time.Millisecond
	if chaosFull() {
		n, phase = 300, 20*time.Second
	}
	g := newG(t)
	ctx := context.Background()
	start := time.Now()
	ns, secretValue := chaosPools(t, "chaos-api", "10.61.0.0/22", "10.61.0.1")
	nsUIDs := map[string]bool{uidOf(t, a, ns): true}
	before, err := ipamAPI.Stats(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = ipamAPI.SetFaults(ctx, sim.Faults{}) })
	flaky := sim.Faults{Latency: latency, ErrorRate: 0.2, ErrorStatus: 503, ErrorBody: `{"message":"upstream unavailable"}`}
	set := func(f sim.Faults) { g.Expect(ipamAPI.SetFaults(ctx, f)).To(Succeed()) }

	// While the claims come: its HTML page for a phase, then for a phase 20 % of the
	// connections reset after the request was carried out (on top of the flaky
	// answers), then flaky answers for the rest of the run.
	set(sim.Faults{ErrorRate: 1, ErrorStatus: 200, ErrorContentType: "text/html", ErrorBody: "<html><body>IPAM</body></html>"})
	claims := createClaims(t, ns, n)
	time.Sleep(phase)
	lossy := flaky
	lossy.DropAfterRate = 0.2
	set(lossy)
	time.Sleep(phase)
	set(flaky)
	waitClaims(t, ns, n, 10*timeout)
	bindTime := time.Since(start)
	bound := settledAccounts(t, a, nsUIDs)
	g.Expect(bound.zero()).To(BeTrue())

	// Deleting under the same faults.
	deleteStart := time.Now()
	parallel(t, claims, func(c *ipamv1.IPAddressClaim) error { return client.IgnoreNotFound(a.Client.Delete(ctx, c)) })
	waitClaims(t, ns, 0, 10*timeout)
	t.Logf("%d claims bound in %s, deleted in %s", n, bindTime.Round(time.Second), time.Since(deleteStart).Round(time.Second))
	set(sim.Faults{})
	end := settledAccounts(t, a, nsUIDs)
	after, err := ipamAPI.Stats(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	faults := after.InjectedErrors - before.InjectedErrors + after.DroppedAfter - before.DroppedAfter
	g.Expect(faults).To(BeNumerically(">", 0), "no fault was injected")
	g.Expect(after.OverlappingRegistrations).To(Equal(before.OverlappingRegistrations), "two registrations of one identity were in flight at once")
	found := canariesFound(t, a, []*localcluster.Manager{aMgr}, []string{secretValue})
	g.Expect(found).To(BeEmpty(), "a secret value shows")
	recordChaos(chaosRow{Scenario: "IPAM-API: 20 % 503 and +500 ms throughout; a phase of its HTML page; a phase of 20 % answers lost", Claims: n, Faults: faults,
		Duration: time.Since(start), Leaked: len(end.Leaked), Duplicated: len(end.Duplicated), Orphaned: len(end.Orphaned),
		Stuck: len(end.Stuck), Canaries: len(found)})
}

// The IPAM-API is unreachable while claims are deleted and while the namespace that
// holds them and their Secret is deleted: nothing is given up (the claims wait with
// their finalizers, the Secret and the namespace stay), and once it is back every
// address is released and everything goes.
func TestChaosIPAMAPIDownWhileDeleting(t *testing.T) {
	n, down := 20, 5*time.Second
	if chaosFull() {
		n, down = 200, 60*time.Second
	}
	g := newG(t)
	ctx := context.Background()
	start := time.Now()
	ns, secretValue := chaosPools(t, "chaos-down", "10.62.0.0/22", "10.62.0.1")
	nsUID := uidOf(t, a, ns)
	nsUIDs := map[string]bool{nsUID: true}
	claims := createClaims(t, ns, n)
	waitClaims(t, ns, n, 5*timeout)
	t.Cleanup(func() { _ = ipamAPI.SetFaults(ctx, sim.Faults{}) })
	g.Expect(ipamAPI.SetFaults(ctx, sim.Faults{Down: true})).To(Succeed())
	before, err := ipamAPI.Stats(ctx)
	g.Expect(err).NotTo(HaveOccurred())

	// Half the claims deleted one by one, then the namespace with the rest and the Secret.
	parallel(t, claims[:n/2], func(c *ipamv1.IPAddressClaim) error { return a.Client.Delete(ctx, c) })
	g.Expect(a.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	time.Sleep(down)
	_, total, err := countClaims(ctx, ns)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(total).To(Equal(n), "claims went while their addresses could not be released")
	secret := &corev1.Secret{}
	g.Expect(a.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "owner"}, secret)).To(Succeed(), "the Secret went while it still owned addresses")
	after, err := ipamAPI.Stats(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	refused := after.DownRejections - before.DownRejections
	g.Expect(refused).To(BeNumerically(">", 0), "nothing tried to reach the IPAM-API while it was down")

	g.Expect(ipamAPI.SetFaults(ctx, sim.Faults{})).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(a.Client.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{}))
	}).WithTimeout(10*timeout).WithPolling(time.Second).Should(BeTrue(), "namespace %s is not gone", ns)
	end := settledAccounts(t, a, nsUIDs)
	found := canariesFound(t, a, []*localcluster.Manager{aMgr}, []string{secretValue})
	g.Expect(found).To(BeEmpty(), "a secret value shows")
	recordChaos(chaosRow{Scenario: fmt.Sprintf("IPAM-API unreachable %s while claims and their namespace are deleted", down), Claims: n,
		Faults: refused, Duration: time.Since(start), Leaked: len(end.Leaked), Duplicated: len(end.Duplicated), Orphaned: len(end.Orphaned),
		Stuck: len(end.Stuck), Canaries: len(found)})
}
