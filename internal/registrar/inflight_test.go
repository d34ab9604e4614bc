package registrar_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
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
	_, ok := f.Reserve(ctx, "id", "", a)
	g.Expect(ok).To(BeTrue())
	holder, ok := f.Reserve(ctx, "id", "", b)
	g.Expect(ok).To(BeFalse())
	g.Expect(holder).To(Equal("ns/a"))
	// Different explicit addresses may coexist (make before break).
	f.Forget(a.UID)
	_, ok = f.Reserve(ctx, "id", "10.0.0.1/32", a)
	g.Expect(ok).To(BeTrue())
	_, ok = f.Reserve(ctx, "id", "10.0.0.2/32", b)
	g.Expect(ok).To(BeTrue())
	// A claim that no longer exists holds nothing.
	_, ok = f.Reserve(ctx, "id", "10.0.0.1/32", c)
	g.Expect(ok).To(BeFalse())
	_, ok = f.Reserve(ctx, "gone", "", claim("ghost"))
	g.Expect(ok).To(BeTrue())
	_, ok = f.Reserve(ctx, "gone", "", c)
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
	reserved, answered, waits := f.Len()
	g.Expect(reserved).To(Equal(0))
	g.Expect(answered).To(Equal(0))
	g.Expect(waits).To(Equal(0))
}

func TestInFlightQuarantine(t *testing.T) {
	g := NewWithT(t)
	f := &registrar.InFlight{Quarantine: time.Hour}
	attempt := time.Now()
	waiting := f.MayStillBeInFlight("u", attempt)
	g.Expect(waiting).To(BeNumerically(">", 0), "an attempt whose answer this process never saw")
	f.SawAnswer("u", attempt)
	waiting = f.MayStillBeInFlight("u", attempt)
	g.Expect(waiting).To(BeZero())
	waiting = f.MayStillBeInFlight("u", attempt.Add(time.Second))
	g.Expect(waiting).To(BeNumerically(">", 0), "a later attempt is another request")
	waiting = f.MayStillBeInFlight("u", time.Time{})
	g.Expect(waiting).To(BeZero(), "nothing was ever sent")
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

	waiting := f.MayStillBeInFlight("u", attempt)
	g.Expect(waiting).To(BeNumerically(">", 0))
	g.Expect(waiting).To(BeNumerically("~", 20*time.Second, time.Second))

	// Back an hour: the wait begun goes on for its 20 s, not for an hour more.
	clock.SetTime(t0.Add(-time.Hour))
	waiting = f.MayStillBeInFlight("u", attempt)
	g.Expect(waiting).To(BeNumerically(">", 0))
	g.Expect(waiting).To(BeNumerically("~", 20*time.Second, time.Second), "waits for as long as the clock went back")
	// An attempt ahead of the clock, first met now, is waited out for one quarantine.
	waiting = f.MayStillBeInFlight("v", attempt)
	g.Expect(waiting).To(BeNumerically(">", 0))
	g.Expect(waiting).To(BeNumerically("~", 20*time.Second, time.Second))

	// Forward an hour: the wait begun is not cut short; an attempt first met now is
	// long over.
	clock.SetTime(t0.Add(time.Hour))
	waiting = f.MayStillBeInFlight("u", attempt)
	g.Expect(waiting).To(BeNumerically(">", 0), "a jump forward cut the wait short")
	waiting = f.MayStillBeInFlight("w", attempt)
	g.Expect(waiting).To(BeZero())

	// Resending under a seen attempt: only while it is fresh, never once the clock is
	// behind it.
	f.SawAnswer("u", attempt)
	waiting = f.MayStillBeInFlight("u", attempt)
	g.Expect(waiting).To(BeZero(), "its answer was seen")
	g.Expect(f.MayResendUnder("u", attempt, time.Second)).To(BeFalse(), "too old to resend under")
	clock.SetTime(t0.Add(-time.Hour))
	g.Expect(f.MayResendUnder("u", attempt, time.Second)).To(BeFalse(), "an attempt time ahead of the clock is reused")
	clock.SetTime(t0.Add(5 * time.Second))
	g.Expect(f.MayResendUnder("u", attempt, time.Second)).To(BeTrue())
}

// A wait ends once its time has passed on the monotonic clock, whatever the wall clock
// says.
func TestInFlightWaitEnds(t *testing.T) {
	g := NewWithT(t)
	t0, clock, f := clockedInFlight()
	f.Quarantine = 50 * time.Millisecond
	waiting := f.MayStillBeInFlight("u", t0)
	g.Expect(waiting).To(BeNumerically(">", 0))
	clock.SetTime(t0.Add(-time.Hour)) // the wall clock stands still, behind
	time.Sleep(60 * time.Millisecond)
	waiting = f.MayStillBeInFlight("u", t0)
	g.Expect(waiting).To(BeZero())
}

// A request this process sends is waited out on the monotonic clock from the moment it
// goes out, until its answer is seen: a jump forward before the next reconcile does not
// end the wait, and a resend under an attempt whose earlier answer was seen is waited
// out too. Forget and SawAnswer end the wait.
func TestInFlightSending(t *testing.T) {
	g := NewWithT(t)
	t0, clock, f := clockedInFlight()
	attempt := f.AttemptTime()
	f.Sending("u", attempt)
	clock.SetTime(t0.Add(time.Hour)) // the request timed out; the clock jumped meanwhile
	waiting := f.MayStillBeInFlight("u", attempt)
	g.Expect(waiting).To(BeNumerically(">", 0), "a jump forward ended the wait for a request this process sent")

	f.SawAnswer("u", attempt)
	waiting = f.MayStillBeInFlight("u", attempt)
	g.Expect(waiting).To(BeZero())

	// Resent under the same attempt, and this time no answer.
	f.Sending("u", attempt)
	waiting = f.MayStillBeInFlight("u", attempt)
	g.Expect(waiting).To(BeNumerically(">", 0), "the earlier answer counted for the resend")
	g.Expect(f.MayResendUnder("u", attempt, time.Second)).To(BeFalse())

	f.Forget("u")
	_, answered, waits := f.Len()
	g.Expect(answered).To(BeZero())
	g.Expect(waits).To(BeZero())
}

// clockedInFlight is an in-flight set with a 20 s quarantine on a fake wall clock at t0.
func clockedInFlight() (time.Time, *clocktesting.FakePassiveClock, *registrar.InFlight) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	clock := clocktesting.NewFakePassiveClock(t0)
	return t0, clock, &registrar.InFlight{Quarantine: 20 * time.Second, Clock: clock}
}

// Answers older than the quarantine are pruned once thousands are remembered, with one
// pass over them each time their number doubles, not one on every answer of a burst.
func TestInFlightPrunesOldAnswersOncePerDoubling(t *testing.T) {
	g := NewWithT(t)
	t0, clock, f := clockedInFlight()
	answer := func(from, to int) {
		for i := from; i < to; i++ {
			f.SawAnswer(types.UID(fmt.Sprint("u", i)), clock.Now())
		}
	}
	answered := func() int { _, a, _ := f.Len(); return a }

	answer(0, 4097) // a pass, with nothing old enough to go
	g.Expect(answered()).To(Equal(4097))
	clock.SetTime(t0.Add(30 * time.Second))
	answer(4097, 8194)
	g.Expect(answered()).To(Equal(8194), "no pass before the number doubled")
	answer(8194, 8195)
	g.Expect(answered()).To(Equal(8195-4097), "the pass dropped every answer older than the quarantine")
	f.SawAnswer("u0", clock.Now())
	g.Expect(f.MayResendUnder("u0", clock.Now(), time.Second)).To(BeTrue(), "a fresh answer is remembered")
}
