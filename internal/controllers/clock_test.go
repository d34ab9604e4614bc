package controllers_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/test/chaos"
)

// jumpingClock is the host's clock moved by an offset the test sets: the manager's
// host clock jumping (NTP stepping it, a VM resumed, an operator's date -s).
type jumpingClock struct{ offset atomic.Int64 }

func (c *jumpingClock) Now() time.Time                  { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *jumpingClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c *jumpingClock) jump(to time.Duration)           { c.offset.Store(int64(to)) }

// startManagerWithClock restarts the manager with clock as its wall clock, and with
// the suite's options again after the test; it returns the options it started with.
func startManagerWithClock(t *testing.T, clock *jumpingClock) manager.Options {
	t.Helper()
	return startManagerWith(t, func(o *manager.Options) { o.Clock = clock })
}

// The manager dies just after the IPAM-API registered an address whose answer was
// lost, and comes back on a host whose clock was set back an hour (a VM restored from
// a snapshot, NTP stepping a clock that ran fast). The new process finds the claim's
// pending attempt an hour "in the future": it waits the request out for one quarantine
// (4 s here), not for an hour more, then binds the address the IPAM-API registered,
// without a second registration.
func TestClockBackAfterACrash(t *testing.T) {
	g := NewWithT(t)
	clock := &jumpingClock{}
	opts := startManagerWithClock(t, clock)
	ns := newNamespace(t)
	api, pool := answerLostOnce(t, ns.Name)

	claim := newClaim(t, ns.Name, "late", pool.Name, nil)
	me := identity(t, ns, "late")
	g.Eventually(func() []sim.Registration { return api.HeldBy(me) }, eventually, poll).Should(HaveLen(1))
	g.Eventually(func() string { return recordOf(t, claim) }, eventually, poll).Should(ContainSubstring(`"attempt"`))
	g.Expect(env.StopManager()).To(Succeed())
	clock.jump(-time.Hour)
	g.Expect(env.StartManager(ctx, opts)).To(Succeed())

	addr := boundAddress(t, claim)
	g.Expect(addr.Spec.Address + "/32").To(Equal(api.HeldBy(me)[0].Address))
	g.Expect(api.HeldBy(me)).To(HaveLen(1), "a second registration")
	g.Expect(api.Stats().OverlappingRegistrations).To(BeZero())
}

// settled waits for the accounting oracle to find nothing wrong, and returns what it
// found last.
func settled(t *testing.T, account func() (chaos.Accounts, error)) chaos.Accounts {
	t.Helper()
	var last chaos.Accounts
	NewWithT(t).Eventually(func(g Gomega) {
		var err error
		last, err = account()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(last.Zero()).To(BeTrue(), "the accounting oracle: %s", last)
	}, 3*time.Minute, 500*time.Millisecond).Should(Succeed())
	return last
}

// The clock jumps forward and back by up to two hours, every 50 ms, while a burst of
// claims of a routed and a subnet pool is bound and deleted, with one registration
// answer in ten lost: every claim is bound once, to its own address, nothing is
// registered twice at once, and everything is released.
func TestClockJumpsDuringABurst(t *testing.T) {
	n := 60
	if chaos.Full() {
		n = 400
	}
	g := NewWithT(t)
	clock := &jumpingClock{}
	startManagerWithClock(t, clock)
	ns := newNamespace(t)
	api, url, stop := env.ExtraSim()
	t.Cleanup(stop)
	// The scope holds the provider's namespace too: the default Secret, which the pools
	// use, is protected exactly while pools or records need it.
	provider := &corev1.Namespace{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: manager.ProviderNamespace}, provider)).To(Succeed())
	account := func() (chaos.Accounts, error) {
		return chaos.Account(ctx, env.Client, api.Registrations(), map[string]bool{string(ns.UID): true, string(provider.UID): true},
			types.NamespacedName{Namespace: mgrOpts.DefaultSecretNamespace, Name: mgrOpts.DefaultSecretName})
	}
	row := &chaos.Row{Scenario: "manager's clock jumps ±2 h every 50 ms during burst and deletes, 10 % of answers lost (envtest, injected clock)", Claims: n}
	chaos.RecordAtEnd(t, row, account)
	routed := routedPool("hnet-private", ipamv1alpha1.IPv4)
	routed.Endpoint = url
	subnet := subnetPool("hnet-private", ipamv1alpha1.IPv4, "10.77.0.0/22", "10.77.0.1")
	subnet.Endpoint = url
	// Both Ready first: the subnet pool's check of its subnet registers an address of
	// its own, and the faults are for the claims.
	poolReady(t, newPool(t, ns.Name, "routed", routed), metav1.ConditionTrue, ipamv1alpha1.PoolReadyReason, "")
	poolReady(t, newPool(t, ns.Name, "subnet", subnet), metav1.ConditionTrue, ipamv1alpha1.PoolReadyReason, "")
	g.Expect(api.SetFaults(sim.Faults{Latency: 5 * time.Millisecond, LatencyJitter: 20 * time.Millisecond,
		DropAfterNext: 3, DropAfterRate: 0.1, Routes: []sim.Route{sim.RouteRegister}})).To(Succeed())

	var jumps atomic.Int64
	done := make(chan struct{})
	var jumper sync.WaitGroup
	jumper.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
				clock.jump(time.Duration(rand.Int64N(int64(4*time.Hour))) - 2*time.Hour)
				jumps.Add(1)
			}
		}
	})
	t.Cleanup(func() { close(done); jumper.Wait() })

	claims := make([]*ipamv1.IPAddressClaim, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range claims {
		pool := "routed"
		if i%2 == 1 {
			pool = "subnet"
		}
		claims[i] = &ipamv1.IPAddressClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: fmt.Sprintf("node-%03d", i)},
			Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{
				APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: ipamv1alpha1.VitistackIPPoolKind, Name: pool}},
		}
		wg.Go(func() { errs[i] = env.Client.Create(ctx, claims[i]) })
	}
	wg.Wait()
	for _, err := range errs {
		g.Expect(err).NotTo(HaveOccurred())
	}
	unbound := func(g Gomega) []ipamv1.IPAddressClaim {
		list := &ipamv1.IPAddressClaimList{}
		g.Expect(env.Client.List(ctx, list, client.InNamespace(ns.Name))).To(Succeed())
		return slices.DeleteFunc(list.Items, func(c ipamv1.IPAddressClaim) bool { return c.Status.AddressRef.Name != "" })
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range unbound(g) {
				t.Logf("claim %s is not bound; conditions: %v; annotations: %v\nthe manager's log about it:\n%s",
					c.Name, c.Status.Conditions, c.Annotations, managerLines(c.Name))
			}
		}
	})
	g.Eventually(func(g Gomega) {
		var names []string
		for _, c := range unbound(g) {
			names = append(names, c.Name)
		}
		g.Expect(names).To(BeEmpty(), "claims not bound")
	}, 3*time.Minute, 500*time.Millisecond).Should(Succeed())

	// Every claim has its own address, the one the IPAM-API holds for it, and nothing
	// else is held.
	settled(t, account)
	overlapping := api.Stats().OverlappingRegistrations

	for _, c := range claims {
		g.Expect(client.IgnoreNotFound(env.Client.Delete(ctx, c))).To(Succeed())
	}
	g.Eventually(func() []ipamv1.IPAddressClaim {
		list := &ipamv1.IPAddressClaimList{}
		g.Expect(env.Client.List(ctx, list, client.InNamespace(ns.Name))).To(Succeed())
		return list.Items
	}, 3*time.Minute, 500*time.Millisecond).Should(BeEmpty(), "claims left")
	row.SetAccounts(settled(t, account))
	lost := api.Stats().DroppedAfter
	row.Faults = lost
	row.Detail = fmt.Sprintf("clock jumps: %d, answers lost: %d", jumps.Load(), lost)
	t.Logf("%d claims, %d clock jumps, %d answers lost", n, jumps.Load(), lost)
	g.Expect(overlapping).To(BeZero(), "two registrations of one identity were in flight at once")
	g.Expect(jumps.Load()).To(BeNumerically(">", 0))
	g.Expect(lost).To(BeNumerically(">=", 3), "no answer was lost: the waits were not tried")
}
