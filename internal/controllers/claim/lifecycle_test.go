package claim_test

import (
	"os"
	"path/filepath"
	"regexp"
	"sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/ipamutil"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// A scenario sets the cluster up (without faults), then acts and lets it settle; the
// matrix repeats the act with a conflict at, or the process dying after, every one of
// its Kubernetes writes, and checks the promise each time.
type scenario struct {
	name  string
	setup func(w *world)
	act   func(w *world)
	then  func(t *testing.T, w *world)
}

func secretObj(name, value string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name}, Data: map[string][]byte{"secret": []byte(value)}}
}

func claimObj(name, pool string, ann map[string]string) *ipamv1.IPAddressClaim {
	return &ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name, Annotations: ann},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{
			APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: ipamv1alpha1.VitistackIPPoolKind, Name: pool}},
	}
}

func pools(w *world) {
	w.create(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "routed"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4}})
	w.create(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "subnet"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4, Subnet: "10.50.0.0/29", Gateway: "10.50.0.1"}})
	w.create(secretObj("old", "old-secret-value-1"))
	w.create(secretObj("new", "new-secret-value-2"))
}

func (w *world) get(obj client.Object) client.Object {
	w.t.Helper()
	must(w.t, w.direct.Get(w.ctx, client.ObjectKeyFromObject(obj), obj))
	return obj
}

func (w *world) addressOf(name string) *ipamv1.IPAddress {
	a := &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name}}
	if err := w.direct.Get(w.ctx, client.ObjectKeyFromObject(a), a); err != nil {
		return nil
	}
	return a
}

// bound checks that each claim is bound as a user sees it: Ready=True, and its
// addressRef names its IPAddress, which exists and belongs to it. It returns the
// IPAddresses (nil for a claim that is not bound).
func (w *world) bound(t *testing.T, names ...string) []*ipamv1.IPAddress {
	t.Helper()
	out := make([]*ipamv1.IPAddress, len(names))
	for i, n := range names {
		c := w.get(claimObj(n, "", nil)).(*ipamv1.IPAddressClaim)
		if ready := readyOf(c); ready == nil || ready.Status != metav1.ConditionTrue {
			t.Errorf("claim %s is not Ready: %v\n%s", n, c.Status.Conditions, w.describe())
		}
		if c.Status.AddressRef.Name == "" {
			t.Errorf("claim %s has no addressRef\n%s", n, w.describe())
			continue
		}
		a := w.addressOf(c.Status.AddressRef.Name)
		if a == nil || a.Spec.ClaimRef.Name != n || a.Spec.Address == "" {
			t.Errorf("claim %s's addressRef %s names no IPAddress of it: %v", n, c.Status.AddressRef.Name, a)
			continue
		}
		out[i] = a
	}
	return out
}

func (w *world) deleteClaims(names ...string) {
	for _, n := range names {
		must(w.t, w.direct.Delete(w.ctx, claimObj(n, "", nil)))
	}
}

func (w *world) gone(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		c := claimObj(n, "", nil)
		if err := w.direct.Get(w.ctx, client.ObjectKeyFromObject(c), c); err == nil {
			t.Errorf("claim %s still exists: finalizers %v, conditions %v", n, c.Finalizers, c.Status.Conditions)
		}
	}
	if live := w.live(); len(live) != 0 {
		t.Errorf("the stand-in still holds %v", live)
	}
}

var scenarios = []scenario{
	{
		name:  "allocate routed and subnet",
		setup: pools,
		act: func(w *world) {
			w.create(claimObj("r", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
			w.create(claimObj("s", "subnet", nil))
			w.settle()
		},
		then: func(t *testing.T, w *world) { w.bound(t, "r", "s") },
	},
	{
		name: "rotate",
		setup: func(w *world) {
			pools(w)
			w.create(claimObj("r", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
			w.settle()
		},
		act: func(w *world) {
			c := w.get(claimObj("r", "", nil)).(*ipamv1.IPAddressClaim)
			c.Annotations[ipamv1alpha1.SecretAnnotation] = "new"
			must(w.t, w.direct.Update(w.ctx, c))
			w.settle()
		},
		then: func(t *testing.T, w *world) {
			a := w.bound(t, "r")[0]
			if a == nil {
				return
			}
			rec, _ := record.OnAddress(a.Labels, a.Annotations)
			if rec.Secret.Name != "new" {
				t.Errorf("the IPAddress records the secret %s, want new", rec.Secret)
			}
			reg, _ := w.api.Registration(rec.Address)
			if reg.SecretFingerprint != sim.Fingerprint("new-secret-value-2") {
				t.Errorf("the IPAM-API does not hold %s under the new secret", rec.Address)
			}
		},
	},
	{
		name: "release, two claims sharing a Secret at once",
		setup: func(w *world) {
			pools(w)
			w.create(claimObj("a", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
			w.create(claimObj("b", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
			w.create(claimObj("s", "subnet", nil))
			w.settle()
		},
		act: func(w *world) {
			w.deleteClaims("a", "b", "s")
			w.settle()
		},
		then: func(t *testing.T, w *world) { w.gone(t, "a", "b", "s") },
	},
	{
		// Leak path 2: a registration the IPAM-API refuses proves nothing is held; the
		// record goes, and with it the Secret's protection.
		name: "refused registration leaves its Secret unprotected",
		setup: func(w *world) {
			pools(w)
			registerElsewhere(w, "83.118.168.9/32")
		},
		act: func(w *world) {
			w.create(claimObj("taker", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old", ipamv1alpha1.AddressesAnnotation: "83.118.168.9"}))
			w.settle()
		},
		then: func(t *testing.T, w *world) {
			c := w.get(claimObj("taker", "", nil)).(*ipamv1.IPAddressClaim)
			if _, ok := c.Annotations[ipamv1alpha1.RegistrationAnnotation]; ok {
				t.Errorf("the refused claim keeps a record")
			}
			if s := w.get(secretObj("old", "")).(*corev1.Secret); len(s.Finalizers) != 0 {
				t.Errorf("Secret old keeps %v although nothing is registered under it", s.Finalizers)
			}
			// Refused for a reason only a user can fix: not asked again until something changes.
			sent := w.api.Stats().Total(sim.RouteRegister)
			w.settle()
			w.settle()
			if again := w.api.Stats().Total(sim.RouteRegister) - sent; again != 0 {
				t.Errorf("the refused registration was sent %d more times", again)
			}
		},
	},
	{
		// Leak path 3: a release with a changed Secret value would get "not held" and
		// abandon the address; it waits for the value to be restored.
		name: "release waits for a changed Secret value to be restored",
		setup: func(w *world) {
			pools(w)
			w.create(claimObj("r", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
			w.settle()
			s := w.get(secretObj("old", "")).(*corev1.Secret)
			s.Data["secret"] = []byte("changed-by-someone")
			must(w.t, w.direct.Update(w.ctx, s))
		},
		act: func(w *world) {
			w.deleteClaims("r")
			w.settle()
			c := w.get(claimObj("r", "", nil)).(*ipamv1.IPAddressClaim)
			if cond := readyOf(c); cond == nil || cond.Reason != ipamv1alpha1.ClaimReadyReleaseFailedReason ||
				!strings.Contains(cond.Message, "changed since") {
				w.t.Errorf("the claim does not say why it is kept: %v", c.Status.Conditions)
			}
			if len(w.live()) != 1 {
				w.t.Errorf("the address was given up: %v", w.live())
			}
			s := w.get(secretObj("old", "")).(*corev1.Secret)
			s.Data["secret"] = []byte("old-secret-value-1")
			must(w.t, w.direct.Update(w.ctx, s))
			w.settle()
		},
		then: func(t *testing.T, w *world) { w.gone(t, "r") },
	},
	{
		// A namespace's deletion deletes a bound claim's IPAddress before the claim (the
		// IPAddress has no finalizer): the claim's own record still says its address was
		// registered, so it is released with the retention the user asked for.
		name: "release keeps retention when the IPAddress goes first",
		setup: func(w *world) {
			pools(w)
			w.create(claimObj("r", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old",
				ipamv1alpha1.RetentionPeriodDaysAnnotation: "7"}))
			w.settle()
		},
		act: func(w *world) {
			w.loseAddress("r")
			w.deleteClaims("r")
			w.settle()
		},
		then: func(t *testing.T, w *world) {
			w.gone(t, "r")
			retained := 0
			for _, r := range w.api.Registrations() {
				for _, h := range r.Holders {
					if h.ServiceName == "r" && h.ExpiresAt != nil {
						retained++
						if days := time.Until(*h.ExpiresAt).Hours() / 24; days < 6.9 || days > 7.1 {
							t.Errorf("%s is retained for %.1f days, want 7", r.Address, days)
						}
					}
				}
			}
			if retained != 1 {
				t.Errorf("%d addresses retained for the claim's identity, want 1: %v", retained, w.api.Registrations())
			}
		},
	},
	{
		// Someone outside the cluster holds the first candidate under the same secret:
		// the IPAM-API adds the claim as a second holder and answers "updated". The
		// claim gives it back and binds the next one, whatever write fails or wherever
		// the process dies on the way (an "updated" answer to a candidate is never taken
		// as the claim's own: after a lost answer it cannot tell whose it is).
		name: "subnet candidate held under the same secret",
		setup: func(w *world) {
			pools(w)
			registerShared(w, "10.50.0.2/32")
		},
		act: func(w *world) {
			w.create(claimObj("s", "subnet", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
			w.settle()
		},
		then: func(t *testing.T, w *world) {
			a := w.bound(t, "s")[0]
			if a != nil && a.Spec.Address == "10.50.0.2" {
				t.Errorf("the claim was bound to 10.50.0.2, which someone else holds")
			}
			if live := w.live()["10.50.0.2/32"]; len(live) != 0 {
				t.Errorf("the claim keeps a hold on 10.50.0.2: %v", live)
			}
		},
	},
	{
		// A bound subnet claim whose IPAddress is lost (deleted by hand) gets its address
		// back: the IPAM-API's "updated" is its own hold, as it was bound to it.
		name: "subnet claim gets its lost IPAddress back",
		setup: func(w *world) {
			pools(w)
			w.create(claimObj("s", "subnet", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
			w.settle()
		},
		act: func(w *world) {
			w.loseAddress("s")
			w.settle()
		},
		then: func(t *testing.T, w *world) {
			if a := w.bound(t, "s")[0]; a != nil && a.Spec.Address != "10.50.0.2" {
				t.Errorf("the claim came back with %s, want its address 10.50.0.2", a.Spec.Address)
			}
			if live := w.live(); len(live) != 1 {
				t.Errorf("the stand-in holds %v for the claim, want 10.50.0.2 alone", live)
			}
		},
	},
	{
		// An address retained for a released claim's identity is requested by another
		// claim under the same secret (the IPAM-API lets any holder of the secret join an
		// address, and cannot tell the provider who retains one); then the first claim is
		// created again, and the IPAM-API hands its identity the same address back. It
		// is never bound to both without consent: the claim that comes back waits,
		// holding its registration, until the other lets the address go.
		name: "a retained address is never bound twice",
		setup: func(w *world) {
			pools(w)
			w.create(claimObj("a", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old", ipamv1alpha1.RetentionPeriodDaysAnnotation: "7"}))
			w.settle()
			x := w.addressOf("a").Spec.Address
			w.deleteClaims("a")
			w.settle()
			w.create(claimObj("b", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old", ipamv1alpha1.AddressesAnnotation: x}))
			w.settle()
		},
		act: func(w *world) {
			x := w.addressOf("b").Spec.Address
			w.create(claimObj("a", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old", ipamv1alpha1.RetentionPeriodDaysAnnotation: "7"}))
			w.settle()
			if a := w.addressOf("a"); a != nil && a.Spec.Address == x {
				w.t.Errorf("%s is bound to claims a and b, neither with a share key", x)
			}
			a := w.get(claimObj("a", "", nil)).(*ipamv1.IPAddressClaim)
			if c := readyOf(a); c == nil || c.Status != metav1.ConditionFalse || c.Reason != ipamv1alpha1.ClaimReadyAddressInUseReason {
				w.t.Errorf("the claim whose identity got %s back does not say it waits for b: %v", x, a.Status.Conditions)
			}
			w.deleteClaims("b")
			w.settle()
		},
		then: func(t *testing.T, w *world) {
			if a := w.bound(t, "a")[0]; a == nil || a.Spec.Address != "83.118.168.0" {
				t.Errorf("a did not bind the address its identity holds once b let go: %v", a)
			}
		},
	},
	{
		// A Service moves to another pool of the same zone and family: its controller
		// makes the new claim before it deletes the old one, and marks the old one as
		// superseded by it. Both carry the Service's IPAM-API identity, so the new claim
		// takes the registration over (the same address) instead of waiting for the old
		// one to go, and the old one goes without releasing what the new one holds.
		name:  "a Service's claim moves to another pool of the same zone",
		setup: servicePools(ipamv1alpha1.IPv4, ipamv1alpha1.IPv4),
		act:   replaceServiceClaim("web-ipv4-moved", "svc-b"),
		then: func(t *testing.T, w *world) {
			a := w.bound(t, "web-ipv4-moved")[0]
			if a != nil && a.Spec.Address != "83.118.168.0" {
				t.Errorf("the moved claim got %s, want the Service's address 83.118.168.0", a.Spec.Address)
			}
			if live := w.live(); len(live) != 1 || len(live["83.118.168.0/32"]) != 1 {
				t.Errorf("the stand-in holds %v, want the Service's address for its identity alone", live)
			}
			if n := w.api.Stats().Total(sim.RouteRelease); n != 0 {
				t.Errorf("the move sent %d releases, want none", n)
			}
		},
	},
	{
		// A Service switches family (ipv4 to ipv6): its controller makes the IPv6 claim,
		// marks the IPv4 one as superseded by it, and deletes it once the IPv6 one is
		// bound. Another family is another IPAM-API identity: nothing is taken over, the
		// IPv4 address is released, and nothing waits for anything.
		name:  "a Service's claim switches family",
		setup: servicePools(ipamv1alpha1.IPv4, ipamv1alpha1.IPv6),
		act:   replaceServiceClaim("web-ipv6", "svc-b"),
		then: func(t *testing.T, w *world) {
			if c := claimObj("web-ipv4", "", nil); w.direct.Get(w.ctx, client.ObjectKeyFromObject(c), c) == nil {
				t.Errorf("the IPv4 claim stays: finalizers %v, conditions %v", c.Finalizers, c.Status.Conditions)
			}
			a := w.bound(t, "web-ipv6")[0]
			if a == nil {
				return
			}
			if live := w.live(); len(live) != 1 || len(live[a.Spec.Address+"/128"]) != 1 {
				t.Errorf("the stand-in holds %v, want the IPv6 address alone", live)
			}
		},
	},
}

// servicePools makes the pools svc-a and svc-b of zone inet, of the families given,
// and binds the claim web-ipv4 of Service web in svc-a.
func servicePools(a, b ipamv1alpha1.IPFamily) func(w *world) {
	return func(w *world) {
		for name, fam := range map[string]ipamv1alpha1.IPFamily{"svc-a": a, "svc-b": b} {
			w.create(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name},
				Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: fam, AllowIdentityOverrides: true}})
		}
		w.create(secretObj("old", "old-secret-value-1"))
		w.create(serviceClaim("web-ipv4", "svc-a"))
		w.settle()
	}
}

// replaceServiceClaim does what the Service controller does when web moves: it makes
// the new claim, marks web-ipv4 as superseded by it, and deletes web-ipv4 once the new
// one is bound.
func replaceServiceClaim(name, pool string) func(w *world) {
	return func(w *world) {
		old := w.get(claimObj("web-ipv4", "", nil)).(*ipamv1.IPAddressClaim)
		old.Annotations[ipamv1alpha1.SupersededByAnnotation] = name
		must(w.t, w.direct.Update(w.ctx, old))
		w.create(serviceClaim(name, pool))
		w.settle()
		if w.addressOf(name) == nil {
			w.t.Errorf("the new claim is not bound while the old one exists: the move waits for ever\n%s", w.describe())
			return
		}
		w.deleteClaims("web-ipv4")
		w.settle()
	}
}

// serviceClaim is a claim the Service controller makes for Service web.
func serviceClaim(name, pool string) *ipamv1.IPAddressClaim {
	c := claimObj(name, pool, map[string]string{ipamv1alpha1.SecretAnnotation: "old", ipamv1alpha1.ServiceNameAnnotation: "web"})
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: "uid-web", Controller: ptr.To(true)}}
	c.Finalizers = []string{ipamutil.ReleaseAddressFinalizer} // as the Service controller makes it
	return c
}

// registerShared has someone outside the cluster hold an address of the subnet pool
// under the secret old (as a holder of the same secret could).
func registerShared(w *world, address string) {
	holdOutside(w, "old-secret-value-1", "hnet-private", address)
}

// registerElsewhere has someone outside the cluster hold an address.
func registerElsewhere(w *world, address string) {
	holdOutside(w, "somebody-elses-secret", "inet", address)
}

func holdOutside(w *world, secret ipamapi.Secret, zone, address string) {
	w.t.Helper()
	_, err := w.outsider().Register(w.ctx, outside(secret, zone, address))
	must(w.t, err)
}

// outside is the request of someone outside the cluster for address, under an identity
// of its own ("elsewhere-" and the address).
func outside(secret ipamapi.Secret, zone, address string) ipamapi.Request {
	return ipamapi.Request{Secret: secret, Zone: zone, Family: ipamapi.FamilyIPv4, Address: address,
		Identity: ipamapi.Identity{ServiceName: "elsewhere-" + address, NamespaceID: "x", ClusterID: "y"}}
}

// outsider is an IPAM-API client of someone outside the cluster.
func (w *world) outsider() ipamapi.Client {
	w.t.Helper()
	api, err := ipamapi.NewClient(w.url, ipamapi.Options{})
	must(w.t, err)
	return api
}

func readyOf(c *ipamv1.IPAddressClaim) *metav1.Condition {
	for i := range c.Status.Conditions {
		if c.Status.Conditions[i].Type == ipamv1.IPAddressClaimReadyCondition {
			return &c.Status.Conditions[i]
		}
	}
	return nil
}

// TestLifecycleUnderFaults runs every scenario cleanly, then with a conflict at each of
// its Kubernetes writes, with the process dying just after it lands, and with the
// process dying just before it lands (the write is lost with the process's memory).
// docs/development.md says how many faulted runs that makes; the test keeps it true.
func TestLifecycleUnderFaults(t *testing.T) {
	faulted := 0
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			w := newWorld(t)
			sc.setup(w)
			start := w.writes
			sc.act(w)
			n := w.writes - start
			sc.then(t, w)
			w.check()
			if n == 0 {
				t.Fatal("the scenario wrote nothing")
			}
			for k := 1; k <= n; k++ {
				for _, kind := range []faultKind{conflict, die, dieBefore} {
					faulted++
					t.Run(faultName(kind, k), func(t *testing.T) {
						t.Parallel()
						w := newWorld(t)
						sc.setup(w)
						w.fault = fault{kind: kind, at: w.writes + k}
						start := w.writes
						sc.act(w)
						sc.then(t, w)
						w.check()
						if kind != conflict && w.deaths == 0 {
							t.Errorf("write %d never came on this run (%d writes): the fault did not fire", k, w.writes-start)
						}
					})
				}
			}
		})
	}
	page, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "development.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`\((\d+) faulted runs[,;]`).FindSubmatch(page)
	if m == nil || string(m[1]) != itoa(faulted) {
		t.Errorf("docs/development.md does not say \"(%d faulted runs\" (%d scenarios): correct the page", faulted, len(scenarios))
	}
}

func faultName(kind faultKind, k int) string {
	switch kind {
	case conflict:
		return "conflict at write " + itoa(k)
	case dieBefore:
		return "dies before write " + itoa(k)
	}
	return "dies after write " + itoa(k)
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// The world's oracle is the accounting oracle (test/chaos, whose tests plant every
// class of defect): an address held for a claim's identity beyond what the records
// account for is a leak, and the world says so.
func TestOracleSeesALeak(t *testing.T) {
	w := newWorld(t)
	pools(w)
	w.create(claimObj("r", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
	w.settle()
	if p := w.problems(); len(p) != 0 {
		t.Fatalf("a clean cluster has problems: %v", p)
	}
	a := w.addressOf("r")
	rec, _ := record.OnAddress(a.Labels, a.Annotations)
	api, err := ipamapi.NewClient(w.url, ipamapi.Options{})
	must(t, err)
	extra := rec.Request("old-secret-value-1")
	extra.Address = "83.118.171.250/32"
	_, err = api.Register(w.ctx, extra)
	must(t, err)
	if p := w.problems(); len(p) != 1 || !strings.HasPrefix(p[0], "leaked: 83.118.171.250/32 held by r/uid-apps/cluster-a") {
		t.Fatalf("the oracle does not see the extra address: %v", p)
	}
}

// A new leader whose cache lags (it has not caught up after an API server restart) and
// shows a claim as it was while its first request was out, neither bound nor deleted,
// while the old leader has since bound it, seen it deleted, released its address and
// died before taking the finalizer off, sends nothing: the write of its record
// carries the version it read and is refused, and the claim is reconciled again on
// what the API server has. (Without that, it registered a new address that nothing
// recorded: seen once in the chaos scenario that restarts the API server during
// deletes.)
func TestAStaleReadOfADeletedClaimSendsNothing(t *testing.T) {
	w := newWorld(t)
	pools(w)
	// The first request goes out and the process dies: the claim as a lagging cache
	// keeps it.
	w.fault = fault{kind: die, at: w.writes + 1}
	w.create(claimObj("r", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
	w.run(1)
	if w.deaths != 1 {
		t.Fatalf("the process did not die after the first write (%d writes)", w.writes)
	}
	lagging := w.get(claimObj("r", "", nil)).DeepCopyObject().(client.Object)
	w.fault = fault{}
	w.settle()
	a := w.bound(t, "r")[0]
	rec, err := record.OnAddress(a.Labels, a.Annotations)
	must(t, err)

	// The old leader releases the address of the deleted claim and dies; the address is
	// freed and taken by someone else.
	w.deleteClaims("r")
	api, err := ipamapi.NewClient(w.url, ipamapi.Options{})
	must(t, err)
	_, err = api.Release(w.ctx, rec.Request("old-secret-value-1"))
	must(t, err)
	w.api.Sweep()
	registerElsewhere(w, rec.Address)
	sent := w.api.Stats().Total(sim.RouteRegister)

	// The new leader's cache shows the claim as it was, and no IPAddress.
	w.start()
	w.stale = map[string]client.Object{
		staleKey(&ipamv1.IPAddressClaim{}, client.ObjectKeyFromObject(lagging)): lagging,
		staleKey(&ipamv1.IPAddress{}, client.ObjectKeyFromObject(a)):            nil,
	}
	_, _ = w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(lagging)})
	if again := w.api.Stats().Total(sim.RouteRegister) - sent; again != 0 {
		t.Errorf("a registration was sent on a stale read (%d)", again)
	}
	w.stale = nil
	w.settle()
	w.gone(t, "r")
	w.check()
}

// A deleted claim is released and its IPAddress deleted even when the cache does not
// show the IPAddress (it lags after an API server restart): the IPAddress is deleted by
// name, and none stays behind without its claim.
func TestAnIPAddressTheCacheDoesNotShowIsDeletedWithItsClaim(t *testing.T) {
	w := newWorld(t)
	pools(w)
	w.create(claimObj("r", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
	w.settle()
	a := w.bound(t, "r")[0]
	w.deleteClaims("r")
	w.start()
	w.stale = map[string]client.Object{staleKey(&ipamv1.IPAddress{}, client.ObjectKeyFromObject(a)): nil}
	w.settle()
	w.stale = nil
	w.gone(t, "r")
	if w.addressOf("r") != nil {
		t.Errorf("the IPAddress stays after its claim went")
	}
	w.check()
}

// Two claims share an address by consent; one of them drops its share key: both say
// the address is shared without consent, and neither says it was consented to.
func TestASharedAddressWithoutConsentIsSaidSo(t *testing.T) {
	w := newWorld(t)
	pools(w)
	share := map[string]string{ipamv1alpha1.SecretAnnotation: "old", ipamv1alpha1.AllowLocalSharedIPAnnotation: "k"}
	w.create(claimObj("a", "routed", share))
	w.settle()
	x := w.addressOf("a").Spec.Address
	w.create(claimObj("b", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old", ipamv1alpha1.AllowLocalSharedIPAnnotation: "k",
		ipamv1alpha1.AddressesAnnotation: x}))
	w.settle()
	for _, n := range []string{"a", "b"} {
		if c := sharedOf(w, n); c == nil || c.Reason != ipamv1alpha1.ClaimAddressSharedReason {
			t.Fatalf("claim %s does not say it shares %s by consent: %v", n, x, c)
		}
	}
	b := w.get(claimObj("b", "", nil)).(*ipamv1.IPAddressClaim)
	delete(b.Annotations, ipamv1alpha1.AllowLocalSharedIPAnnotation)
	must(t, w.direct.Update(w.ctx, b))
	w.settle()
	for _, n := range []string{"a", "b"} {
		if c := sharedOf(w, n); c == nil || c.Status != metav1.ConditionTrue || c.Reason != ipamv1alpha1.ClaimAddressSharedWithoutConsentReason {
			t.Errorf("claim %s does not say %s is shared without consent: %v", n, x, c)
		}
	}
}

func sharedOf(w *world, name string) *metav1.Condition {
	c := w.get(claimObj(name, "", nil)).(*ipamv1.IPAddressClaim)
	for i := range c.Status.Conditions {
		if c.Status.Conditions[i].Type == ipamv1alpha1.ClaimAddressSharedCondition {
			return &c.Status.Conditions[i]
		}
	}
	return nil
}

// Two claims that give allow-local-shared-ip as "" do not share an address, and the
// refusal says an empty key is no key (not to give both the same key: they have).
func TestAnEmptyShareKeyIsNoKey(t *testing.T) {
	w := newWorld(t)
	pools(w)
	w.create(claimObj("a", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old", ipamv1alpha1.AllowLocalSharedIPAnnotation: ""}))
	w.settle()
	x := w.addressOf("a").Spec.Address
	w.create(claimObj("b", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old", ipamv1alpha1.AllowLocalSharedIPAnnotation: "",
		ipamv1alpha1.AddressesAnnotation: x}))
	w.run(3)
	b := w.get(claimObj("b", "", nil)).(*ipamv1.IPAddressClaim)
	c := readyOf(b)
	if c == nil || c.Reason != ipamv1alpha1.ClaimReadyAddressInUseReason || !strings.Contains(c.Message, "an empty share key is no share key") {
		t.Errorf("the claim with an empty share key is not told that it is none: %v", b.Status.Conditions)
	}
	if w.addressOf("b") != nil {
		t.Errorf("%s was bound to two claims without a share key", x)
	}
}

// A claim that asks for an address, whose request a process recorded and then died
// before sending (or whose answer it never saw), is waited out by the next process
// before it is sent again, though a request that names its address gets the same answer
// however often it goes: sent at once, its answer would bind the claim under a new
// attempt time, and nothing would show the earlier request any more; the claim's
// release, once answered, would not wait for it, and carried out after the release, it
// would hold the address again for good. The wait writes nothing and sends nothing,
// says when the request goes, and is not taken for an IPAM-API that cannot be reached.
func TestARecordedRequestForAnAddressIsWaitedOutAfterARestart(t *testing.T) {
	w := newWorld(t)
	w.cfg.QuarantineTime = 2 * time.Second // long enough to look at the wait
	w.start()
	pools(w)
	w.create(claimObj("r", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old", ipamv1alpha1.AddressesAnnotation: "83.118.168.20"}))
	attempted := func() bool {
		rec, _ := record.OnClaim(w.get(claimObj("r", "", nil)).GetAnnotations())
		return rec != nil && !rec.Attempt.IsZero()
	}
	for i := 0; i < 5 && !attempted(); i++ {
		w.fault = fault{kind: die, at: w.writes + 1} // dies after each write
		w.run(1)
	}
	w.fault = fault{}
	if !attempted() || w.api.Stats().Total(sim.RouteRegister) != 0 {
		t.Fatalf("no process died between recording a request and sending it (%d sent)\n%s", w.api.Stats().Total(sim.RouteRegister), w.describe())
	}
	w.start()
	writes := w.writes
	w.run(2)
	if sent := w.api.Stats().Total(sim.RouteRegister); sent != 0 || w.writes != writes+1 {
		t.Errorf("while the recorded request may still be carried out: %d registrations and %d writes, want none and the "+
			"condition's one", sent, w.writes-writes)
	}
	if c := readyOf(w.get(claimObj("r", "", nil)).(*ipamv1.IPAddressClaim)); c == nil ||
		!strings.Contains(c.Message, "an earlier registration of 83.118.168.20/32 may still be in flight in the IPAM-API; the next is sent after") {
		t.Errorf("the claim's Ready condition is %+v, want the wait and when it ends", c)
	}
	w.settle()
	w.bound(t, "r")
	if sent := w.api.Stats().Total(sim.RouteRegister); sent != 1 {
		t.Errorf("%d registrations, want 1", sent)
	}
	for _, e := range w.drainEvents() {
		if strings.Contains(e, ipamv1alpha1.ClaimReadyIPAMAPIUnreachableReason) {
			t.Errorf("event %q: the wait was taken for an IPAM-API that cannot be reached", e)
		}
	}
	w.check()
}

// A bound claim's re-registration (its retention changed) gets no answer, and the claim
// is deleted at once: its release waits until that request can no longer be carried
// out. Sent at once, the release could be overtaken by the late registration, which
// would then hold the address for good with no claim left to release it.
func TestAReleaseWaitsOutARegistrationWithoutAnAnswer(t *testing.T) {
	w := newWorld(t)
	w.cfg.QuarantineTime = 3 * time.Second
	w.start()
	pools(w)
	w.create(claimObj("c", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
	w.settle()
	w.bound(t, "c")
	c := w.get(claimObj("c", "", nil)).(*ipamv1.IPAddressClaim)
	c.Annotations[ipamv1alpha1.RetentionPeriodDaysAnnotation] = "2"
	must(t, w.direct.Update(w.ctx, c))
	must(t, w.api.SetFaults(sim.Faults{DropAfterNext: 1, Routes: []sim.Route{sim.RouteRegister}}))
	key := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(c)}
	_, _ = w.claims.Reconcile(w.ctx, key)
	if w.api.Stats().DroppedAfter != 1 {
		t.Fatalf("the re-registration's answer was not lost\n%s", w.describe())
	}
	w.deleteClaims("c")
	released := w.api.Stats().Total(sim.RouteRelease)
	res, _ := w.claims.Reconcile(w.ctx, key)
	if n := w.api.Stats().Total(sim.RouteRelease) - released; n != 0 {
		t.Errorf("released while the re-registration may still be carried out (%d releases)", n)
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > w.cfg.Quarantine() {
		t.Errorf("the release comes back after %v, want when the wait ends (at most %v)", res.RequeueAfter, w.cfg.Quarantine())
	}
	w.settle()
	w.gone(t, "c")
	w.check()
}
