package writebudget

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/ipamutil"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/apicount"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/testenv"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

var (
	env  *testenv.Env
	opts = testenv.DefaultOptions()
	ctx  = context.Background()
)

func TestMain(m *testing.M) {
	var err error
	if env, err = testenv.Start(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// claimsPerPool is the size of the burst in each pool (one routed, one subnet-mode).
const claimsPerPool = 60

// TestWriteBudget binds a burst of claims in a routed and a subnet-mode pool and counts
// every write the API server served meanwhile. Per claim made without the release
// finalizer (as Cluster API's infrastructure providers make them), ipamutil's loop writes
// the finalizer in a reconcile of its own; then one reconcile writes the pending record,
// the IPAddress and the addressRef, and the next, which the addressRef brings, the Ready
// condition (Cluster API's patch helper writes conditions in a patch of their own, first,
// and Ready must not come before the addressRef): five writes. No event; pool status about one patch a
// second per pool. Then it restarts the provider, waits until every claim was reconciled
// again, and counts nothing written and nothing registered.
func TestWriteBudget(t *testing.T) {
	g := NewWithT(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "budget-"}}
	g.Expect(env.Client.Create(ctx, ns)).To(Succeed())
	pools := map[string]ipamv1alpha1.VitistackIPPoolSpec{
		"routed": {Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4},
		"subnet": {Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4, Subnet: "10.70.0.0/24", Gateway: "10.70.0.1"},
	}
	for name, spec := range pools {
		g.Expect(env.Client.Create(ctx, &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name}, Spec: spec})).To(Succeed())
	}
	// The one-time work is not a claim's: the pools' first status, the default secret
	// created and protected. One claim per pool, bound before counting.
	for name := range pools {
		createClaims(g, ns.Name, name, name+"-warm", 1)
	}
	waitBound(g, ns.Name, 2)
	waitInUse(g, ns.Name, map[string]int32{"routed": 1, "subnet": 1})

	before, err := apicount.Read(ctx, env.Config)
	g.Expect(err).NotTo(HaveOccurred())
	simBefore := env.Sim.Stats()
	reconciledBefore := reconciles("ipaddressclaim")
	readsBefore := readers()
	start := time.Now()
	var wg sync.WaitGroup
	for name := range pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			createClaims(g, ns.Name, name, name, claimsPerPool)
		}()
	}
	wg.Wait()
	total := 2 + 2*claimsPerPool
	waitBound(g, ns.Name, total)
	waitInUse(g, ns.Name, map[string]int32{"routed": 1 + claimsPerPool, "subnet": 1 + claimsPerPool})
	burst := time.Since(start)
	after, err := apicount.Read(ctx, env.Config)
	g.Expect(err).NotTo(HaveOccurred())
	simAfter := env.Sim.Stats()

	n := float64(2 * claimsPerPool)
	all := after.Since(before)
	writes := providerWrites(all)
	poolPatches := writes.Get("PATCH", "vitistackippools/status")
	claimWrites := writes.Total() - poolPatches
	t.Logf("%d claims bound in %s: %.2f writes a claim, %g pool status patches; all writes:\n%s",
		int(n), burst.Round(time.Millisecond), claimWrites/n, poolPatches, writes)
	budget := apicount.Counts{
		{Verb: "PATCH", Resource: "ipaddressclaims"}:        2 * n, // ipamutil's finalizer; the pending record
		{Verb: "POST", Resource: "ipaddresses"}:             n,
		{Verb: "PATCH", Resource: "ipaddressclaims/status"}: 2 * n, // addressRef, then Ready
		// Coalesced: about one reconcile a second per pool, a status and a conditions
		// patch each (the subnet pool's Exhausted message counts addresses).
		{Verb: "PATCH", Resource: "vitistackippools/status"}: 2 * 2 * (burst.Seconds() + 3),
	}
	for k, v := range writes {
		g.Expect(v).To(BeNumerically("<=", budget[k]), "%s: %g writes for %d claims, budget %g", k, v, int(n), budget[k])
	}
	g.Expect(claimWrites).To(BeNumerically("<=", 5*n), "writes per claim over budget:\n%s", writes)
	// Three reconciles bind a claim: ipamutil's finalizer brings it back, and so does its
	// addressRef (that reconcile says Ready); its IPAddress does not (a few more come from a
	// subnet pick that met another claim's, or a read of the cache that lagged).
	claimReconciles := reconciles("ipaddressclaim") - reconciledBefore
	t.Logf("%.2f reconciles a claim", claimReconciles/n)
	g.Expect(claimReconciles).To(BeNumerically("<=", 3.25*n), "reconciles of the claims while binding")
	// One uncached read of the owning Secret per reconcile that may send (none is kept
	// for the next claim: it may be let go, deleted or changed a moment later), and one
	// more after a claim's first record names it, which confirms that the protector is not
	// letting it go (two-phase: see SecretLettingGoAnnotation).
	t.Logf("%g uncached Secret reads", all.Get("GET", "secrets"))
	g.Expect(all.Get("GET", "secrets")).To(BeNumerically("<=", readers()-readsBefore+n+2), "uncached Secret reads: more than one a reconcile and one a claim")
	g.Expect(simAfter.Total(sim.RouteRegister)-simBefore.Total(sim.RouteRegister)).To(Equal(int(n)), "IPAM-API registrations")

	// Nothing changes: a restarted provider reconciles every claim and writes nothing.
	reconciled := reconciles("ipaddressclaim")
	g.Expect(env.StopManager()).To(Succeed())
	before, err = apicount.Read(ctx, env.Config)
	g.Expect(err).NotTo(HaveOccurred())
	simBefore = env.Sim.Stats()
	logged := len(env.Logs.String())
	g.Expect(env.StartManager(ctx, opts)).To(Succeed())
	// Settled: each pool checked once more (a readiness check is a release of an address
	// nobody holds, answered 404), every claim reconciled, and the claims' queue empty
	// with no reconcile running, so that nothing the restart does is left for the window
	// of the deletions below.
	g.Eventually(func() int {
		return env.Sim.Stats().Count(sim.RouteRelease, http.StatusNotFound) - simBefore.Count(sim.RouteRelease, http.StatusNotFound)
	}).WithTimeout(time.Minute).Should(BeNumerically(">=", len(pools)), "the pools' readiness checks after the restart")
	g.Eventually(func(g Gomega) {
		g.Expect(reconciles("ipaddressclaim")-reconciled).To(BeNumerically(">=", total), "every claim reconciled after the restart")
		g.Expect(gauge("workqueue_depth", "ipaddressclaim")).To(BeZero(), "claims queued")
		g.Expect(gauge("controller_runtime_active_workers", "ipaddressclaim")).To(BeZero(), "claims being reconciled")
	}).WithTimeout(time.Minute).Should(Succeed())
	after, err = apicount.Read(ctx, env.Config)
	g.Expect(err).NotTo(HaveOccurred())
	simAfter = env.Sim.Stats()
	g.Expect(providerWrites(after.Since(before))).To(BeEmpty(), "writes for bound claims that did not change; the provider logged:\n%s", unusual(logged))
	g.Expect(simAfter.Total(sim.RouteRegister)-simBefore.Total(sim.RouteRegister)).To(BeZero(), "IPAM-API registrations for bound claims")
	g.Expect(simAfter.Total(sim.RouteRelease)-simBefore.Total(sim.RouteRelease)).To(Equal(len(pools)), "IPAM-API releases: one readiness check a pool")

	// Deleting them all: one release each, never two, and per claim the IPAddress's
	// ProtectAddress finalizer, the IPAddress and the claim's finalizer; no event.
	before, err = apicount.Read(ctx, env.Config)
	g.Expect(err).NotTo(HaveOccurred())
	simBefore = env.Sim.Stats()
	readsBefore = readers()
	logged = len(env.Logs.String())
	start = time.Now()
	list := &ipamv1.IPAddressClaimList{}
	g.Expect(env.Client.List(ctx, list, client.InNamespace(ns.Name))).To(Succeed())
	for i := range list.Items {
		g.Expect(env.Client.Delete(ctx, &list.Items[i])).To(Succeed())
	}
	g.Eventually(func(g Gomega) {
		claims, addrs := &ipamv1.IPAddressClaimList{}, &ipamv1.IPAddressList{}
		g.Expect(env.Client.List(ctx, claims, client.InNamespace(ns.Name))).To(Succeed())
		g.Expect(env.Client.List(ctx, addrs, client.InNamespace(ns.Name))).To(Succeed())
		g.Expect(claims.Items).To(BeEmpty())
		g.Expect(addrs.Items).To(BeEmpty())
	}).WithTimeout(2 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
	waitInUse(g, ns.Name, map[string]int32{"routed": 0, "subnet": 0})
	after, err = apicount.Read(ctx, env.Config)
	g.Expect(err).NotTo(HaveOccurred())
	all = after.Since(before)
	writes = providerWrites(all).Only(func(k apicount.Key) bool { return k != apicount.Key{Verb: "DELETE", Resource: "ipaddressclaims"} })
	t.Logf("%d claims deleted: writes\n%s", total, writes)
	// An event or a write over budget: what the provider said while it released (a
	// conflict, a transient error) tells which path took the extra write.
	said := fmt.Sprintf("events:\n%s\nthe provider logged:\n%s", eventsSince(g, ns.Name, start), unusual(logged))
	simAfter = env.Sim.Stats()
	g.Expect(simAfter.Total(sim.RouteRelease)-simBefore.Total(sim.RouteRelease)).To(Equal(total), "IPAM-API releases: one a claim, never two "+
		"(by status, %v before, %v after); %s", simBefore.Requests[sim.RouteRelease], simAfter.Requests[sim.RouteRelease], said)
	g.Expect(simAfter.Total(sim.RouteRegister)-simBefore.Total(sim.RouteRegister)).To(BeZero(), "IPAM-API registrations while deleting; %s", said)
	budget = apicount.Counts{
		{Verb: "PATCH", Resource: "ipaddresses"}:             float64(total), // ipamutil's ProtectAddress finalizer
		{Verb: "DELETE", Resource: "ipaddresses"}:            float64(total),
		{Verb: "PATCH", Resource: "ipaddressclaims"}:         float64(total), // the finalizer with the record
		{Verb: "PATCH", Resource: "secrets"}:                 2,              // the default secret let go (again after a conflict)
		{Verb: "PUT", Resource: "configmaps"}:                2,              // and taken off the list of protected Secrets
		{Verb: "PATCH", Resource: "vitistackippools/status"}: 2 * 2 * (time.Since(start).Seconds() + 3),
	}
	for k, v := range writes {
		g.Expect(v).To(BeNumerically("<=", budget[k]), "%s: %g writes deleting %d claims, budget %g; %s", k, v, total, budget[k], said)
	}
	// One uncached read of the owning Secret per release (and the protector's as it
	// lets the Secret go): at most one a reconcile.
	t.Logf("%g uncached Secret reads", all.Get("GET", "secrets"))
	g.Expect(all.Get("GET", "secrets")).To(BeNumerically("<=", readers()-readsBefore+2), "uncached Secret reads: more than one a reconcile")
}

// TestARetryRecordsItsRequest: claims whose first registration is answered with a 503
// are retried, each request recorded with an attempt time of its own before it is sent
// (so a claim's record names the one request of it that may still be carried out): one
// claim patch per request, the failure and the recovery in the status, an event for each.
func TestARetryRecordsItsRequest(t *testing.T) {
	g := NewWithT(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "retry-"}}
	g.Expect(env.Client.Create(ctx, ns)).To(Succeed())
	g.Expect(env.Client.Create(ctx, &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "routed"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4}})).To(Succeed())
	createClaims(g, ns.Name, "routed", "warm", 1)
	waitBound(g, ns.Name, 1)

	const n = 20
	t.Cleanup(env.Sim.ClearFaults)
	env.Sim.SetFaultRoutes(sim.RouteRegister)
	g.Expect(env.Sim.FailNext(n, http.StatusServiceUnavailable, `{"message":"busy"}`)).To(Succeed())
	before, err := apicount.Read(ctx, env.Config)
	g.Expect(err).NotTo(HaveOccurred())
	simBefore := env.Sim.Stats()
	createClaims(g, ns.Name, "routed", "retried", n)
	waitBound(g, ns.Name, 1+n)
	after, err := apicount.Read(ctx, env.Config)
	g.Expect(err).NotTo(HaveOccurred())
	writes := providerWrites(after.Since(before))
	t.Logf("%d claims, %d registrations answered 503 first: writes\n%s", n, n, writes)
	g.Expect(env.Sim.Stats().Total(sim.RouteRegister)-simBefore.Total(sim.RouteRegister)).To(Equal(2*n), "each claim sent twice")
	// ipamutil's finalizer, then one claim patch per request.
	g.Expect(writes.Get("PATCH", "ipaddressclaims")).To(BeNumerically("<=", 3*n), "more than one claim patch per request")
	g.Expect(writes.Get("POST", "ipaddresses")).To(BeNumerically("==", n))
}

// eventsSince lists the events in namespace ns since start, one a line: object, reason,
// message.
func eventsSince(g Gomega, ns string, start time.Time) string {
	list := &eventsv1.EventList{}
	g.Expect(env.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	var lines []string
	for _, e := range list.Items {
		if !e.CreationTimestamp.Time.Before(start.Truncate(time.Second)) {
			lines = append(lines, fmt.Sprintf("  %s %s: %s: %s", e.Regarding.Kind, e.Regarding.Name, e.Reason, e.Note))
		}
	}
	return strings.Join(lines, "\n")
}

// providerWrites are the writes in c that are not the test's own (creating claims,
// pools, namespaces) nor the API server's (its leases).
func providerWrites(c apicount.Counts) apicount.Counts {
	return c.WritesOnly().Only(func(k apicount.Key) bool {
		switch {
		case k.Verb == "POST" && (k.Resource == "ipaddressclaims" || k.Resource == "namespaces" || k.Resource == "vitistackippools"):
			return false
		case k.Resource == "leases":
			return false
		}
		return true
	})
}

func createClaims(g Gomega, ns, pool, prefix string, n int, annotations ...map[string]string) {
	for i := range n {
		c := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: prefix + "-" + strconv.Itoa(i)},
			Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{APIGroup: ipamv1alpha1.GroupVersion.Group,
				Kind: ipamv1alpha1.VitistackIPPoolKind, Name: pool}}}
		if len(annotations) > 0 {
			c.Annotations = annotations[0]
		}
		g.Expect(env.Client.Create(ctx, c)).To(Succeed())
	}
}

// waitBound waits until n claims of the namespace have an address and are Ready.
func waitBound(g Gomega, ns string, n int) {
	waitClaims(g, ns, n, 2*time.Minute, func(c *ipamv1.IPAddressClaim) bool {
		return c.Status.AddressRef.Name != "" && conditions.IsTrue(c, ipamv1.IPAddressClaimReadyCondition)
	})
}

// waitFinalized waits until n claims in ns carry the release finalizer.
func waitFinalized(g Gomega, ns string, n int) {
	waitClaims(g, ns, n, time.Minute, func(c *ipamv1.IPAddressClaim) bool {
		return slices.Contains(c.Finalizers, ipamutil.ReleaseAddressFinalizer)
	})
}

// waitClaims waits, at most timeout, until exactly n claims of the namespace are as is says.
func waitClaims(g Gomega, ns string, n int, timeout time.Duration, is func(*ipamv1.IPAddressClaim) bool) {
	g.Eventually(func(g Gomega) {
		list := &ipamv1.IPAddressClaimList{}
		g.Expect(env.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		matched := 0
		for i := range list.Items {
			if is(&list.Items[i]) {
				matched++
			}
		}
		g.Expect(matched).To(Equal(n))
	}).WithTimeout(timeout).WithPolling(100 * time.Millisecond).Should(Succeed())
}

// waitInUse waits until the pools' status counts the addresses: the last coalesced
// status patch went out.
func waitInUse(g Gomega, ns string, want map[string]int32) {
	g.Eventually(func(g Gomega) {
		for name, n := range want {
			p := &ipamv1alpha1.VitistackIPPool{}
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p)).To(Succeed())
			g.Expect(p.Status.AddressesInUse).NotTo(BeNil())
			g.Expect(*p.Status.AddressesInUse).To(Equal(n), "pool %s", name)
		}
	}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
}

// reconciles is controller-runtime's count of finished reconciles of a controller in
// this process (all results).
// readers counts the reconciles of the controllers that read Secrets: claims, the
// protector, and the pools (checking theirs).
func readers() float64 {
	return reconciles("ipaddressclaim") + reconciles("secret-protector") + reconciles(ipamv1alpha1.VitistackIPPoolKind)
}

func reconciles(controller string) float64 {
	return counter("controller_runtime_reconcile_total", controller)
}

// gauge is a controller-runtime gauge of a controller in this process (counter reads both).
func gauge(name, controller string) float64 { return counter(name, controller) }

// counter sums a controller-runtime counter (or gauge) of a controller in this process.
func counter(name, controller string) float64 {
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		panic(fmt.Sprintf("gathering this process's metrics: %v", err)) // never 0 for a counter not read
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if label(m, "controller") == controller {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestBurstUnderANewSecret wakes a burst of claims at once under a Secret nothing was
// registered under yet.
//   - Named by the pool: the Secret protector protects it as soon as the pool exists, so
//     every claim writes its pending record once, with its attempt time, and sends.
//   - Named by the claims' annotation: it is not protected until a record names it. The
//     claims that find another claim's record naming it, or another claim writing the
//     first such record, wait for the protector without writing anything, and then
//     write their pending record once. Only the first claim writes its record twice:
//     first without an attempt time (which asks for the protection), then with one.
func TestBurstUnderANewSecret(t *testing.T) {
	for _, byPool := range []bool{true, false} {
		name := map[bool]string{true: "named by the pool", false: "named by the claims"}[byPool]
		t.Run(name, func(t *testing.T) { burstUnderANewSecret(t, byPool) })
	}
}

func burstUnderANewSecret(t *testing.T, byPool bool) {
	g := NewWithT(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "fresh-"}}
	g.Expect(env.Client.Create(ctx, ns)).To(Succeed())
	fresh := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "fresh"},
		Data: map[string][]byte{"secret": []byte("a-new-secret-value-of-32-charact")}}
	g.Expect(env.Client.Create(ctx, fresh)).To(Succeed())
	// Paused while the claims are made: unpausing wakes them all at once.
	pool := &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "fresh",
		Annotations: map[string]string{clusterv1.PausedAnnotation: "true"}},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4}}
	var annotations map[string]string
	if byPool {
		pool.Spec.SecretRef = &ipamv1alpha1.SecretReference{Name: "fresh", Key: "secret"}
	} else {
		annotations = map[string]string{ipamv1alpha1.SecretAnnotation: "fresh"}
	}
	g.Expect(env.Client.Create(ctx, pool)).To(Succeed())
	protected := func() []string {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(fresh), fresh)).To(Succeed())
		return fresh.Finalizers
	}
	if byPool {
		start := time.Now()
		g.Eventually(protected).WithTimeout(time.Minute).Should(ContainElement(ipamv1alpha1.SecretInUseFinalizer),
			"the pool's Secret is protected before any claim")
		t.Logf("the pool's Secret was protected %s after the pool was created", time.Since(start).Round(time.Millisecond))
	}
	const n = 60
	createClaims(g, ns.Name, pool.Name, "fresh", n, annotations)
	// ipamutil's loop adds the release finalizer before it looks at the pool (a paused pool
	// does not hold it back): counted from when every claim has it.
	waitFinalized(g, ns.Name, n)

	before, err := apicount.Read(ctx, env.Config)
	g.Expect(err).NotTo(HaveOccurred())
	simBefore := env.Sim.Stats()
	errorsBefore := counter("controller_runtime_reconcile_errors_total", "ipaddressclaim")
	reconciledBefore := readers()
	p := client.MergeFrom(pool.DeepCopy())
	delete(pool.Annotations, clusterv1.PausedAnnotation)
	g.Expect(env.Client.Patch(ctx, pool, p)).To(Succeed())
	waitBound(g, ns.Name, n)
	after, err := apicount.Read(ctx, env.Config)
	g.Expect(err).NotTo(HaveOccurred())

	writes := providerWrites(after.Since(before))
	t.Logf("%d claims bound under a new Secret: writes\n%s", n, writes)
	g.Expect(protected()).To(ContainElement(ipamv1alpha1.SecretInUseFinalizer), "the Secret is protected")
	g.Expect(env.Sim.Stats().Total(sim.RouteRegister)-simBefore.Total(sim.RouteRegister)).To(Equal(n), "one registration a claim")
	g.Expect(writes.Get("POST", "ipaddresses")).To(BeNumerically("==", n))
	reads := after.Since(before).Get("GET", "secrets")
	if byPool {
		g.Expect(writes.Get("PATCH", "ipaddressclaims")).To(BeNumerically("==", n), "claims wrote their pending record more than once")
		g.Expect(writes.Get("PATCH", "secrets")).To(BeZero(), "the Secret was protected again")
		// Two uncached reads a claim (the second confirms, after its first record, that the
		// Secret is not being let go), and one for each readiness check of the pool (the
		// unpause is a change).
		g.Expect(reads).To(BeNumerically("<=", 2*n+2), "uncached Secret reads: more than two a claim")
	} else {
		// Each claim's record asks for the protection, then goes out with its attempt
		// time: two claim patches, four writes a claim in all.
		g.Expect(writes.Get("PATCH", "ipaddressclaims")).To(BeNumerically("<=", 2*n),
			"claims wrote their pending record more than twice")
	}
	// A claim reads the Secret, uncached, in each reconcile that may send under it: when
	// it finds it unprotected, and again when it is woken (how often a claim is
	// reconciled before the Secret is protected depends on timing). The protector and
	// the pool read it once a reconcile too (the protector twice when a webhook refused
	// its patch, to cut the Secret's values out of the error).
	reconciled := readers() - reconciledBefore
	t.Logf("%g uncached Secret reads in %g reconciles", reads, reconciled)
	g.Expect(reads).To(BeNumerically("<=", reconciled+n+2), "uncached Secret reads: more than one a reconcile and one a claim")
	// Waiting for the Secret ends a reconcile with an error, for ipamutil's loop would
	// create the IPAddress otherwise (controller-runtime counts it in its error metric),
	// but the log says Waiting, not "Reconciler error".
	t.Logf("%g reconciles ended in a wait", counter("controller_runtime_reconcile_errors_total", "ipaddressclaim")-errorsBefore)
	g.Expect(env.Logs.String()).NotTo(MatchRegexp(`"msg"="Reconciler error".*waiting for Secret `+ns.Name+"/fresh"), "a wait logged as an error")
}

// routine are the messages every claim logs as it binds, is reconciled again, or is released.
var routine = regexp.MustCompile(`"msg"="(Registered address in the IPAM-API|Released address in the IPAM-API|IPAddress \S+ \(\S+\) has been (created|unchanged))"`)

// unusual is what the provider logged about claims, and every error, since offset from,
// routine lines left out, for a failure's message: at most 40 lines.
func unusual(from int) string {
	var out []string
	for line := range strings.Lines(env.Logs.String()[from:]) {
		if (strings.Contains(line, "IPAddressClaim") || strings.Contains(line, `"error"=`)) && !routine.MatchString(line) {
			out = append(out, strings.TrimRight(line, "\n"))
		}
	}
	if len(out) > 40 {
		out = append(out[:40], fmt.Sprintf("(%d lines more)", len(out)-40))
	}
	return strings.Join(out, "\n")
}
