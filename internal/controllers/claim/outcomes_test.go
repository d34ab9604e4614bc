package claim_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api-ipam-provider-in-cluster/pkg/ipamutil"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/controllers/claim"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// Every IPAM-API answer and every bad input ends as one Ready reason and one event that
// name the cause; answers only a user can fix are sent once, transient ones again.
func TestOutcomes(t *testing.T) {
	type tc struct {
		name   string
		pool   ipamv1alpha1.VitistackIPPoolSpec
		ready  bool // the pool said Ready before (a "no prefixes" is then transient)
		claim  map[string]string
		owner  string // the claim is controlled by this Service
		fault  func(*sim.Server)
		secret *corev1.Secret // created first
		reason string
		event  string
		text   string
		// retried: a transient failure, sent again on the next reconciles; all others
		// are not sent again until something changes.
		retried bool
	}
	inet := ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4}
	for _, c := range []tc{
		{name: "NetBox down", pool: inet, fault: func(s *sim.Server) { s.SetNetBoxDown(true, "") },
			reason: "IPAMAPIBackendFailing", text: "failed to fetch zones", retried: true},
		{name: "MongoDB down", pool: inet, fault: func(s *sim.Server) { must(t, s.SetMongoDown(true, 0)) },
			reason: "IPAMAPIBackendFailing", text: "failed to query address documents", retried: true},
		{name: "no prefixes right after a restart", pool: inet, ready: true, fault: func(s *sim.Server) { s.SetPrefixesLoading(true) },
			reason: "IPAMAPIBackendFailing", text: "although the pool worked before", retried: true},
		{name: "no prefixes for a pool that never worked", pool: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv6},
			reason: "PoolNotReady", text: "fix the pool's spec.zone or spec.ipFamily"},
		{name: "unknown zone", pool: ipamv1alpha1.VitistackIPPoolSpec{Zone: "nowhere", IPFamily: ipamv1alpha1.IPv4},
			reason: "PoolNotReady", text: "invalid zone 'nowhere'"},
		{name: "a zone that worked, missing from NetBox's zone list", pool: inet, ready: true, fault: func(s *sim.Server) {
			must(t, s.SetErrorRate(1, 400, `{"message":"invalid zone 'inet', must be one of: 'inet', 'hnet-private', 'hnet-public'"}`))
		}, reason: "IPAMAPIBackendFailing", text: "did not know zone inet although the pool worked before", retried: true},
		{name: "zone exhausted", pool: inet, fault: func(s *sim.Server) { s.SetExhausted("inet", "ipv4", true) },
			reason: "PoolExhausted", text: "has no free ipv4 address left", retried: true},
		{name: "unreachable", pool: inet, fault: func(s *sim.Server) { must(t, s.SetErrorRate(1, 503, `{"message":"upstream"}`)) },
			reason: "IPAMAPIUnreachable", event: "IPAMAPIUnreachable", text: "could not be reached", retried: true},
		{name: "not the IPAM-API", pool: inet, fault: func(s *sim.Server) {
			must(t, s.SetFaults(sim.Faults{ErrorRate: 1, ErrorStatus: 200, ErrorBody: "<html>hi</html>", ErrorContentType: "text/html"}))
		}, reason: "PoolNotReady", text: "is not answering as the IPAM-API", retried: true},
		{name: "address held under another secret", pool: inet, claim: map[string]string{ipamv1alpha1.AddressesAnnotation: "83.118.168.9"},
			fault: func(*sim.Server) {}, reason: "AddressTaken", event: "AddressTaken", text: "held under another secret"},
		{name: "address outside the zone", pool: inet, claim: map[string]string{ipamv1alpha1.AddressesAnnotation: "192.0.2.5"},
			reason: "AddressNotInZone", event: "AddressNotInZone", text: "does not belong to zone inet"},
		{name: "missing Secret", pool: inet, claim: map[string]string{ipamv1alpha1.SecretAnnotation: "nope"},
			reason: "SecretNotFound", text: "apps/nope with key secret not found: create it"},
		{name: "Secret without the key", pool: inet, claim: map[string]string{ipamv1alpha1.SecretAnnotation: "nokey"},
			secret: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "nokey"}, Data: map[string][]byte{"password": []byte("0123456789")}},
			reason: "SecretNotFound", text: `Secret apps/nokey has no key "secret": add the key "secret"`},
		{name: "Secret value too short", pool: inet, claim: map[string]string{ipamv1alpha1.SecretAnnotation: "short"},
			secret: secretObj("short", "abcdef"), reason: "SecretInvalid", text: "must be 8 to 64 characters long for the IPAM-API (it has 6)"},
		{name: "the default keyword in capitals", pool: inet, claim: map[string]string{ipamv1alpha1.SecretAnnotation: "Default"},
			reason: "InvalidAnnotation", event: "InvalidAnnotation",
			text: `"Default" is not a valid Secret name (lower-case letters, digits, '-' and '.'); the keyword for the provider's default secret is "default", in lower case`},
		{name: "bad retention", pool: inet, claim: map[string]string{ipamv1alpha1.RetentionPeriodDaysAnnotation: "31"},
			reason: "InvalidAnnotation", event: "InvalidAnnotation", text: "retention-period-days"},
		{name: "identity override without the pool's leave", pool: inet, claim: map[string]string{ipamv1alpha1.ClusterIDAnnotation: "theirs"},
			reason: "IdentityOverrideNotAllowed", event: "IdentityOverrideNotAllowed", text: "spec.allowIdentityOverrides"},
		{name: "a Service's claim carries another name", pool: inet, owner: "web", claim: map[string]string{ipamv1alpha1.ServiceNameAnnotation: "db"},
			reason: "IdentityOverrideNotAllowed", event: "IdentityOverrideNotAllowed", text: "service-name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			if c.name == "address held under another secret" {
				registerElsewhere(w, "83.118.168.9/32")
			}
			pool := &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "pool"}, Spec: c.pool}
			if c.ready {
				pool.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.Now()}}
			}
			w.create(pool)
			if c.secret != nil {
				w.create(c.secret)
			}
			if c.fault != nil {
				c.fault(w.api)
			}
			cl := claimObj("c", "pool", c.claim)
			if c.owner != "" {
				cl.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: c.owner, UID: "svc", Controller: ptrTrue()}}
			}
			w.create(cl)
			w.run(6)
			got := w.get(claimObj("c", "", nil)).(*ipamv1.IPAddressClaim)
			cond := readyOf(got)
			if cond == nil || cond.Reason != c.reason || !strings.Contains(cond.Message, c.text) {
				t.Fatalf("Ready = %+v, want reason %s with %q", cond, c.reason, c.text)
			}
			want := c.event
			if want == "" {
				want = c.reason
			}
			events := w.drainEvents()
			n := 0
			for _, e := range events {
				if strings.HasPrefix(e, "Warning "+want+" ") {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%d Warning %s events, want exactly 1: %q", n, want, events)
			}
			sent := w.api.Stats().Total(sim.RouteRegister)
			w.run(3)
			again := w.api.Stats().Total(sim.RouteRegister) - sent
			switch {
			case c.retried && again == 0:
				t.Errorf("a transient failure was not retried")
			case !c.retried && again != 0:
				t.Errorf("refused for good, but sent %d more times", again)
			}
			w.check()
			// Whatever failed, the claim can be deleted, and nothing is left held.
			w.api.ClearFaults()
			w.deleteClaims("c")
			w.settle()
			w.gone(t, "c")
		})
	}
}

func ptrTrue() *bool { b := true; return &b }

// A claim refused for a reason only a user can fix is sent again once it is fixed: the
// missing Secret created, or the refused pool fixed.
func TestRefusedClaimsGoOnOnceFixed(t *testing.T) {
	t.Run("the Secret is created", func(t *testing.T) {
		w := newWorld(t)
		pools(w)
		w.create(claimObj("c", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "later"}))
		w.run(4)
		if cond := readyOf(w.get(claimObj("c", "", nil)).(*ipamv1.IPAddressClaim)); cond == nil || !strings.Contains(cond.Message, "not found") {
			t.Fatalf("Ready = %+v, want the missing Secret named", cond)
		}
		// Secrets are not watched: the refused claim comes back to look again after the
		// Secret recheck interval (a minute), a wait, not a reconcile error.
		wait, err := waitOf(w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: "c"}}))
		if err != nil || wait != time.Minute {
			t.Fatalf("the refused claim's reconcile waits %v, %v; want it back in a minute, a wait", wait, err)
		}
		w.create(secretObj("later", "later-secret-value"))
		w.settle()
		if w.addressOf("c") == nil {
			t.Fatalf("the claim did not bind after its Secret was created:\n%s", w.describe())
		}
		w.check()
	})
	t.Run("another address is asked for while the claim is sent", func(t *testing.T) {
		w := newWorld(t)
		pools(w)
		registerElsewhere(w, "83.118.168.9/32")
		w.create(claimObj("c", "routed", map[string]string{ipamv1alpha1.AddressesAnnotation: "83.118.168.9"}))
		// The user asks for another address just before the provider's first write to
		// the claim (its pending record for .9) lands: the API server's answer carries
		// the change, while the request sent is still the one for .9, which is refused.
		w.beforeWrite = func(obj client.Object) {
			if _, ok := obj.(*ipamv1.IPAddressClaim); !ok || obj.GetName() != "c" {
				return
			}
			w.beforeWrite = nil
			c := w.get(claimObj("c", "", nil)).(*ipamv1.IPAddressClaim)
			patch := client.MergeFrom(c.DeepCopy())
			c.Annotations[ipamv1alpha1.AddressesAnnotation] = "83.118.168.10"
			must(t, w.direct.Patch(w.ctx, c, patch))
		}
		w.settle()
		if addr := w.addressOf("c"); addr == nil || addr.Spec.Address != "83.118.168.10" {
			t.Fatalf("the claim is not bound to the address asked for last (83.118.168.10):\n%s", w.describe())
		}
		if holders := w.api.Holders("83.118.168.9/32"); len(holders) != 1 {
			t.Errorf("83.118.168.9 has %d holders, want its owner alone", len(holders))
		}
		w.check()
	})
	t.Run("the pool's zone is fixed", func(t *testing.T) {
		w := newWorld(t)
		pool := &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "pool"},
			Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "nowhere", IPFamily: ipamv1alpha1.IPv4}}
		w.create(pool)
		w.create(claimObj("c", "pool", nil))
		w.run(4)
		sent := w.api.Stats().Total(sim.RouteRegister)
		w.run(3)
		if w.api.Stats().Total(sim.RouteRegister) != sent {
			t.Fatalf("the refused claim was sent again before anything changed")
		}
		// The refusal's digest is keyed by the process: a restarted manager, which cannot
		// tell whether the Secret's value changed meanwhile, sends it once more, then not
		// again.
		w.start()
		w.run(3)
		if n := w.api.Stats().Total(sim.RouteRegister) - sent; n != 1 {
			t.Fatalf("after a restart the refused claim was sent %d more times, want once", n)
		}
		p := w.get(pool).(*ipamv1alpha1.VitistackIPPool)
		p.Spec.Zone = "inet"
		p.Generation++
		must(t, w.direct.Update(w.ctx, p))
		w.settle()
		if w.addressOf("c") == nil {
			t.Fatalf("the claim did not bind after its pool was fixed:\n%s", w.describe())
		}
		w.check()
	})
}

// A claim whose Secret cannot be protected yet (a policy refuses its finalizer) has its
// pending record written, and sends nothing. The first request sent later is then still
// the first under that record, and a claim deleted before it has nothing to release.
func TestSecretNotProtectedYet(t *testing.T) {
	reconcile := func(w *world, name string) {
		_, _ = w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(claimObj(name, "", nil))})
	}
	recordOf := func(w *world, name string) *record.Registration {
		reg, err := record.OnClaim(w.get(claimObj(name, "", nil)).GetAnnotations())
		must(w.t, err)
		return reg
	}
	t.Run("deleted before anything was sent", func(t *testing.T) {
		w := newWorld(t)
		pools(w)
		denied := true
		w.claims.Secrets.Writer = refuseSecretPatches(w.c, &denied, func(*corev1.Secret) string { return "a policy forbids finalizers on Secrets" })
		w.create(claimObj("c", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
		w.admit("c")
		reconcile(w, "c")
		if reg := recordOf(w, "c"); reg == nil || !reg.Attempt.IsZero() {
			t.Fatalf("record %+v, want a pending record without an attempt time (nothing sent)", reg)
		}
		w.deleteClaims("c")
		reconcile(w, "c")
		w.gone(t, "c")
		if n := w.api.Stats().Total(sim.RouteRegister) + w.api.Stats().Total(sim.RouteRelease); n != 0 {
			t.Errorf("%d requests sent for a claim deleted before anything was sent", n)
		}
	})
	t.Run("the zone has no prefixes of the family", func(t *testing.T) {
		w := newWorld(t)
		w.create(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "v6"},
			Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv6}})
		w.create(claimObj("c", "v6", nil))
		w.settle() // its record first, then the Secret's protection, then the record sent
		if reg := recordOf(w, "c"); reg != nil {
			t.Errorf("the refused claim keeps the record %+v: its only request proved nothing is held", reg)
		}
		w.deleteClaims("c")
		w.settle()
		w.gone(t, "c")
	})
	t.Run("a subnet candidate another holder of the Secret has", func(t *testing.T) {
		w := newWorld(t)
		pools(w)
		// The first usable address of the subnet, held outside the cluster under the
		// same Secret value.
		holdOutside(w, "old-secret-value-1", "hnet-private", "10.50.0.2/32")
		// The second, under another value: the IPAM-API refuses it to the claim.
		holdOutside(w, "another-value-3", "hnet-private", "10.50.0.3/32")
		w.create(claimObj("c", "subnet", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
		// One registration per reconcile: .2 is given back, .3 skipped, .4 bound, each
		// candidate recorded before it is sent.
		for range 20 {
			before := w.api.Stats().Total(sim.RouteRegister)
			w.pass()
			if n := w.api.Stats().Total(sim.RouteRegister) - before; n > 1 {
				t.Fatalf("one reconcile sent %d registrations, want one at most:\n%s", n, w.describe())
			}
		}
		addr := w.addressOf("c")
		if addr == nil || addr.Spec.Address != "10.50.0.4" {
			t.Fatalf("the claim is bound to %v, want 10.50.0.4, the first address not held elsewhere:\n%s", addr, w.describe())
		}
		if n := w.api.Stats().Total(sim.RouteRegister); n != 2+3 {
			t.Errorf("%d registrations, want 2 made by the test and one per candidate (3)", n)
		}
		for _, a := range []string{"10.50.0.2/32", "10.50.0.3/32"} {
			for _, h := range w.api.Holders(a) {
				if h.ServiceName != "elsewhere-"+a && h.State == sim.HoldLive {
					t.Errorf("%s is held by %+v too, want its owner alone", a, h)
				}
			}
		}
		w.check()
	})
}

// A claim skips candidates held elsewhere one registration a reconcile, each address of
// the zone once per --subnet-recheck-interval: past a block held elsewhere it binds the
// first free address, and a subnet held elsewhere throughout ends in PoolExhausted, with
// one request per address and none after, not in a loop.
func TestASubnetHeldElsewhereIsTriedOnceAnAddress(t *testing.T) {
	w := newWorld(t)
	pools(w)
	holdElsewhere := func(addr string) { holdOutside(w, "another-value-3", "hnet-private", addr) }
	registrations := func() int { return w.api.Stats().Total(sim.RouteRegister) }
	w.create(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "big"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4, Subnet: "10.51.0.0/26", Gateway: "10.51.0.1"}})
	for i := 2; i <= 21; i++ { // 20 addresses
		holdElsewhere(fmt.Sprintf("10.51.0.%d/32", i))
	}
	before := registrations()
	w.create(claimObj("c", "big", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
	w.settle()
	if addr := w.addressOf("c"); addr == nil || addr.Spec.Address != "10.51.0.22" {
		t.Fatalf("the claim is bound to %v, want 10.51.0.22, the first address not held elsewhere:\n%s", addr, w.describe())
	}
	if n := registrations() - before; n != 21 {
		t.Errorf("%d registrations, want 21: each address held elsewhere once, and the one bound", n)
	}

	// The whole subnet held elsewhere (the gateway .49 aside, .50 to .62 usable).
	w.create(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "held"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4, Subnet: "10.52.0.48/28", Gateway: "10.52.0.49"}})
	for i := 50; i <= 62; i++ {
		holdElsewhere(fmt.Sprintf("10.52.0.%d/32", i))
	}
	before = registrations()
	w.create(claimObj("d", "held", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
	w.settle()
	if c := readyOf(w.get(claimObj("d", "", nil)).(*ipamv1.IPAddressClaim)); c == nil || c.Reason != ipamv1.IPAddressClaimReadyPoolExhaustedReason {
		t.Fatalf("the claim's Ready condition is %+v, want PoolExhausted:\n%s", c, w.describe())
	}
	if n := registrations() - before; n != 13 {
		t.Errorf("%d registrations for a subnet of 13 addresses held elsewhere, want one each", n)
	}
	before = registrations()
	w.run(5)
	if n := registrations() - before; n != 0 {
		t.Errorf("%d more registrations within --subnet-recheck-interval, want none", n)
	}
	w.check()
}

// A claim bound in subnet mode whose IPAddress is lost sends its address again. Should
// its hold on that address have lapsed meanwhile (an external cleanup, an IPAM-API
// restored from a backup) and another secret hold the address now, the claim does not
// move on to another candidate: being bound, it would take an "updated" answer (the
// next candidate held under the same secret by someone outside the cluster) as its
// own, and two holders would have one address. It says its address is taken, and binds
// nothing.
func TestABoundSubnetClaimThatLostItsAddressTakesNoOther(t *testing.T) {
	w := newWorld(t)
	pools(w)
	w.create(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "small"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4, Subnet: "10.53.0.0/29", Gateway: "10.53.0.1"}})
	w.create(claimObj("c", "small", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
	w.settle()
	addr := w.addressOf("c")
	if addr == nil || addr.Spec.Address != "10.53.0.2" {
		t.Fatalf("the claim is bound to %v, want 10.53.0.2:\n%s", addr, w.describe())
	}
	rec, err := record.OnAddress(addr.Labels, addr.Annotations)
	must(t, err)
	_, err = w.outsider().Release(w.ctx, rec.Request("old-secret-value-1"))
	must(t, err)
	w.api.Sweep()
	holdOutside(w, "another-value-3", "hnet-private", "10.53.0.2/32")
	holdOutside(w, "old-secret-value-1", "hnet-private", "10.53.0.3/32")
	w.loseAddress(addr.Name)

	w.settle()
	if a := w.addressOf("c"); a != nil {
		t.Fatalf("the claim that lost 10.53.0.2 is bound to %s, which someone outside the cluster holds:\n%s", a.Spec.Address, w.describe())
	}
	for _, holder := range w.live()["10.53.0.3/32"] {
		if holder == rec.Identity.ServiceName {
			t.Fatalf("the claim holds 10.53.0.3 in the IPAM-API beside someone outside the cluster:\n%s", w.describe())
		}
	}
	c := readyOf(w.get(claimObj("c", "", nil)).(*ipamv1.IPAddressClaim))
	if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "no longer holds 10.53.0.2/32 for it: it is held under another secret now") {
		t.Fatalf("the claim's Ready condition is %+v, want False, saying 10.53.0.2 is held under another secret", c)
	}
	// Refused: nothing more is sent until something changes, and still nothing is bound.
	before := w.api.Stats().Total(sim.RouteRegister)
	w.run(5)
	if n := w.api.Stats().Total(sim.RouteRegister) - before; n != 0 || w.addressOf("c") != nil {
		t.Fatalf("after the refusal, %d more registrations, and the claim is bound to %v; want none and none", n, w.addressOf("c"))
	}
	w.check()
}

// A candidate a claim skipped (held elsewhere) is not the claim's any more: once the
// holder lets it go, a claim that asks for it by name gets it, though the claim
// that skipped it is still unbound (the whole subnet was held elsewhere: it backs off,
// exhausted).
func TestASkippedCandidateIsNotHeldByTheClaimThatSkippedIt(t *testing.T) {
	w := newWorld(t)
	pools(w)
	w.create(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "full"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4, Subnet: "10.54.0.0/29", Gateway: "10.54.0.1"}})
	for i := 2; i <= 6; i++ {
		holdOutside(w, "another-value-3", "hnet-private", fmt.Sprintf("10.54.0.%d/32", i))
	}
	w.create(claimObj("x", "full", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
	w.settle()
	if c := readyOf(w.get(claimObj("x", "", nil)).(*ipamv1.IPAddressClaim)); c == nil || c.Reason != ipamv1.IPAddressClaimReadyPoolExhaustedReason {
		t.Fatalf("the claim's Ready condition is %+v, want PoolExhausted:\n%s", c, w.describe())
	}
	_, err := w.outsider().Release(w.ctx, outside("another-value-3", "hnet-private", "10.54.0.4/32"))
	must(t, err)
	w.api.Sweep()
	w.create(claimObj("by-name", "full", map[string]string{ipamv1alpha1.SecretAnnotation: "old", ipamv1alpha1.AddressesAnnotation: "10.54.0.4"}))
	w.settle()
	if a := w.addressOf("by-name"); a == nil || a.Spec.Address != "10.54.0.4" {
		t.Fatalf("the claim asking for 10.54.0.4, freed elsewhere and only skipped by x, is bound to %v:\n%s", a, w.describe())
	}
	w.check()
}

// A bound subnet claim whose IPAddress is lost keeps its registration through a refusal
// the IPAM-API gives meanwhile (here: the zone refused as invalid), and once something
// changes it sends its address again and is bound to it. A refusal proves that nothing
// is held only for a request never answered; this claim's was (it was bound), and a
// subnet claim that forgot its address could never learn it again.
func TestALostIPAddressOutlivesARefusal(t *testing.T) {
	w, addr := boundUnder(t, "c", "subnet", "old")
	if addr.Spec.Address != "10.50.0.2" {
		t.Fatalf("the claim is bound to %v, want 10.50.0.2:\n%s", addr, w.describe())
	}
	w.api.SetFaultRoutes(sim.RouteRegister)
	must(t, w.api.FailNext(1, http.StatusBadRequest, `{"message":"invalid zone 'hnet-private', must be one of: 'inet'"}`))
	w.loseAddress(addr.Name)
	w.settle()
	c := w.get(claimObj("c", "", nil)).(*ipamv1.IPAddressClaim)
	if r := readyOf(c); r == nil || r.Reason != ipamv1.IPAddressClaimReadyPoolNotReadyReason {
		t.Fatalf("the claim's Ready condition is %+v, want PoolNotReady (the zone refused):\n%s", r, w.describe())
	}
	c.Annotations["example.com/looked-at"] = "yes" // any change of the claim counts
	must(t, w.direct.Update(w.ctx, c))
	w.settle()
	if a := w.addressOf("c"); a == nil || a.Spec.Address != "10.50.0.2" {
		t.Fatalf("the claim is bound to %v after the refusal, want 10.50.0.2 again:\n%s", a, w.describe())
	}
	w.check()
}

// A bound claim whose IPAddress is lost while a rotation of its address to another
// Secret is under way (the IPAM-API moved it; the IPAddress did not show it yet) gets
// its address back under the Secret that owns it now, and the intent goes.
func TestALostIPAddressAfterARotationComesBackUnderTheNewSecret(t *testing.T) {
	w, addr := boundUnder(t, "r", "routed", "old")
	rec, err := record.OnAddress(addr.Labels, addr.Annotations)
	must(t, err)
	// What a manager that died mid-rotation leaves: the intent on the claim, the address
	// moved in the IPAM-API, the IPAddress as it was; then the IPAddress is lost.
	c := w.get(claimObj("r", "", nil)).(*ipamv1.IPAddressClaim)
	intent := *rec
	intent.RotatingTo = record.ObjectRef{Namespace: "apps", Name: "new", Key: "secret"}
	intent.SetOn(c)
	c.Annotations[ipamv1alpha1.SecretAnnotation] = "new"
	must(t, w.direct.Update(w.ctx, c))
	rotate := rec.Request("old-secret-value-1")
	rotate.NewSecret = "new-secret-value-2"
	_, err = w.outsider().Register(w.ctx, rotate)
	must(t, err)
	w.loseAddress(addr.Name)

	w.settle()
	a := w.addressOf("r")
	if a == nil || a.Spec.Address+"/32" != rec.Address {
		t.Fatalf("the claim is bound to %v after losing its IPAddress mid-rotation, want %s again:\n%s", a, rec.Address, w.describe())
	}
	if got := a.Annotations[ipamv1alpha1.RegisteredSecretRefAnnotation]; got != "apps/new/secret" {
		t.Errorf("the IPAddress records the secret %q, want apps/new/secret (the one that owns the address)", got)
	}
	if cur, _ := record.OnClaim(w.get(claimObj("r", "", nil)).GetAnnotations()); cur != nil && !cur.RotatingTo.IsZero() {
		t.Errorf("the rotation intent stayed on the claim: %+v", cur)
	}
	w.check()
}

// boundUnder is a world with the pools, and a claim of pool under the Secret secret, bound;
// and its IPAddress.
func boundUnder(t *testing.T, claim, pool, secret string) (*world, *ipamv1.IPAddress) {
	t.Helper()
	w := newWorld(t)
	pools(w)
	w.create(claimObj(claim, pool, map[string]string{ipamv1alpha1.SecretAnnotation: secret}))
	w.settle()
	addr := w.addressOf(claim)
	if addr == nil {
		t.Fatalf("claim %s of pool %s is not bound:\n%s", claim, pool, w.describe())
	}
	return w, addr
}

// A claim restored (or moved) without its finalizer, before its pool: its record names a
// registration, so it gets the finalizer back at once, and deleting it before the pool
// comes releases its address.
func TestARecordedClaimWithoutItsFinalizerGetsItBackBeforeItsPool(t *testing.T) {
	w, _ := boundUnder(t, "r", "routed", "old")
	c := w.get(claimObj("r", "", nil)).(*ipamv1.IPAddressClaim)
	c.Finalizers = nil
	must(t, w.direct.Update(w.ctx, c))
	must(t, w.direct.Delete(w.ctx, &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "routed"}}))
	w.run(1)
	if c := w.get(claimObj("r", "", nil)).(*ipamv1.IPAddressClaim); !slices.Contains(c.Finalizers, ipamutil.ReleaseAddressFinalizer) {
		t.Fatalf("a recorded claim whose pool is missing has finalizers %v, want %s back", c.Finalizers, ipamutil.ReleaseAddressFinalizer)
	}
	w.deleteClaims("r")
	w.settle()
	w.gone(t, "r")
	w.check()
}

// A bound claim never takes another address or identity, nor an unreadable setting: an edit
// asking for one is said in a Warning event naming it, and the claim stays bound and Ready,
// with nothing sent.
func TestABoundClaimSaysWhatItIgnores(t *testing.T) {
	for _, c := range []struct {
		name, key, value, event, text string
	}{
		{"another address", ipamv1alpha1.AddressesAnnotation, "83.118.168.77", "AnnotationIgnored", "ignores ipam.vitistack.io/addresses=83.118.168.77"},
		{"another identity", ipamv1alpha1.ServiceNameAnnotation, "other", "AnnotationIgnored", "ignores ipam.vitistack.io/service-name=other"},
		{"an unreadable retention", ipamv1alpha1.RetentionPeriodDaysAnnotation, "ten", "InvalidAnnotation",
			`"ten" is not a whole number of days from 0 to 30; the bound address keeps its registration until the annotation is fixed`},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t)
			w.create(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "routed"},
				Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4, AllowIdentityOverrides: true}})
			w.create(claimObj("c", "routed", nil))
			w.settle()
			bound := w.addressOf("c")
			if bound == nil {
				t.Fatalf("the claim did not bind:\n%s", w.describe())
			}
			w.drainEvents()
			sent := w.api.Stats().Total(sim.RouteRegister)

			cl := w.get(claimObj("c", "", nil)).(*ipamv1.IPAddressClaim)
			patch := client.MergeFrom(cl.DeepCopy())
			if cl.Annotations == nil {
				cl.Annotations = map[string]string{}
			}
			cl.Annotations[c.key] = c.value
			must(t, w.direct.Patch(w.ctx, cl, patch))
			w.settle()

			var warned []string
			for _, e := range w.drainEvents() {
				if strings.HasPrefix(e, "Warning "+c.event+" ") && strings.Contains(e, c.text) {
					warned = append(warned, e)
				}
			}
			if len(warned) == 0 {
				t.Errorf("no Warning %s event saying %q", c.event, c.text)
			}
			got := w.get(claimObj("c", "", nil)).(*ipamv1.IPAddressClaim)
			if cond := readyOf(got); cond == nil || cond.Status != metav1.ConditionTrue {
				t.Errorf("Ready = %+v, want the claim still Ready", cond)
			}
			if a := w.addressOf("c"); a == nil || a.Spec.Address != bound.Spec.Address {
				t.Errorf("the claim is no longer bound to %s", bound.Spec.Address)
			}
			if n := w.api.Stats().Total(sim.RouteRegister) - sent; n != 0 {
				t.Errorf("%d registrations sent for an edit the claim ignores", n)
			}
			w.check()
		})
	}
}

// A claim made again under the name of one released with a retention asks for any address
// and gets the retained one back: a Normal event says which, and why.
func TestAClaimIsToldItGotARetainedAddressBack(t *testing.T) {
	w := newWorld(t)
	pools(w)
	w.create(claimObj("c", "routed", map[string]string{ipamv1alpha1.RetentionPeriodDaysAnnotation: "7"}))
	w.settle()
	first := w.addressOf("c")
	if first == nil {
		t.Fatalf("the claim did not bind:\n%s", w.describe())
	}
	w.deleteClaims("c")
	w.settle()
	w.gone(t, "c")
	w.drainEvents()

	w.create(claimObj("c", "routed", nil))
	w.settle()
	again := w.addressOf("c")
	if again == nil || again.Spec.Address != first.Spec.Address {
		t.Fatalf("the claim made again is not bound to the retained %s:\n%s", first.Spec.Address, w.describe())
	}
	told := false
	for _, e := range w.drainEvents() {
		told = told || strings.HasPrefix(e, "Normal AddressReturned ") && strings.Contains(e, "gave back "+first.Spec.Address)
	}
	if !told {
		t.Errorf("no Normal AddressReturned event naming %s", first.Spec.Address)
	}
	w.check()
}

// A claim whose namespace is being deleted registers nothing (its IPAddress could not be
// created there, and the namespace's deletion takes the claim away): no request, no
// IPAddress, no event, no error; deleted, it goes.
func TestAClaimOfAnEndingNamespaceRegistersNothing(t *testing.T) {
	w := newWorld(t)
	pools(w)
	ns := &corev1.Namespace{}
	must(t, w.direct.Get(w.ctx, client.ObjectKey{Name: "apps"}, ns))
	ns.Finalizers = append(ns.Finalizers, "test.example/hold")
	must(t, w.direct.Update(w.ctx, ns))
	must(t, w.direct.Delete(w.ctx, ns))
	sent := w.api.Stats().Total(sim.RouteRegister)
	w.create(claimObj("late", "routed", nil))
	w.settle()
	if n := w.api.Stats().Total(sim.RouteRegister) - sent; n != 0 {
		t.Errorf("%d registrations sent for a claim of a namespace being deleted", n)
	}
	if a := w.addressOf("late"); a != nil {
		t.Errorf("an IPAddress %s was created in a namespace being deleted", a.Spec.Address)
	}
	if events := w.drainEvents(); len(events) != 0 {
		t.Errorf("events for a claim of a namespace being deleted: %q", events)
	}
	// ipamutil's loop would create the IPAddress after a result without an error: the
	// claim waits (its deletion follows).
	res, err := w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: "late"}})
	if _, wait := claim.WaitOf(err); !wait || !res.IsZero() || !strings.Contains(err.Error(), "namespace apps is being deleted") {
		t.Errorf("the reconcile returned %+v, %v; want a wait saying the namespace is being deleted", res, err)
	}
	w.deleteClaims("late")
	w.settle()
	w.gone(t, "late")
}
