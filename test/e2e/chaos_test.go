package e2e

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
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
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/lbservice"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/test/chaos"
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
func chaosPools(t *testing.T, prefix, subnet, gateway string, beforePools ...func(ns string)) (ns, secretValue string) {
	t.Helper()
	ns = newNamespace(t, a, prefix)
	secretValue = canary(prefix)
	newSecret(t, a, ns, "owner", secretValue)
	for _, f := range beforePools {
		f(ns)
	}
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

// parallel runs do for every object from 8 goroutines and fails on the first error.
func parallel[T client.Object](t *testing.T, objs []T, do func(T) error) {
	t.Helper()
	work := make(chan T)
	errs := make(chan error, len(objs))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for o := range work {
				if err := do(o); err != nil {
					errs <- fmt.Errorf("%s: %w", o.GetName(), err)
				}
			}
		})
	}
	for _, o := range objs {
		work <- o
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// deleteAll deletes every object from 8 goroutines (those gone already are fine).
func deleteAll[T client.Object](t *testing.T, objs []T) {
	t.Helper()
	parallel(t, objs, func(o T) error { return client.IgnoreNotFound(a.Client.Delete(context.Background(), o)) })
}

// createServices creates n dual-stack LoadBalancer Services in ns, of zone inet, their
// addresses owned by ns's Secret "owner".
func createServices(t *testing.T, ns string, n int) []*corev1.Service {
	t.Helper()
	svcs := make([]*corev1.Service, n)
	for i := range svcs {
		name := fmt.Sprintf("web-%03d", i)
		svcs[i] = &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{
				ipamv1alpha1.ZoneAnnotation: "inet", ipamv1alpha1.IPFamilyAnnotation: "dual", ipamv1alpha1.SecretAnnotation: "owner"}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": name},
				IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack), IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
				Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
		}
	}
	parallel(t, svcs, func(s *corev1.Service) error { return a.Client.Create(context.Background(), s) })
	return svcs
}

// countServices returns how many of ns's Services have their two addresses, and how
// many there are.
func countServices(ctx context.Context, ns string) (allocated, total int, err error) {
	list := &corev1.ServiceList{}
	if err := a.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
		return 0, 0, err
	}
	for _, s := range list.Items {
		if ips := s.Annotations[lbservice.MetalLBLoadBalancerIPsAnnotation]; strings.Count(ips, ",") == 1 {
			allocated++
		}
	}
	return allocated, len(list.Items), nil
}

// waitServices waits until ns's Services all have their addresses (n > 0) or are all
// gone (n == 0).
func waitServices(t *testing.T, ns string, n int, within time.Duration) {
	t.Helper()
	waitCounted(t, "Service", countServices, ns, n, within)
}

// announcedAsRegistered waits until MetalLB announces, for every one of ns's Services,
// exactly the addresses handed to it, and checks that the IPAM-API holds each of them
// for that Service alone.
func announcedAsRegistered(t *testing.T, ns string) {
	t.Helper()
	g := newG(t)
	list := &corev1.ServiceList{}
	g.Eventually(func(g Gomega) {
		g.Expect(a.Client.List(context.Background(), list, client.InNamespace(ns))).To(Succeed())
		for _, s := range list.Items {
			var ingress []string
			for _, in := range s.Status.LoadBalancer.Ingress {
				ingress = append(ingress, in.IP)
			}
			g.Expect(ingress).To(ConsistOf(strings.Split(s.Annotations[lbservice.MetalLBLoadBalancerIPsAnnotation], ",")),
				"MetalLB's status of Service %s", s.Name)
		}
	}).WithTimeout(2 * timeout).Should(Succeed())
	for _, s := range list.Items {
		for _, in := range s.Status.LoadBalancer.Ingress {
			g.Expect(activeHolders(t, a, in.IP)).To(ConsistOf(HaveField("ServiceName", s.Name)), "the holders of %s (Service %s)", in.IP, s.Name)
		}
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
	waitCounted(t, "claim", countClaims, ns, n, within)
}

// waitCounted waits until count finds n of ns's objects done (n > 0) or none left
// (n == 0).
func waitCounted(t *testing.T, kind string, count func(context.Context, string) (done, total int, err error), ns string, n int, within time.Duration) {
	t.Helper()
	newG(t).Eventually(func(g Gomega) {
		done, total, err := count(context.Background(), ns)
		g.Expect(err).NotTo(HaveOccurred())
		if n == 0 {
			g.Expect(total).To(BeZero(), "not every %s was deleted", kind)
		} else {
			g.Expect(done).To(Equal(n), "not every %s was bound", kind)
		}
	}).WithTimeout(within).WithPolling(time.Second).Should(Succeed())
}

// replicas keeps the leader and one standby replica of the manager running, with
// extra arguments and the chaos leader-election timings. disruptSome kills the leader,
// or restarts the control plane, at random moments of some work; a replica left takes
// the Lease over each time (one that lost its Lease exits, as a Pod's container does),
// and new standbys are started.
type replicas struct {
	t           *testing.T
	args        []string
	managers    []*localcluster.Manager // every one started, for the canary scan
	live        []*localcluster.Manager
	disruptions int
}

// newReplicas hands the work over from aMgr to replicas started with extra arguments:
// aMgr stops (releasing its Lease) once two of them run.
func newReplicas(t *testing.T, extra ...string) *replicas {
	r := &replicas{t: t, args: append(slices.Clone(chaosManagerArgs), extra...), managers: []*localcluster.Manager{aMgr}}
	r.replenish()
	aMgr.Stop()
	r.waitLeader()
	return r
}

// replenish drops the replicas that ended and starts standbys until two run.
func (r *replicas) replenish() {
	r.t.Helper()
	r.live = slices.DeleteFunc(r.live, func(m *localcluster.Manager) bool {
		exited, _ := m.Exited()
		return exited
	})
	for len(r.live) < 2 {
		m, err := a.StartManager(context.Background(), nil, r.args...)
		newG(r.t).Expect(err).NotTo(HaveOccurred())
		r.managers = append(r.managers, m)
		r.live = append(r.live, m)
	}
}

var acquiredLease = regexp.MustCompile(`(?i)successfully acquired lease`)

// leader returns the live replica that holds the Lease (a replica takes it once in its
// life: it exits when it loses it, and says so first), or nil.
func (r *replicas) leader() *localcluster.Manager {
	for _, m := range r.live {
		logs := logsOf(r.t, m)
		if exited, _ := m.Exited(); !exited && acquiredLease.MatchString(logs) && !strings.Contains(logs, "leader election lost") {
			return m
		}
	}
	return nil
}

func (r *replicas) waitLeader() *localcluster.Manager {
	r.t.Helper()
	var leader *localcluster.Manager
	newG(r.t).Eventually(func() *localcluster.Manager {
		leader = r.leader()
		return leader
	}).WithTimeout(timeout).ShouldNot(BeNil(), "no replica leads")
	return leader
}

// killLeader is a disruption: the leading replica is killed with kill -9.
func (r *replicas) killLeader() {
	r.waitLeader().Kill()
}

// restartControlPlane is a disruption: kube-apiserver and etcd stop for down and start
// again.
func (r *replicas) restartControlPlane(down time.Duration) func() {
	return func() { newG(r.t).Expect(a.RestartAPIServer(down)).To(Succeed()) }
}

// disruptSome disrupts n times at random moments of some work: disruption i comes once
// progress reports a random share, within the i-th of n slices, of the work done; it
// stops early when the work is done. After each, a replica leads again.
func (r *replicas) disruptSome(n int, progress func() (done, total int), disrupt func()) {
	r.t.Helper()
	for i := range n {
		share := (float64(i) + rand.Float64()) / float64(n+1)
		var done, total int
		newG(r.t).Eventually(func() bool {
			done, total = progress()
			return total > 0 && (done >= total || float64(done) >= share*float64(total))
		}).WithTimeout(10 * timeout).WithPolling(10 * time.Millisecond).Should(BeTrue())
		if done >= total {
			return
		}
		disrupt()
		r.disruptions++
		r.replenish()
		r.waitLeader()
	}
}

// stop ends the standbys; the leader runs on as aMgr for the next tests and serves the
// webhooks.
func (r *replicas) stop() {
	r.t.Helper()
	leader := r.waitLeader()
	for _, m := range r.live {
		if m != leader {
			m.Stop()
		}
	}
	r.live = []*localcluster.Manager{leader}
	aMgr = leader
	newG(r.t).Expect(a.RouteWebhooksTo(context.Background(), leader)).To(Succeed())
}

// startScenario records the scenario's row when the test ends, passed or failed (a
// failed one with what the accounting oracle finds then).
func startScenario(t *testing.T, row *chaos.Row, nsUIDs map[string]bool) {
	chaos.RecordAtEnd(t, row, func() (chaos.Accounts, error) { return account(context.Background(), a, nsUIDs) })
}

// scanCanaries runs the canary scan (when says at which moment), counts what it found
// in the row, and fails on anything.
func scanCanaries(t *testing.T, row *chaos.Row, when string, managers []*localcluster.Manager, values ...string) {
	t.Helper()
	found := canariesFound(t, a, managers, values)
	row.Canaries += len(found)
	newG(t).Expect(found).To(BeEmpty(), "a secret value shows %s", when)
}

// A burst of claims (routed and subnet pools mixed) and 50 dual-stack LoadBalancer
// Services, MetalLB's controller announcing them, while the leading manager is killed
// with kill -9 again and again and a standby replica takes over each time: MetalLB ends
// announcing for each Service exactly the addresses the IPAM-API holds for it. Then
// everything is deleted, again with kills.
// Nothing leaks, nothing is bound twice, no finalizer is left behind, and no secret
// value shows anywhere, while the objects exist or after.
func TestChaosManagerKilled(t *testing.T) {
	onA.enter(t)
	n, services, kills := 60, 50, 2
	if chaos.Full() {
		n, kills = 1000, 5
	}
	g := newG(t)
	ctx := context.Background()
	ns, secretValue := chaosPools(t, "chaos-kill", "10.60.0.0/22", "10.60.0.1")
	svcNS := newNamespace(t, a, "chaos-kill-svc")
	svcSecret := canary("chaos-kill-svc")
	newSecret(t, a, svcNS, "owner", svcSecret)
	newGlobalPool(t, a, "chaos-inet-ipv4", "inet", ipamv1alpha1.IPv4)
	newGlobalPool(t, a, "chaos-inet-ipv6", "inet", ipamv1alpha1.IPv6)
	nsUIDs := map[string]bool{uidOf(t, a, ns): true, uidOf(t, a, svcNS): true}
	row := &chaos.Row{Scenario: "manager kill -9 during burst and deletes, a standby taking over each time", Claims: n, Services: services}
	startScenario(t, row, nsUIDs)
	// The Service controller and its webhook, as on a management cluster that serves
	// Services too.
	g.Expect(a.SetServiceWebhook(ctx, providerVars(ipamAPI), true)).To(Succeed())
	t.Cleanup(func() { _ = a.SetServiceWebhook(ctx, providerVars(ipamAPI), false) })
	// Slower answers, so that kills land with registrations in flight.
	g.Expect(ipamAPI.SetFaults(ctx, sim.Faults{Latency: 100 * time.Millisecond, LatencyJitter: 100 * time.Millisecond})).To(Succeed())
	t.Cleanup(func() { _ = ipamAPI.SetFaults(ctx, sim.Faults{}) })
	// MetalLB's controller announces what the Services are handed.
	metallb, err := a.StartMetalLB(ctx, localcluster.StandInPools())
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(metallb.Stop)
	// At --v=5, the highest level the provider and controller-runtime log at (client-go
	// traces requests from 6 and logs their bodies, Secrets' included, from 8): the canary
	// scan reads all that the provider can be made to log.
	r := newReplicas(t, "--enable-service-controller", "--default-secret-namespace="+manager.ProviderNamespace, "--v=5")
	t.Cleanup(r.stop)

	claims := createClaims(t, ns, n)
	svcs := createServices(t, svcNS, services)
	r.disruptSome(kills, func() (int, int) {
		bound, _, _ := countClaims(ctx, ns)
		allocated, _, _ := countServices(ctx, svcNS)
		return bound + allocated, n + services
	}, r.killLeader)
	waitClaims(t, ns, n, 10*timeout)
	waitServices(t, svcNS, services, 5*timeout)
	announcedAsRegistered(t, svcNS)
	settledAccounts(t, a, nsUIDs)
	scanCanaries(t, row, "after the burst", r.managers, secretValue, svcSecret)

	// Delete everything, with kills.
	killsWhileBinding := r.disruptions
	deleteAll(t, claims)
	deleteAll(t, svcs)
	r.disruptSome(kills, func() (int, int) {
		_, claimsLeft, _ := countClaims(ctx, ns)
		_, svcsLeft, _ := countServices(ctx, svcNS)
		return n + services - claimsLeft - svcsLeft, n + services
	}, r.killLeader)
	killsWhileDeleting := r.disruptions - killsWhileBinding
	row.Kills = r.disruptions
	row.Detail = fmt.Sprintf("kills: %d while binding, %d while deleting", killsWhileBinding, killsWhileDeleting)
	waitClaims(t, ns, 0, 10*timeout)
	waitServices(t, svcNS, 0, 5*timeout)
	row.SetAccounts(settledAccounts(t, a, nsUIDs))
	stats, err := ipamAPI.Stats(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(stats.OverlappingRegistrations).To(BeZero(), "two registrations of one identity were in flight at once")
	scanCanaries(t, row, "at the end", r.managers, secretValue, svcSecret)
	t.Logf("%d claims and %d Services, %s", n, services, row.Detail)
	g.Expect(killsWhileBinding).To(BeNumerically(">", 0), "no kill landed while the claims were binding: the scenario proved nothing")
	g.Expect(killsWhileDeleting).To(BeNumerically(">", 0), "no kill landed while the claims were deleted: the scenario proved nothing")
}

// kube-apiserver and etcd stop and start again (as when their host reboots) during a
// burst of claims and during their deletes: the leader loses its Lease and exits, a
// replica takes over once the API server is back, and every claim is bound once and
// released once.
func TestChaosControlPlaneRestarted(t *testing.T) {
	onA.enter(t)
	n, restarts, down := 40, 1, 5*time.Second
	if chaos.Full() {
		n, restarts, down = 500, 2, 20*time.Second
	}
	g := newG(t)
	ctx := context.Background()
	ns, secretValue := chaosPools(t, "chaos-restart", "10.63.0.0/22", "10.63.0.1")
	nsUIDs := map[string]bool{uidOf(t, a, ns): true}
	row := &chaos.Row{Scenario: fmt.Sprintf("kube-apiserver and etcd down %s during burst and deletes, the leader exiting and a standby taking over", down), Claims: n}
	startScenario(t, row, nsUIDs)
	g.Expect(ipamAPI.SetFaults(ctx, sim.Faults{Latency: 50 * time.Millisecond, LatencyJitter: 50 * time.Millisecond})).To(Succeed())
	t.Cleanup(func() { _ = ipamAPI.SetFaults(ctx, sim.Faults{}) })
	r := newReplicas(t)
	t.Cleanup(r.stop)

	claims := createClaims(t, ns, n)
	r.disruptSome(restarts, func() (int, int) {
		bound, _, _ := countClaims(ctx, ns)
		return bound, n
	}, r.restartControlPlane(down))
	waitClaims(t, ns, n, 10*timeout)
	settledAccounts(t, a, nsUIDs)
	scanCanaries(t, row, "after the burst", r.managers, secretValue)
	whileBinding := r.disruptions

	deleteAll(t, claims)
	r.disruptSome(restarts, func() (int, int) {
		_, left, _ := countClaims(ctx, ns)
		return n - left, n
	}, r.restartControlPlane(down))
	whileDeleting := r.disruptions - whileBinding
	row.Kills = r.disruptions
	waitClaims(t, ns, 0, 10*timeout)
	row.SetAccounts(settledAccounts(t, a, nsUIDs))
	stats, err := ipamAPI.Stats(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(stats.OverlappingRegistrations).To(BeZero(), "two registrations of one identity were in flight at once")
	scanCanaries(t, row, "at the end", r.managers, secretValue)
	lost := noSplitBrain(t, r.managers)
	row.Detail = fmt.Sprintf("restarts: %d while binding, %d while deleting; %d leaders lost their Lease and exited", whileBinding, whileDeleting, lost)
	t.Logf("%d claims, %s", n, row.Detail)
	g.Expect(whileBinding).To(BeNumerically(">", 0), "no restart landed while the claims were binding: the scenario proved nothing")
	g.Expect(whileDeleting).To(BeNumerically(">", 0), "no restart landed while the claims were deleted: the scenario proved nothing")
	// Each restart outlasts the renew deadline (3 s): the leader of the moment lost its Lease.
	g.Expect(lost).To(BeNumerically(">=", r.disruptions), "fewer leaders lost their Lease than the API server restarted")
}

// noSplitBrain checks the leaders' hand-overs in the replicas' logs and returns how many
// replicas lost their Lease: each that did exited, and logged its last line (so made
// its last write) before the next replica acquired the Lease.
func noSplitBrain(t *testing.T, managers []*localcluster.Manager) int {
	t.Helper()
	g := newG(t)
	// Those that lost it end first, so that their logs are whole.
	logs := map[string]string{}
	for _, m := range managers {
		if strings.Contains(logsOf(t, m), leaseLost) {
			g.Eventually(func() bool { exited, _ := m.Exited(); return exited }).Should(BeTrue(), "%s lost its Lease and did not exit", m.Name)
		}
		logs[m.Name] = logsOf(t, m)
	}
	lost, problems := splitBrain(logs)
	g.Expect(problems).To(BeEmpty())
	return lost
}

const leaseLost = "leader election lost"

// splitBrain reads the replicas' logs (by name): how many lost their Lease, and each
// that logged a line after the next leader acquired the Lease, or lost one it never had.
func splitBrain(logs map[string]string) (lost int, problems []string) {
	type life struct {
		name              string
		acquired, last    time.Time
		led, lostTheLease bool
	}
	var lives []life
	for _, name := range slices.Sorted(maps.Keys(logs)) {
		l := life{name: name}
		for line := range strings.Lines(logs[name]) {
			// The manager's last words ("error: leader election lost") are not klog's.
			l.lostTheLease = l.lostTheLease || strings.Contains(line, leaseLost)
			if at, ok := klogTime(line); ok {
				l.last = at
				if acquiredLease.MatchString(line) {
					l.acquired, l.led = at, true
				}
			}
		}
		lives = append(lives, l)
	}
	for _, l := range lives {
		if !l.lostTheLease {
			continue
		}
		lost++
		if !l.led {
			problems = append(problems, l.name+" lost a Lease it never acquired")
			continue
		}
		var next *life
		for i, o := range lives {
			if o.led && o.acquired.After(l.acquired) && (next == nil || o.acquired.Before(next.acquired)) {
				next = &lives[i]
			}
		}
		if next != nil && !l.last.Before(next.acquired) {
			problems = append(problems, fmt.Sprintf("%s logged until %s, after %s acquired the Lease at %s",
				l.name, l.last.Format(time.StampMicro), next.name, next.acquired.Format(time.StampMicro)))
		}
	}
	return lost, problems
}

// The API server and the IPAM-API misbehave in phases, each asserted to have
// happened: first an admission webhook refuses the manager's protection of the
// pools' Secret and quotes the Secret (its value and fingerprint) in the refusal,
// until a claim says so in its Ready condition; then the IPAM-API answers with its
// HTML catch-all page; then 20 % of its connections reset after the request was
// carried out (the answer is lost, the registration or release is done) on top of
// the next phase; then, for the rest of the run, 20 % of requests are answered 503
// with 500 ms more latency. Every claim is bound once, every one released on deletion,
// and the echoed value shows nowhere.
func TestChaosIPAMAPIFaults(t *testing.T) {
	onA.enter(t)
	n, phase := 30, 3*time.Second
	latency := 500 * time.Millisecond
	if chaos.Full() {
		n, phase = 300, 20*time.Second
	}
	g := newG(t)
	ctx := context.Background()
	// The Secret echoed: the protector's patch is refused, from the moment the pools name
	// the Secret, until a waiting claim says why, with the refusal redacted, in its Ready
	// condition and in an event (which the API server takes only with a note of at most
	// 1 KiB).
	var echo *secretEcho
	ns, secretValue := chaosPools(t, "chaos-api", "10.61.0.0/22", "10.61.0.1", func(ns string) { echo = startSecretEcho(t, ns) })
	// Should the protector have got there before kube-apiserver loaded the webhook, its
	// protection is taken off again: the next attempt, the first claim's own, meets the
	// webhook.
	g.Eventually(func(g Gomega) {
		if echo.refusals.Load() > 0 {
			return
		}
		s := &corev1.Secret{}
		g.Expect(a.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "owner"}, s)).To(Succeed())
		g.Expect(s.Finalizers).NotTo(BeEmpty(), "the protector's patch was neither refused nor made")
		patch := client.MergeFrom(s.DeepCopy())
		s.Finalizers = nil
		delete(s.Annotations, ipamv1alpha1.SecretFingerprintsAnnotation)
		g.Expect(a.Client.Patch(ctx, s, patch)).To(Succeed())
	}).Should(Succeed())
	nsUIDs := map[string]bool{uidOf(t, a, ns): true}
	row := &chaos.Row{Scenario: "API server echoes the Secret in a webhook's refusal; IPAM-API: its HTML page, 20 % answers lost, 20 % 503 and +500 ms", Claims: n}
	startScenario(t, row, nsUIDs)
	t.Cleanup(func() { _ = ipamAPI.SetFaults(ctx, sim.Faults{}) })
	flaky := sim.Faults{Latency: latency, ErrorRate: 0.2, ErrorStatus: 503, ErrorBody: `{"message":"upstream unavailable"}`}
	stats := func() sim.Stats {
		st, err := ipamAPI.Stats(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		return st
	}
	// phaseOf keeps the faults f for at least the phase's length and until count says
	// they did something, and returns that count.
	phaseOf := func(name string, f sim.Faults, count func(before, now sim.Stats) int) int {
		g.Expect(ipamAPI.SetFaults(ctx, f)).To(Succeed())
		before, since := stats(), time.Now()
		var c int
		g.Eventually(func() bool {
			c = count(before, stats())
			return c > 0 && time.Since(since) >= phase
		}).WithTimeout(5*timeout).WithPolling(100*time.Millisecond).Should(BeTrue(), "the phase %q did nothing", name)
		return c
	}

	claims := createClaims(t, ns, n)
	g.Eventually(func(g Gomega) {
		list := &ipamv1.IPAddressClaimList{}
		g.Expect(a.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		g.Expect(list.Items).To(ContainElement(HaveField("Status.Conditions", ContainElement(And(
			HaveField("Reason", ipamv1alpha1.ClaimReadySecretNotProtectedReason),
			HaveField("Message", And(ContainSubstring("chaos policy refuses"), ContainSubstring("[redacted]"))))))))
		events := &corev1.EventList{}
		g.Expect(a.Client.List(ctx, events, client.InNamespace(ns))).To(Succeed())
		g.Expect(events.Items).To(ContainElement(And(HaveField("Reason", ipamv1alpha1.ClaimReadySecretNotProtectedReason),
			HaveField("Message", ContainSubstring("chaos policy refuses")))))
	}).WithTimeout(5*timeout).WithPolling(time.Second).Should(Succeed(), "no claim says that its Secret's protection is refused")
	// The echo lives in the waiting claims' conditions only now: the scan reads them.
	scanCanaries(t, row, "while the claims show the echoed refusal", []*localcluster.Manager{aMgr}, secretValue)
	// The HTML page, from the first request on: set before the protection is let through.
	g.Expect(ipamAPI.SetFaults(ctx, sim.Faults{ErrorRate: 1, ErrorStatus: 200, ErrorContentType: "text/html", ErrorBody: "<html><body>IPAM</body></html>"})).To(Succeed())
	echo.on.Store(false)
	refusals := echo.refusals.Load()
	injected := func(before, now sim.Stats) int { return now.InjectedErrors - before.InjectedErrors }
	html := phaseOf("HTML page", sim.Faults{ErrorRate: 1, ErrorStatus: 200, ErrorContentType: "text/html", ErrorBody: "<html><body>IPAM</body></html>"}, injected)
	lossy := flaky
	lossy.DropAfterRate = 0.2
	lost := phaseOf("answers lost", lossy, func(before, now sim.Stats) int { return now.DroppedAfter - before.DroppedAfter })
	g.Expect(ipamAPI.SetFaults(ctx, flaky)).To(Succeed())
	flakyFrom, flakyStart := stats(), time.Now()
	waitClaims(t, ns, n, 10*timeout)
	bindTime := time.Since(flakyStart)
	settledAccounts(t, a, nsUIDs)
	scanCanaries(t, row, "after the burst", []*localcluster.Manager{aMgr}, secretValue)

	// Deleting under the same faults.
	deleteStart := time.Now()
	deleteAll(t, claims)
	waitClaims(t, ns, 0, 10*timeout)
	t.Logf("%d claims bound %s into the last phase, deleted in %s", n, bindTime.Round(time.Second), time.Since(deleteStart).Round(time.Second))
	end := stats()
	g.Expect(ipamAPI.SetFaults(ctx, sim.Faults{})).To(Succeed())
	unavailable := injected(flakyFrom, end)
	row.Faults = int(refusals) + html + lost + unavailable
	row.Detail = fmt.Sprintf("Secret echoes refused: %d, HTML pages: %d, answers lost: %d, 503s: %d", refusals, html, lost, unavailable)
	row.SetAccounts(settledAccounts(t, a, nsUIDs))
	g.Expect(end.OverlappingRegistrations).To(BeZero(), "two registrations of one identity were in flight at once")
	scanCanaries(t, row, "at the end", []*localcluster.Manager{aMgr}, secretValue)
	t.Logf("%s", row.Detail)
	g.Expect(refusals).To(BeNumerically(">", 0), "the webhook refused nothing")
	g.Expect(unavailable).To(BeNumerically(">", 0), "no 503 was answered after the lossy phase")
}

// The IPAM-API is unreachable while claims are deleted and while the namespace that
// holds them and their Secret is deleted: nothing is given up (the claims wait with
// their finalizers, the Secret and the namespace stay), and once it is back every
// address is released and everything goes.
func TestChaosIPAMAPIDownWhileDeleting(t *testing.T) {
	onA.enter(t)
	n, down := 20, 5*time.Second
	if chaos.Full() {
		n, down = 200, 60*time.Second
	}
	g := newG(t)
	ctx := context.Background()
	ns, secretValue := chaosPools(t, "chaos-down", "10.62.0.0/22", "10.62.0.1")
	nsUID := uidOf(t, a, ns)
	nsUIDs := map[string]bool{nsUID: true}
	row := &chaos.Row{Scenario: fmt.Sprintf("IPAM-API unreachable %s while claims and their namespace are deleted", down), Claims: n}
	startScenario(t, row, nsUIDs)
	claims := createClaims(t, ns, n)
	waitClaims(t, ns, n, 5*timeout)
	settledAccounts(t, a, nsUIDs)
	scanCanaries(t, row, "after the burst", []*localcluster.Manager{aMgr}, secretValue)
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
	row.Faults = refused
	row.Detail = fmt.Sprintf("requests refused while down: %d", refused)
	g.Expect(refused).To(BeNumerically(">", 0), "nothing tried to reach the IPAM-API while it was down")

	g.Expect(ipamAPI.SetFaults(ctx, sim.Faults{})).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(a.Client.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{}))
	}).WithTimeout(10*timeout).WithPolling(time.Second).Should(BeTrue(), "namespace %s is not gone", ns)
	row.SetAccounts(settledAccounts(t, a, nsUIDs))
	scanCanaries(t, row, "at the end", []*localcluster.Manager{aMgr}, secretValue)
}

// The split-brain check sees a replica that logged after the next one acquired the
// Lease, and one that lost a Lease it never had; an orderly hand-over passes.
func TestSplitBrainCheckSeesPlantedOverlaps(t *testing.T) {
	g := newG(t)
	const (
		acquired = `I1202 10:00:01.000000   1 leaderelection.go:271] "successfully acquired lease" lock="capi-ipam-vitistack-system/x"` + "\n"
		write    = `I1202 10:00:05.000000   1 bound.go:333] "Registered address in the IPAM-API" address="10.0.0.1"` + "\n"
		lostIt   = "error: leader election lost\n"
	)
	later := func(line, at string) string { return line[:1] + "1202 " + at + line[21:] }
	orderly := map[string]string{
		"m1": acquired + write + lostIt,
		"m2": later(acquired, "10:00:09.000000"),
	}
	lost, problems := splitBrain(orderly)
	g.Expect(problems).To(BeEmpty())
	g.Expect(lost).To(Equal(1))

	overlap := map[string]string{
		"m1": acquired + lostIt + later(write, "10:00:09.500000"),
		"m2": later(acquired, "10:00:09.000000"),
		"m3": lostIt,
	}
	_, problems = splitBrain(overlap)
	g.Expect(problems).To(ConsistOf(
		"m1 logged until Dec  2 10:00:09.500000, after m2 acquired the Lease at Dec  2 10:00:09.000000",
		"m3 lost a Lease it never acquired"))
}
