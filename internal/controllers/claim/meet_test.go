package claim_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// Where controllers meet: the defects the seeded simulation (test/simulation) found, each
// replayed here step by step.

// TestAServiceMovedBackKeepsItsAddress: a Service is moved to another pool of its zone and
// family; its new claim takes the registration over but is not bound yet (its request got a
// 503) when the user moves the Service back. The Service controller deletes the new claim;
// its release must not free the address the old claim is still bound to (MetalLB announces
// it).
func TestAServiceMovedBackKeepsItsAddress(t *testing.T) {
	w := newWorld(t)
	servicePools(ipamv1alpha1.IPv4, ipamv1alpha1.IPv4)(w)
	addr := w.bound(t, "web-ipv4")[0]
	if addr == nil {
		return
	}
	old := w.get(claimObj("web-ipv4", "", nil)).(*ipamv1.IPAddressClaim)
	old.Annotations[ipamv1alpha1.SupersededByAnnotation] = "web-moved"
	must(t, w.direct.Update(w.ctx, old))
	must(t, w.api.FailNext(1, http.StatusServiceUnavailable, "upstream connect error"))
	w.create(serviceClaim("web-moved", "svc-b"))
	w.run(1)
	moved := w.get(claimObj("web-moved", "", nil)).(*ipamv1.IPAddressClaim)
	if rec, _ := record.OnClaim(moved.Annotations); rec == nil || rec.Attempt.IsZero() || moved.Status.AddressRef.Name != "" {
		t.Fatalf("the new claim should have sent its request and not be bound: %s", w.describe())
	}
	// Moved back: the old claim fits again and is bound, the new one goes.
	old = w.get(claimObj("web-ipv4", "", nil)).(*ipamv1.IPAddressClaim)
	delete(old.Annotations, ipamv1alpha1.SupersededByAnnotation)
	must(t, w.direct.Update(w.ctx, old))
	w.deleteClaims("web-moved")
	w.settle()
	if c := claimObj("web-moved", "", nil); w.direct.Get(w.ctx, client.ObjectKeyFromObject(c), c) == nil {
		t.Errorf("web-moved stays: finalizers %v, conditions %v", c.Finalizers, c.Status.Conditions)
	}
	if got := w.bound(t, "web-ipv4")[0]; got == nil || got.Spec.Address != addr.Spec.Address {
		t.Fatalf("web-ipv4 is no longer bound to %s: %s", addr.Spec.Address, w.describe())
	}
	if live := w.live(); len(live[addr.Spec.Address+"/32"]) != 1 {
		t.Errorf("the IPAM-API holds %v: %s, which web-ipv4 is bound to, was released", live, addr.Spec.Address)
	}
	w.check()
}

// TestAReleaseThatLearnsItsAddressRecordsItsRequest: a claim deleted before its first
// request was answered sends the registration again to learn the address it may hold. That
// request is recorded before it goes, like every other: should its answer be lost and the
// process die, the next process waits it out from then, not from the first request (which
// let a late registration hold the address after the release, for ever).
func TestAReleaseThatLearnsItsAddressRecordsItsRequest(t *testing.T) {
	w := unansweredClaim(t, sim.DropBefore)
	first, _ := record.OnClaim(w.get(claimObj("c", "", nil)).GetAnnotations())
	if first == nil || first.Attempt.IsZero() {
		t.Fatalf("the claim should have sent its request: %s", w.describe())
	}
	w.deleteClaims("c")
	time.Sleep(2 * w.cfg.Quarantine()) // the first request is certainly over
	must(t, w.api.DropNext(sim.DropAfter, 1))
	w.run(1)
	again, _ := record.OnClaim(w.get(claimObj("c", "", nil)).GetAnnotations())
	if again == nil || !again.Attempt.After(first.Attempt) {
		t.Fatalf("the request that learns the address went out without being recorded: record %+v, first attempt %s", again, first.Attempt)
	}
	w.settle()
	w.gone(t, "c")
	if live := w.live(); len(live) != 0 {
		t.Errorf("the IPAM-API still holds %v", live)
	}
	w.check()
}

// TestARefusalOfARetryKeepsTheRecord: the first registration is carried out, its answer
// lost; the retry is refused in validation (the IPAM-API reads the zones from NetBox on
// every request, before it looks anything up). The refusal proves nothing about the first
// request: the record stays, and the claim's address is released when it goes.
func TestARefusalOfARetryKeepsTheRecord(t *testing.T) {
	w := unansweredClaim(t, sim.DropAfter)
	if len(w.live()) != 1 {
		t.Fatalf("the first registration should be held: %v", w.live())
	}
	time.Sleep(2 * w.cfg.Quarantine())
	must(t, w.api.FailNext(1, http.StatusBadRequest, `{"message":"invalid zone 'inet', must be one of: 'hnet-private', 'hnet-public'"}`))
	w.run(1)
	if rec, _ := record.OnClaim(w.get(claimObj("c", "", nil)).GetAnnotations()); rec == nil {
		t.Fatalf("the refusal of the retry dropped the record of an address the IPAM-API holds: %s", w.describe())
	}
	w.deleteClaims("c")
	w.settle()
	w.gone(t, "c")
	if live := w.live(); len(live) != 0 {
		t.Errorf("the first registration leaked: the IPAM-API holds %v", live)
	}
	w.check()
}

// TestAReleaseRefusedInValidationIsNotAReleaseOfAnUnansweredRecord: a deleted claim whose
// request was never answered learns its address, then sends the release; a release refused
// in validation released nothing and is tried again.
func TestAReleaseRefusedInValidationIsNotAReleaseOfAnUnansweredRecord(t *testing.T) {
	w := unansweredClaim(t, sim.DropAfter)
	w.deleteClaims("c")
	time.Sleep(2 * w.cfg.Quarantine())
	// The learning registration is answered; the release after it is refused once.
	w.api.SetFaultRoutes(sim.RouteRelease)
	must(t, w.api.FailNext(1, http.StatusBadRequest, `{"message":"invalid zone 'inet', must be one of: 'hnet-private', 'hnet-public'"}`))
	w.run(1)
	w.api.SetFaultRoutes()
	w.settle()
	w.gone(t, "c")
	if live := w.live(); len(live) != 0 {
		t.Errorf("the address leaked: the IPAM-API holds %v", live)
	}
	w.check()
}

// TestAServiceMovedTwiceBindsItsNewestClaim: a Service is moved to another pool of its zone
// and family, and again before the first move is done (its new claim's request got a 503).
// The newest claim takes the registration over from the first claim; the claim in between
// holds no reservation that keeps it from doing so, and goes without releasing anything.
func TestAServiceMovedTwiceBindsItsNewestClaim(t *testing.T) {
	w := newWorld(t)
	servicePools(ipamv1alpha1.IPv4, ipamv1alpha1.IPv4)(w)
	w.create(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "svc-c"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4, AllowIdentityOverrides: true}})
	addr := w.bound(t, "web-ipv4")[0]
	if addr == nil {
		return
	}
	supersede := func(name, by string) {
		c := w.get(claimObj(name, "", nil)).(*ipamv1.IPAddressClaim)
		c.Annotations[ipamv1alpha1.SupersededByAnnotation] = by
		must(t, w.direct.Update(w.ctx, c))
	}
	supersede("web-ipv4", "web-m1")
	must(t, w.api.FailNext(1, http.StatusServiceUnavailable, "upstream connect error"))
	w.create(serviceClaim("web-m1", "svc-b"))
	w.run(1)
	// Moved again: the Service controller makes the newest claim and marks both others.
	supersede("web-ipv4", "web-m2")
	supersede("web-m1", "web-m2")
	w.create(serviceClaim("web-m2", "svc-c"))
	w.settle()
	got := w.addressOf("web-m2")
	if got == nil || got.Spec.Address != addr.Spec.Address {
		t.Fatalf("the newest claim is not bound to %s (%v): the moves wait for each other\n%s", addr.Spec.Address, got, w.describe())
	}
	w.deleteClaims("web-m1", "web-ipv4")
	w.settle()
	if live := w.live(); len(live) != 1 || len(live[addr.Spec.Address+"/32"]) != 1 {
		t.Errorf("the IPAM-API holds %v, want %s alone", live, addr.Spec.Address)
	}
	w.check()
}

// TestARestartDuringAMoveWaitsOutTheOldClaimsRequest: a Service's claim sends its first
// registration and gets no answer; the process restarts, and the Service is moved: its new
// claim, of the same identity, must not send while the old claim's request may still be
// carried out (the IPAM-API would allocate a second address for the identity). The guard
// across processes reads every record of the identity, not only the sending claim's.
func TestARestartDuringAMoveWaitsOutTheOldClaimsRequest(t *testing.T) {
	w := movingWorld(t)
	must(t, w.api.DropNext(sim.DropBefore, 1))
	w.create(serviceClaim("web-ipv4", "svc-a"))
	w.run(2)
	if rec, _ := record.OnClaim(w.get(claimObj("web-ipv4", "", nil)).GetAnnotations()); rec == nil || rec.Attempt.IsZero() {
		t.Fatalf("the old claim should have sent its request: %s", w.describe())
	}
	w.start() // a restart: nothing in memory says the request got no answer
	old := w.get(claimObj("web-ipv4", "", nil)).(*ipamv1.IPAddressClaim)
	old.Annotations[ipamv1alpha1.SupersededByAnnotation] = "web-a"
	must(t, w.direct.Update(w.ctx, old))
	sent := w.api.Stats().Total(sim.RouteRegister)
	w.create(serviceClaim("web-a", "svc-b")) // reconciled before the old claim, which would mark the identity busy
	w.run(1)
	if n := w.api.Stats().Total(sim.RouteRegister) - sent; n != 0 {
		t.Errorf("%d registrations of the identity went out while the old claim's request may still be carried out", n)
	}
	w.settle()
	if w.addressOf("web-a") == nil && w.addressOf("web-ipv4") == nil {
		t.Fatalf("neither claim is bound after the wait: %s", w.describe())
	}
	w.check()
}

// TestARotationRolledBackByDeletingItsTargetLetsBothGo: a bound claim is pointed at a new
// Secret while the IPAM-API is down, so the rotation stays an intent; the user rolls back by
// deleting the new Secret and the claim. The release asks the IPAM-API which Secret owns the
// address, the one being deleted included, releases it under the old one, and both the
// claim and the new Secret go.
func TestARotationRolledBackByDeletingItsTargetLetsBothGo(t *testing.T) {
	w := rotationLeftAnIntent(t)
	must(t, w.direct.Delete(w.ctx, secretObj("new", "")))
	w.deleteClaims("r")
	w.api.SetDown(false)
	w.settle()
	w.gone(t, "r")
	if err := w.direct.Get(w.ctx, client.ObjectKey{Namespace: "apps", Name: "new"}, secretObj("", "")); err == nil {
		t.Errorf("the new Secret stays, being deleted")
	}
	w.check()
}

// TestARotationToASecretThatIsGoneLetsTheClaimGo: as above, but the new Secret is gone
// before the protector ever protected it (its patch lost to a conflict): the rotation
// cannot have gone out, so the release goes under the old Secret, and the claim goes.
func TestARotationToASecretThatIsGoneLetsTheClaimGo(t *testing.T) {
	w := rotationLeftAnIntent(t)
	s := w.get(secretObj("new", "")).(*corev1.Secret)
	s.Finalizers = nil
	must(t, w.direct.Update(w.ctx, s))
	must(t, w.direct.Delete(w.ctx, secretObj("new", "")))
	w.deleteClaims("r")
	w.api.SetDown(false)
	w.settle()
	w.gone(t, "r")
	w.check()
}

// rotationLeftAnIntent binds claim r under Secret old and points it at Secret new while
// the IPAM-API is down: the rotation stays an intent on the claim's record. The IPAM-API
// is still down.
func rotationLeftAnIntent(t *testing.T) *world {
	t.Helper()
	w, _ := boundUnder(t, "r", "routed", "old")
	c := w.get(claimObj("r", "", nil)).(*ipamv1.IPAddressClaim)
	c.Annotations[ipamv1alpha1.SecretAnnotation] = "new"
	must(t, w.direct.Update(w.ctx, c))
	w.api.SetDown(true)
	w.run(3)
	if rec, _ := record.OnClaim(w.get(claimObj("r", "", nil)).GetAnnotations()); rec == nil || rec.RotatingTo.Name != "new" {
		t.Fatalf("the rotation should be recorded as an intent: %s", w.describe())
	}
	return w
}

// TestANewManagerSettlesNoRotationWhileAnEarlierReleaseMayLand: a claim whose rotation is
// still an intent is deleted, and the manager restarts. Settling the rotation asks the
// IPAM-API who owns the address with a registration; the manager before may have sent the
// claim's release, its answer lost, and that registration, carried out before the late
// release, would be freed by it, or, after it, hold the address again. So the new manager
// sends nothing for the claim, not even the settling, until such a release can no longer
// be carried out; then it settles and releases, and nothing is left held.
func TestANewManagerSettlesNoRotationWhileAnEarlierReleaseMayLand(t *testing.T) {
	w, _ := boundUnder(t, "r", "routed", "old")
	w.cfg.QuarantineTime = 2 * time.Second // long enough to look at the wait
	w.start()
	// The Secret new protected (another claim is bound under it), and r's rotation to it
	// an intent, as a manager that wrote it and died leaves it.
	w.create(claimObj("x", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "new"}))
	w.settle()
	c := w.get(claimObj("r", "", nil)).(*ipamv1.IPAddressClaim)
	rec, err := record.OnClaim(c.Annotations)
	must(t, err)
	rec.RotatingTo = record.ObjectRef{Namespace: "apps", Name: "new", Key: record.DefaultSecretKey}
	rec.SetOn(c)
	must(t, w.direct.Update(w.ctx, c))
	w.deleteClaims("r", "x")
	w.start() // a new manager, which did not see the claims live
	sent := w.api.Stats().Total(sim.RouteRegister) + w.api.Stats().Total(sim.RouteRelease)
	w.run(2)
	if n := w.api.Stats().Total(sim.RouteRegister) + w.api.Stats().Total(sim.RouteRelease) - sent; n != 0 {
		t.Errorf("%d requests went out for the deleted claims while a release the manager before may have sent can still land", n)
	}
	w.settle()
	w.gone(t, "r")
	w.gone(t, "x")
	w.check()
}

// TestASecretBeingLetGoIsTakenBackByANewRecord: the Secret protector lets a Secret go in
// two phases (it marks it, looks for records once more, uncached, then takes its
// protection off, locked to the version it marked). A claim that reads the mark, its
// record written, takes the Secret back with a write of its own (the mark goes) before it
// registers: the protector's last write, from the version it marked, is refused, and its
// next look finds the claim's record and keeps the Secret.
func TestASecretBeingLetGoIsTakenBackByANewRecord(t *testing.T) {
	w, _ := boundUnder(t, "a", "routed", "old")
	s := w.get(secretObj("old", "")).(*corev1.Secret)
	s.Annotations[ipamv1alpha1.SecretLettingGoAnnotation] = "true"
	must(t, w.direct.Update(w.ctx, s))
	marked := s.DeepCopy() // as the protector has it once it has marked it
	w.create(claimObj("b", "routed", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
	w.admit("b")
	for range 2 {
		if _, err := w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: "b"}}); err != nil {
			t.Fatal(err)
		}
	}
	if w.addressOf("b") == nil {
		t.Fatalf("b is not bound under a Secret it took back: %s", w.describe())
	}
	now := w.get(secretObj("old", "")).(*corev1.Secret)
	if _, still := now.Annotations[ipamv1alpha1.SecretLettingGoAnnotation]; still || !slices.Contains(now.Finalizers, ipamv1alpha1.SecretInUseFinalizer) {
		t.Fatalf("the Secret b registered under: annotations %v, finalizers %v; want it protected, the letting-go mark gone",
			now.Annotations, now.Finalizers)
	}
	letGo := marked.DeepCopy()
	letGo.Finalizers = nil
	delete(letGo.Annotations, ipamv1alpha1.SecretLettingGoAnnotation)
	if err := w.direct.Patch(w.ctx, letGo, client.MergeFromWithOptions(marked, client.MergeFromWithOptimisticLock{})); !apierrors.IsConflict(err) {
		t.Fatalf("the protector's last write, from the version it marked, was not refused as a conflict: %v", err)
	}
	w.settle() // the protector finds b's record and keeps the Secret
	if now := w.get(secretObj("old", "")).(*corev1.Secret); !slices.Contains(now.Finalizers, ipamv1alpha1.SecretInUseFinalizer) {
		t.Errorf("the protector let go of a Secret b's address is registered under")
	}
	w.check()
}

// TestASubnetClaimOfTheSameNameDoesNotTakeItsRetainedAddress: a subnet-mode claim released
// with retention comes back under the same name. Its candidate, the retained address, is
// "updated" (nothing tells its own retained hold from someone else's), so it takes the next
// address, and the retained one stays retained, as the Released event says.
func TestASubnetClaimOfTheSameNameDoesNotTakeItsRetainedAddress(t *testing.T) {
	w, addr := boundUnder(t, "n", "subnet", "old")
	c := w.get(claimObj("n", "", nil)).(*ipamv1.IPAddressClaim)
	c.Annotations[ipamv1alpha1.RetentionPeriodDaysAnnotation] = "7"
	must(t, w.direct.Update(w.ctx, c))
	w.settle()
	w.drainEvents()
	w.deleteClaims("n")
	w.settle()
	said := false
	for _, e := range w.drainEvents() {
		said = said || strings.Contains(e, "does not give it back to a claim of the same name")
	}
	if !said {
		t.Errorf("the Released event of a subnet-mode claim does not say that the address is not given back")
	}
	w.create(claimObj("n", "subnet", map[string]string{ipamv1alpha1.SecretAnnotation: "old", ipamv1alpha1.RetentionPeriodDaysAnnotation: "7"}))
	w.settle()
	again := w.addressOf("n")
	if again == nil || again.Spec.Address == addr.Spec.Address {
		t.Fatalf("the claim of the same name is bound to %v, want another address than the retained %s", again, addr.Spec.Address)
	}
	retained := false
	for _, r := range w.api.Registrations() {
		for _, h := range r.Holders {
			retained = retained || r.Address == addr.Spec.Address+"/32" && h.ServiceName == "n" && h.ExpiresAt != nil &&
				time.Until(*h.ExpiresAt) > 6*24*time.Hour
		}
	}
	if !retained {
		t.Errorf("%s is no longer retained for 7 days: %v", addr.Spec.Address, w.api.Registrations())
	}
	w.check()
}

// TestALostReregistrationIsWaitedOutByTheRelease: a bound claim's retention changes, and the
// answer to the re-registration is lost; the manager restarts and the claim is deleted. The
// release waits until the re-registration can no longer be carried out (the IPAM-API does not
// serialise them: carried out after the release, it would hold the address for good), then
// releases.
func TestALostReregistrationIsWaitedOutByTheRelease(t *testing.T) {
	w, _ := boundUnder(t, "r", "routed", "old")
	w.cfg.QuarantineTime = 2 * time.Second // long enough to look at the wait
	w.start()
	c := w.get(claimObj("r", "", nil)).(*ipamv1.IPAddressClaim)
	c.Annotations[ipamv1alpha1.RetentionPeriodDaysAnnotation] = "3"
	must(t, w.direct.Update(w.ctx, c))
	must(t, w.api.DropNext(sim.DropBefore, 1))
	sent := w.api.Stats().Total(sim.RouteRegister)
	w.run(1)
	if n := w.api.Stats().Total(sim.RouteRegister) - sent; n != 1 {
		t.Fatalf("the retention change sent %d registrations, want 1: %s", n, w.describe())
	}
	rec, _ := record.OnClaim(w.get(claimObj("r", "", nil)).GetAnnotations())
	bound, _ := record.OnAddress(w.addressOf("r").Labels, w.addressOf("r").Annotations)
	if rec == nil || bound == nil || !rec.Attempt.After(bound.Attempt) {
		t.Fatalf("the re-registration should be recorded on the claim before it is sent, later than the attempt the IPAddress shows answered: %s", w.describe())
	}
	w.start() // a restart: nothing in memory says the request got no answer
	w.deleteClaims("r")
	released := w.api.Stats().Total(sim.RouteRelease)
	w.run(2)
	if n := w.api.Stats().Total(sim.RouteRelease) - released; n != 0 {
		t.Errorf("%d releases went out while the re-registration may still be carried out", n)
	}
	w.settle()
	w.gone(t, "r")
	w.check()
}

// TestAReleaseWaitsOutATakeOverOfItsAddress: a Service is moved, and the answer to the new
// claim's registration of the Service's address (the take-over) is lost; the manager restarts,
// the Service is moved again and deleted. The old claim's release waits until the take-over
// can no longer be carried out: carried out after the release, it would hold the address
// again for good.
func TestAReleaseWaitsOutATakeOverOfItsAddress(t *testing.T) {
	w := movingWorld(t)
	w.create(serviceClaim("web-ipv4", "svc-a"))
	w.settle()
	if w.addressOf("web-ipv4") == nil {
		t.Fatalf("the Service's first claim is not bound: %s", w.describe())
	}
	old := w.get(claimObj("web-ipv4", "", nil)).(*ipamv1.IPAddressClaim)
	old.Annotations[ipamv1alpha1.SupersededByAnnotation] = "web-a"
	must(t, w.direct.Update(w.ctx, old))
	must(t, w.api.DropNext(sim.DropBefore, 1))
	w.create(serviceClaim("web-a", "svc-b"))
	w.run(1)
	if rec, _ := record.OnClaim(w.get(claimObj("web-a", "", nil)).GetAnnotations()); rec == nil || rec.Attempt.IsZero() || rec.Address == "" {
		t.Fatalf("the new claim should have sent its take-over of the address: %s", w.describe())
	}
	w.start() // a restart: nothing in memory says the take-over got no answer
	// Moved again, and deleted: the next claim went before it did anything, so the old claim
	// releases the address itself.
	old = w.get(claimObj("web-ipv4", "", nil)).(*ipamv1.IPAddressClaim)
	old.Annotations[ipamv1alpha1.SupersededByAnnotation] = "web-b"
	must(t, w.direct.Update(w.ctx, old))
	w.deleteClaims("web-ipv4", "web-a")
	released := w.api.Stats().Total(sim.RouteRelease)
	// The old claim first, before the new one's release meets its own record.
	if _, err := w.claims.Reconcile(w.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "apps", Name: "web-ipv4"}}); err != nil {
		t.Logf("reconcile: %v", err)
	}
	if n := w.api.Stats().Total(sim.RouteRelease) - released; n != 0 {
		t.Errorf("%d releases went out while the take-over of the address may still be carried out", n)
	}

	w.settle()
	w.gone(t, "web-ipv4")
	w.gone(t, "web-a")
	w.check()
}

// TestALostReleaseIsWaitedOutByTheNextManager: a claim is deleted and the answer to its
// release is lost; the manager restarts. The new one does not release the claim again until
// the first release can no longer be carried out: the claim would go, a claim of the same name
// (the same identity) could take the address again, and the first release, carried out late,
// would free it under that claim.
func TestALostReleaseIsWaitedOutByTheNextManager(t *testing.T) {
	w, _ := boundUnder(t, "r", "routed", "old")
	w.cfg.QuarantineTime = 2 * time.Second // long enough to look at the wait
	w.start()
	w.run(1) // the manager sees the claim live: its deletion comes after it started
	w.deleteClaims("r")
	must(t, w.api.DropNext(sim.DropBefore, 1))
	released := w.api.Stats().Total(sim.RouteRelease)
	w.run(1)
	if n := w.api.Stats().Total(sim.RouteRelease) - released; n != 1 {
		t.Fatalf("the deleted claim sent %d releases, want 1: %s", n, w.describe())
	}
	w.start() // a restart: nothing in memory says the release got no answer
	w.run(2)
	if n := w.api.Stats().Total(sim.RouteRelease) - released; n != 1 {
		t.Errorf("%d more releases went out while the first may still be carried out", n-1)
	}
	w.settle()
	w.gone(t, "r")
	w.check()
}

// TestALostGiveBackIsWaitedOutByTheNextManager: a subnet-mode claim's candidate is held
// under the same Secret value by someone else, so the claim gives it back, and the answer
// to the give-back is lost; the manager restarts. The new one does not give it back again
// until the first give-back can no longer be carried out: carried out late, it would free
// the address should the claim, or one made again under its name, register it meanwhile.
// Then the claim binds the next address, and the holder outside keeps the first.
func TestALostGiveBackIsWaitedOutByTheNextManager(t *testing.T) {
	w := newWorld(t)
	w.cfg.QuarantineTime = 2 * time.Second // long enough to look at the wait
	w.start()
	pools(w)
	holdOutside(w, "old-secret-value-1", "hnet-private", "10.50.0.2/32")
	must(t, w.api.SetFaults(sim.Faults{DropAfterNext: 1, Routes: []sim.Route{sim.RouteRelease}}))
	w.create(claimObj("c", "subnet", map[string]string{ipamv1alpha1.SecretAnnotation: "old"}))
	for range 5 {
		if w.api.Stats().Total(sim.RouteRelease) > 0 {
			break
		}
		w.pass()
	}
	rec, _ := record.OnClaim(w.get(claimObj("c", "", nil)).GetAnnotations())
	if n := w.api.Stats().Total(sim.RouteRelease); n != 1 || rec == nil || rec.Phase != record.PhaseDeclining || rec.Attempt.IsZero() {
		t.Fatalf("the claim should have recorded its give-back of 10.50.0.2, with its attempt time, and sent it once (sent %d): %s", n, w.describe())
	}
	w.start() // a restart: nothing in memory says the give-back got no answer
	released := w.api.Stats().Total(sim.RouteRelease)
	w.run(2)
	if n := w.api.Stats().Total(sim.RouteRelease) - released; n != 0 {
		t.Errorf("%d give-backs went out again while the first may still be carried out", n)
	}
	w.settle()
	if a := w.addressOf("c"); a == nil || a.Spec.Address != "10.50.0.3" {
		t.Fatalf("the claim is bound to %v, want 10.50.0.3, the next address:\n%s", a, w.describe())
	}
	if holders := w.live()["10.50.0.2/32"]; len(holders) != 0 {
		t.Errorf("10.50.0.2 is held by %v of this cluster too, want its holder outside alone", holders)
	}
	kept := false
	for _, h := range w.api.Holders("10.50.0.2/32") {
		kept = kept || h.ServiceName == "elsewhere-10.50.0.2/32" && h.State == sim.HoldLive
	}
	if !kept {
		t.Errorf("the holder outside lost 10.50.0.2: %v", w.api.Holders("10.50.0.2/32"))
	}
	w.check()
}

// movingWorld is a world with a quarantine long enough to look at a wait, two pools of one
// zone and family for a Service to move between (svc-a, svc-b), and the Secret old.
func movingWorld(t *testing.T) *world {
	w := newWorld(t)
	w.cfg.QuarantineTime = 2 * time.Second
	w.start()
	for _, name := range []string{"svc-a", "svc-b"} {
		w.create(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name},
			Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4, AllowIdentityOverrides: true}})
	}
	w.create(secretObj("old", "old-secret-value-1"))
	return w
}

// unansweredClaim is a world whose claim c, of pool routed, sent its first registration and
// got no answer: the request was dropped before the IPAM-API saw it (DropBefore), or carried
// out and its answer lost (DropAfter).
func unansweredClaim(t *testing.T, mode sim.DropMode) *world {
	w := newWorld(t)
	pools(w)
	must(t, w.api.DropNext(mode, 1))
	w.create(claimObj("c", "routed", nil))
	w.run(3) // the release finalizer goes on in the first pass, the default Secret is made and protected in the second, the request goes in the third
	return w
}
