package registrar_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/metrics"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

func claim(name string) *ipamv1.IPAddressClaim {
	return &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}}
}

func TestInFlightReservations(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	a, b, c := claim("a"), claim("b"), claim("c")
	f := &registrar.InFlight{Reader: fake.NewClientBuilder().WithScheme(manager.NewScheme()).WithObjects(a, b).Build(), Quarantine: time.Second}

	// One identity: no two claims without an address, nor with the same one.
	_, ok := f.Reserve(ctx, "id", "", a, nil)
	g.Expect(ok).To(BeTrue())
	holder, ok := f.Reserve(ctx, "id", "", b, nil)
	g.Expect(ok).To(BeFalse())
	g.Expect(holder).To(Equal("ns/a"))
	// Different explicit addresses may coexist (make before break).
	f.Forget(a.UID)
	_, ok = f.Reserve(ctx, "id", "10.0.0.1/32", a, nil)
	g.Expect(ok).To(BeTrue())
	_, ok = f.Reserve(ctx, "id", "10.0.0.2/32", b, nil)
	g.Expect(ok).To(BeTrue())
	// A claim that no longer exists holds nothing.
	_, ok = f.Reserve(ctx, "id", "10.0.0.1/32", c, nil)
	g.Expect(ok).To(BeFalse())
	_, ok = f.Reserve(ctx, "gone", "", claim("ghost"), nil)
	g.Expect(ok).To(BeTrue())
	_, ok = f.Reserve(ctx, "gone", "", c, nil)
	g.Expect(ok).To(BeTrue(), "ghost does not exist")

	// One address: only claims that declare the same share key.
	_, ok = f.ReserveAddress(ctx, "host", "k", a)
	g.Expect(ok).To(BeTrue())
	_, ok = f.ReserveAddress(ctx, "host", "k", b)
	g.Expect(ok).To(BeTrue())
	_, ok = f.ReserveAddress(ctx, "host", "", c)
	g.Expect(ok).To(BeFalse())

	// Forget drops everything of a claim.
	for _, x := range []*ipamv1.IPAddressClaim{a, b, c} {
		f.Forget(x.UID)
	}
	keys, claims := f.Len()
	g.Expect(keys).To(Equal(0))
	g.Expect(claims).To(Equal(0))
}

// standIn is the IPAM-API stand-in and a client of it with a one-second timeout.
func standIn(t *testing.T) (*sim.Server, ipamapi.Client) {
	t.Helper()
	s := sim.New(sim.Config{})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c, err := ipamapi.NewClient(srv.URL, ipamapi.Options{Timeout: time.Second})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return s, c
}

const value = ipamapi.Secret("in-flight-test-value-1")

// registration is a registration of service name in zone inet of the stand-in, with
// address (may be empty) and attempt time.
func registration(name, address string, attempt time.Time) *record.Registration {
	return &record.Registration{Endpoint: "https://ipam.example", Zone: "inet", Family: ipamapi.FamilyIPv4, Address: address,
		Attempt: attempt, Identity: ipamapi.Identity{ServiceName: name, NamespaceID: "ns-uid", ClusterID: "cluster-uid"}}
}

// register sends reg through f under uid.
func register(f *registrar.InFlight, api ipamapi.Client, uid types.UID, reg *record.Registration) error {
	_, err := f.Register(context.Background(), api, uid, reg, reg.Request(value))
	return err
}

// No two registrations of one identity, nor of one address, are ever out at once, and
// a registration whose answer was lost keeps both busy for the quarantine; the
// metrics count both.
func TestInFlightRegistersOneAtATime(t *testing.T) {
	g := NewWithT(t)
	s, api := standIn(t)
	f := &registrar.InFlight{Quarantine: time.Hour}
	g.Expect(s.SetLatency(200*time.Millisecond, 0)).To(Succeed())

	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = register(f, api, types.UID(fmt.Sprint("u", i)), registration("same", "", time.Time{}))
		}()
	}
	g.Eventually(func() metrics.Pending { return f.Pending()["ipam.example"] }).Should(Equal(metrics.Pending{InFlight: 1}))
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
			continue
		}
		g.Expect(ipamapi.IsTransient(err)).To(BeTrue())
		g.Expect(err.Error()).To(ContainSubstring("still in flight"))
	}
	g.Expect(ok).To(BeNumerically(">=", 1))
	g.Expect(s.HeldBy(sim.ServiceRef{ServiceName: "same", NamespaceID: "ns-uid", ClusterID: "cluster-uid"})).To(HaveLen(1))
	g.Expect(s.Stats().OverlappingRegistrations).To(BeZero())
	g.Expect(f.Pending()).To(BeEmpty())

	// One address asked for by two identities at once: one of them waits.
	for i, name := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = register(f, api, types.UID(name), registration(name, "83.118.168.77/32", time.Time{}))
		}()
	}
	wg.Wait()
	g.Expect(errs[:2]).To(ContainElement(MatchError(ContainSubstring("still in flight"))))
	g.Expect(errs[:2]).To(ContainElement(BeNil()))

	// An answer lost after the IPAM-API registered: the identity and the address are
	// busy, other identities are not.
	g.Expect(s.SetLatency(0, 0)).To(Succeed())
	g.Expect(s.DropNext(sim.DropAfter, 1)).To(Succeed())
	err := register(f, api, "lost", registration("lost", "83.118.168.78/32", time.Time{}))
	g.Expect(ipamapi.IsTransient(err)).To(BeTrue())
	err = register(f, api, "lost", registration("lost", "83.118.168.78/32", time.Time{}))
	g.Expect(err).To(MatchError(ContainSubstring("ended without an answer; waiting until")))
	err = register(f, api, "other", registration("other", "83.118.168.78/32", time.Time{}))
	g.Expect(err).To(MatchError(ContainSubstring("ended without an answer")))
	g.Expect(register(f, api, "other", registration("other", "", time.Time{}))).To(Succeed())
	g.Expect(f.Pending()).To(Equal(map[string]metrics.Pending{"ipam.example": {Quarantined: 1}}))
	g.Expect(s.Stats().OverlappingRegistrations).To(BeZero())
}

// An attempt whose answer this process never saw is waited out; one it saw answered,
// or that was never sent, is not.
func TestInFlightQuarantine(t *testing.T) {
	g := NewWithT(t)
	_, api := standIn(t)
	f := &registrar.InFlight{Quarantine: time.Hour}
	attempt := f.AttemptTime()
	g.Expect(f.Wait("u", registration("x", "", attempt), true)).To(BeNumerically(">", 0),
		"an attempt whose answer this process never saw")
	g.Expect(f.Wait("u", registration("y", "", time.Time{}), true)).To(BeZero(), "nothing was ever sent")

	v := claim("v")
	_, ok := f.Reserve(context.Background(), registration("z", "", attempt).Key(), "", v, nil)
	g.Expect(ok).To(BeTrue())
	g.Expect(register(f, api, v.UID, registration("z", "", attempt))).To(Succeed())
	g.Expect(f.Wait(v.UID, registration("z", "", attempt), true)).To(BeZero(), "its answer was seen")
	g.Expect(f.Wait(v.UID, registration("z", "", attempt.Add(time.Second)), true)).To(BeNumerically(">", 0),
		"a later attempt is another request")
	g.Expect(f.Wait("w", registration("x", "", attempt), true)).To(BeNumerically(">", 0),
		"another claim of the identity waits for the request too")
}

// Attempt times are wall-clock times, recorded on claims, but a process decides how
// long to wait out an unanswered attempt when it first meets it and then times the wait
// on its monotonic clock: the wall clock jumping back does not stall the claim for as
// long as it went back, and jumping forward does not cut a wait short.
func TestInFlightClockJumps(t *testing.T) {
	g := NewWithT(t)
	t0, clock, f := clockedInFlight()
	attempt := f.AttemptTime()
	g.Expect(attempt).To(Equal(t0))

	waiting := f.Wait("u", registration("u", "", attempt), true)
	g.Expect(waiting).To(BeNumerically("~", 20*time.Second, time.Second))

	// Back an hour: the wait begun goes on for its 20 s, not for an hour more.
	clock.SetTime(t0.Add(-time.Hour))
	waiting = f.Wait("u", registration("u", "", attempt), true)
	g.Expect(waiting).To(BeNumerically("~", 20*time.Second, time.Second), "waits for as long as the clock went back")
	// An attempt ahead of the clock, first met now, is waited out for one quarantine.
	waiting = f.Wait("v", registration("v", "", attempt), true)
	g.Expect(waiting).To(BeNumerically("~", 20*time.Second, time.Second))

	// Forward an hour: the wait begun is not cut short; an attempt first met now is
	// long over.
	clock.SetTime(t0.Add(time.Hour))
	waiting = f.Wait("u", registration("u", "", attempt), true)
	g.Expect(waiting).To(BeNumerically(">", 0), "a jump forward cut the wait short")
	waiting = f.Wait("w", registration("w", "", attempt), true)
	g.Expect(waiting).To(BeZero())
}

// An answer this process saw is kept while the claim holds the identity, and after it is
// bound until the request's quarantine would have ended: a release, or the same request
// sent again, waits for nothing, and nothing is kept busy.
func TestInFlightAnAnswerSeenIsWaitedForByNothing(t *testing.T) {
	g := NewWithT(t)
	_, api := standIn(t)
	_, _, f := clockedInFlight()
	reg := registration("u", "", f.AttemptTime())
	_, ok := f.Reserve(context.Background(), reg.Key(), "", claim("u"), nil)
	g.Expect(ok).To(BeTrue())
	g.Expect(register(f, api, claim("u").UID, reg)).To(Succeed())
	g.Expect(f.Wait(claim("u").UID, reg, true)).To(BeZero())

	f.Forget(claim("u").UID)
	g.Expect(f.Wait(claim("u").UID, reg, true)).To(BeZero())
	keys, claims := f.Len()
	g.Expect(keys).To(Equal(1))
	g.Expect(claims).To(BeZero())
	g.Expect(f.Wait("", reg, false)).To(BeZero())
	g.Expect(f.Wait("another", reg, true)).NotTo(BeZero(), "another claim's record with that attempt was not seen answered")
}

// A wait ends once its time has passed on the monotonic clock, whatever the wall clock
// says.
func TestInFlightWaitEnds(t *testing.T) {
	g := NewWithT(t)
	t0, clock, f := clockedInFlight()
	f.Quarantine = 50 * time.Millisecond
	waiting := f.Wait("u", registration("u", "", t0), true)
	g.Expect(waiting).To(BeNumerically(">", 0))
	clock.SetTime(t0.Add(-time.Hour)) // the wall clock stands still, behind
	time.Sleep(60 * time.Millisecond)
	waiting = f.Wait("u", registration("u", "", t0), true)
	g.Expect(waiting).To(BeZero())
}

// A request this process sends without an answer is waited out on the monotonic clock
// until the quarantine from its end has passed: a jump forward of the wall clock does
// not end the wait. Forget keeps it too: the claim may be gone, the request not.
func TestInFlightLostAnswer(t *testing.T) {
	g := NewWithT(t)
	s, api := standIn(t)
	t0, clock, f := clockedInFlight()
	f.Quarantine = 300 * time.Millisecond
	reg := registration("u", "", f.AttemptTime())
	g.Expect(s.DropNext(sim.DropAfter, 1)).To(Succeed())
	g.Expect(register(f, api, "u", reg)).NotTo(Succeed())
	clock.SetTime(t0.Add(time.Hour))
	g.Expect(f.Wait("u", reg, true)).To(BeNumerically(">", 0), "a jump forward ended the wait for a request this process sent")
	g.Expect(f.Wait("", reg, false)).To(BeNumerically(">", 0), "a release may go before the request ends")
	g.Expect(f.Wait("", registration("other", "", time.Time{}), false)).To(BeZero())
	f.Forget("u")
	g.Expect(f.Wait("u", reg, true)).To(BeNumerically(">", 0), "Forget ended the wait")
	g.Eventually(func() time.Duration { return f.Wait("u", reg, true) }).Should(BeZero())
	g.Expect(f.Wait("", reg, false)).To(BeZero())
	g.Expect(register(f, api, "u", reg)).To(Succeed())
	g.Expect(f.Wait("u", reg, true)).To(BeZero())
	f.Forget("u")
}

// While a request is out, forgetting its claim does not free its keys: another request
// under them is held back until the answer comes, and the keys are free with the answer. A
// wait begun for an attempt met on a claim's record holds requests back too.
func TestInFlightForgetWhileOut(t *testing.T) {
	g := NewWithT(t)
	s, api := standIn(t)
	f := &registrar.InFlight{Quarantine: time.Hour}
	g.Expect(s.SetLatency(300*time.Millisecond, 0)).To(Succeed())
	c, reg := claim("u"), registration("u", "83.118.168.79/32", time.Time{})
	_, ok := f.Reserve(context.Background(), reg.Key(), reg.Address, c, nil)
	g.Expect(ok).To(BeTrue())
	done := make(chan error)
	go func() { done <- register(f, api, c.UID, reg) }()
	g.Eventually(func() metrics.Pending { return f.Pending()["ipam.example"] }).Should(Equal(metrics.Pending{InFlight: 1}))
	f.Forget(c.UID)
	g.Expect(register(f, api, "v", registration("v", reg.Address, time.Time{}))).To(MatchError(ContainSubstring("still in flight")))
	g.Expect(register(f, api, "v", registration("u", "", time.Time{}))).To(MatchError(ContainSubstring("still in flight")))
	g.Expect(<-done).To(Succeed())
	keys, claims := f.Len()
	g.Expect(keys).To(Equal(2), "the answer is remembered (identity and address) until the request's quarantine ends")
	g.Expect(claims).To(BeZero())
	g.Expect(f.Wait("", reg, false)).To(BeZero())

	g.Expect(f.Wait("w", registration("met", "", f.AttemptTime()), true)).To(BeNumerically(">", 0))
	g.Expect(register(f, api, "w", registration("met", "", time.Time{}))).To(MatchError(ContainSubstring("without an answer")))
	g.Expect(s.Stats().Total(sim.RouteRegister)).To(Equal(1))
}

// clockedInFlight is an in-flight table with a 20 s quarantine on a fake wall clock at
// t0.
func clockedInFlight() (time.Time, *clocktesting.FakePassiveClock, *registrar.InFlight) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	clock := clocktesting.NewFakePassiveClock(t0)
	return t0, clock, &registrar.InFlight{Quarantine: 20 * time.Second, Clock: clock}
}

// Keys that tell nothing any more (nobody holds them, their wait is over) are pruned
// once thousands are kept, with one pass each time their number doubles, not one on
// every request of a burst; held keys stay.
func TestInFlightPrunesOncePerDoubling(t *testing.T) {
	g := NewWithT(t)
	t0, _, f := clockedInFlight()
	ctx := context.Background()
	keys := func() int { k, _ := f.Len(); return k }
	hold := func(from, to int) {
		for i := from; i < to; i++ {
			_, ok := f.Reserve(ctx, fmt.Sprint("held", i), "", claim(fmt.Sprint("c", i)), nil)
			g.Expect(ok).To(BeTrue())
		}
	}
	over := func(from, to int) { // waits met long after their attempt: over at once
		for i := from; i < to; i++ {
			g.Expect(f.Wait("u", registration(fmt.Sprint("over", i), "", t0.Add(-time.Hour)), true)).To(BeZero())
		}
	}
	hold(0, 3000)
	over(0, 1097)
	g.Expect(keys()).To(Equal(4097))
	over(1097, 1098) // a pass, before the 4098th
	g.Expect(keys()).To(Equal(3001))
	over(1098, 4098)
	g.Expect(keys()).To(Equal(6001), "no pass before the number doubled")
	hold(3000, 3001)
	g.Expect(keys()).To(Equal(3001), "the pass dropped every key that told nothing")
}

// A release without an answer holds its identity and address back like a registration; a
// new process waits, for a deleted claim it did not see live, until a quarantine after it
// first used the table: the process before it may have sent a release for it until then.
func TestInFlightReleases(t *testing.T) {
	g := NewWithT(t)
	s, api := standIn(t)
	t0, clock, f := clockedInFlight()
	f.Monotonic = clock
	f.SawAlive("seen")
	g.Expect(f.MayStillBeReleasing("seen")).To(BeZero())
	g.Expect(f.MayStillBeReleasing("unseen")).To(Equal(20 * time.Second))
	clock.SetTime(t0.Add(5 * time.Second))
	g.Expect(f.MayStillBeReleasing("unseen")).To(Equal(15 * time.Second))
	clock.SetTime(t0.Add(20 * time.Second))
	g.Expect(f.MayStillBeReleasing("unseen")).To(BeZero(), "past the first quarantine, no earlier process can have a release out")
	f.SawAlive("late")
	g.Expect(f.MayStillBeReleasing("late")).To(BeZero())

	reg := registration("r", "83.118.168.9/32", time.Time{})
	g.Expect(register(f, api, "r", reg)).To(Succeed())
	g.Expect(s.DropNext(sim.DropBefore, 1)).To(Succeed())
	_, err := f.Release(context.Background(), api, "r", reg, reg.Request(value))
	g.Expect(err).To(HaveOccurred())
	g.Expect(f.Wait("", reg, false)).To(Equal(20*time.Second), "a release without an answer may still be carried out")
	g.Expect(register(f, api, "r", registration("r", "", time.Time{}))).To(MatchError(ContainSubstring("ended without an answer")))
	g.Expect(register(f, api, "other", registration("other", reg.Address, time.Time{}))).To(MatchError(ContainSubstring("ended without an answer")))
	g.Expect(s.Stats().Total(sim.RouteRegister)).To(Equal(1))
	clock.SetTime(t0.Add(40 * time.Second))
	g.Expect(register(f, api, "r", reg)).To(Succeed())
}
