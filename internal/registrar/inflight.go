package registrar

import (
	"context"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// InFlight is what this process knows about registrations beyond the cluster: which
// claim is registering which IPAM-API identity (so two claims never use one even before
// the cache shows the other's record), and which requests' answers were seen (so a
// request whose answer never came is waited out before the next one is sent). Entries
// go when their claim is bound, released or gone.
type InFlight struct {
	// Reader tells whether a claim still exists.
	Reader client.Reader
	// Quarantine is how long a request without an answer may still complete.
	Quarantine time.Duration
	// Clock reads the wall clock that attempt times are written and compared in (they
	// are recorded on claims, for other processes too); nil: the host's.
	Clock clock.PassiveClock

	mu       sync.Mutex
	reserved map[string][]reservation
	byClaim  map[types.UID][]string
	answered map[types.UID]time.Time
	// pruneAbove is how many answers may be remembered before the old ones are pruned:
	// twice what was left by the last pruning, at least minPruneAbove, so that the pass
	// over all answers happens once per doubling, not on every answer of a burst. (After
	// a large burst, stale answers may pile up to that many before the next pass; each
	// is a few bytes, and answers of bound or deleted claims are forgotten at once.)
	pruneAbove int
	waits      map[types.UID]wait
	origin     time.Time
}

// minPruneAbove is the fewest answers remembered before old ones are pruned.
const minPruneAbove = 4096

type reservation struct {
	uid  types.UID
	name types.NamespacedName
	// address is the address of an identity reservation; share the share key of an
	// address reservation.
	address, share string
	exclusive      bool
}

func (r reservation) conflicts(address, share string, exclusive bool) bool {
	if exclusive {
		return share == "" || r.share != share
	}
	return HoldersConflict(address, r.address)
}

// HoldersConflict reports whether two registrations of one identity may not coexist:
// without an address the IPAM-API would answer both with the same one, and with the
// same address a release of one would free the other's. Different explicit addresses
// (a Service moving to a new address, make before break) may coexist.
func HoldersConflict(a, b string) bool { return a == "" || b == "" || a == b }

// Reserve claims an IPAM-API identity key (with the claim's address, if any) for a
// claim. It fails, naming the other claim, when a claim that still exists holds a
// conflicting reservation.
func (f *InFlight) Reserve(ctx context.Context, key, address string, claim client.Object) (string, bool) {
	return f.reserve(ctx, "identity|"+key, reservation{address: address}, claim)
}

// ReserveAddress claims an address (a record.HostKey) for a claim about to register
// it, so two claims of this process never register one address at once unless both
// declare the same share key.
func (f *InFlight) ReserveAddress(ctx context.Context, hostKey, share string, claim client.Object) (string, bool) {
	return f.reserve(ctx, "address|"+hostKey, reservation{share: share, exclusive: true}, claim)
}

func (f *InFlight) reserve(ctx context.Context, key string, mine reservation, claim client.Object) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reserved == nil {
		f.reserved, f.byClaim = map[string][]reservation{}, map[types.UID][]string{}
	}
	kept := f.reserved[key][:0]
	conflict := ""
	for _, other := range f.reserved[key] {
		if other.uid == claim.GetUID() {
			continue
		}
		c := &ipamv1.IPAddressClaim{}
		err := f.Reader.Get(ctx, other.name, c)
		if err != nil && apierrors.IsNotFound(err) || err == nil && c.UID != other.uid {
			continue // gone: forget it
		}
		kept = append(kept, other)
		if other.conflicts(mine.address, mine.share, mine.exclusive) {
			conflict = other.name.String()
		}
	}
	if conflict == "" {
		mine.uid, mine.name = claim.GetUID(), client.ObjectKeyFromObject(claim)
		kept = append(kept, mine)
		if !slices.Contains(f.byClaim[mine.uid], key) {
			f.byClaim[mine.uid] = append(f.byClaim[mine.uid], key)
		}
	}
	f.reserved[key] = kept
	return conflict, conflict == ""
}

// Now reads the clock attempt times are compared in (waits are timed on the monotonic
// clock instead; see MayStillBeInFlight).
func (f *InFlight) Now() time.Time {
	if f.Clock == nil {
		return time.Now()
	}
	return f.Clock.Now()
}

// AttemptTime is the time to record for a registration request sent now.
func (f *InFlight) AttemptTime() time.Time { return f.Now().UTC() }

// Forget drops what this process knows about a claim: its reservations and answers.
func (f *InFlight) Forget(uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, key := range f.byClaim[uid] {
		if rest := slices.DeleteFunc(f.reserved[key], func(r reservation) bool { return r.uid == uid }); len(rest) > 0 {
			f.reserved[key] = rest
		} else {
			delete(f.reserved, key)
		}
	}
	delete(f.byClaim, uid)
	delete(f.answered, uid)
	delete(f.waits, uid)
	// A Go map keeps the room it grew to: after a burst of thousands of claims, empty
	// maps are dropped so that their memory goes too.
	if len(f.byClaim) == 0 {
		f.reserved, f.byClaim = nil, nil
	}
	if len(f.answered) == 0 {
		f.answered, f.pruneAbove = nil, 0
	}
	if len(f.waits) == 0 {
		f.waits = nil
	}
}

// SawAnswer records that the outcome of a claim's attempt is known (it was answered,
// or never sent).
func (f *InFlight) SawAnswer(uid types.UID, attempt time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.answered == nil {
		f.answered = map[types.UID]time.Time{}
	}
	f.answered[uid] = attempt
	delete(f.waits, uid)
	if len(f.answered) > max(f.pruneAbove, minPruneAbove) {
		// Answers older than the quarantine tell nothing any more.
		now := f.Now()
		for u, t := range f.answered {
			if now.Sub(t) > f.Quarantine {
				delete(f.answered, u)
			}
		}
		f.pruneAbove = 2 * len(f.answered)
	}
}

// MayResendUnder reports whether a request sent now may go under the claim's recorded
// attempt time instead of a new one (saving the write of a new one): this process saw
// the outcome of that attempt, and a request sent now ends (within timeout) before the
// attempt's quarantine does, so a process that finds the record after a crash still
// waits long enough. An attempt time ahead of the clock (it went back) is not reused.
func (f *InFlight) MayResendUnder(uid types.UID, attempt time.Time, timeout time.Duration) bool {
	if attempt.IsZero() || timeout <= 0 {
		return false
	}
	f.mu.Lock()
	seen, ok := f.answered[uid]
	f.mu.Unlock()
	elapsed := f.Now().Sub(attempt)
	return ok && seen.Equal(attempt) && elapsed >= 0 && elapsed+timeout < f.Quarantine
}

// MayStillBeInFlight reports for how long an earlier attempt of the claim, whose
// outcome this process has not seen (it timed out, or another process or an earlier run
// of this one sent it), may still be carried out by the IPAM-API (0: it is over).
//
// The attempt time is wall-clock time (it is recorded on the claim, for any process),
// but the wait is decided once, when this process first meets the attempt, and then
// timed on the process's monotonic clock: a wall clock that jumps later neither stretches
// nor cuts it. An attempt time ahead of the clock (written before the clock went back,
// or by a host whose clock runs ahead) is waited out for one quarantine: the request
// was sent before now all the same.
func (f *InFlight) MayStillBeInFlight(uid types.UID, attempt time.Time) time.Duration {
	if attempt.IsZero() {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if seen, ok := f.answered[uid]; ok && seen.Equal(attempt) {
		return 0
	}
	mono := f.monotonic()
	w, ok := f.waits[uid]
	if !ok || !w.attempt.Equal(attempt) {
		w = f.setWait(uid, attempt, min(attempt.Add(f.Quarantine).Sub(f.Now()), f.Quarantine))
	}
	return max(w.deadline-mono, 0)
}

// Sending records that a request under attempt goes out now: until SawAnswer, a later
// MayStillBeInFlight waits it out for one quarantine from now, timed on the monotonic
// clock whatever the wall clock does meanwhile, and the claim's earlier answer no
// longer counts (a resend that times out is waited out too).
func (f *InFlight) Sending(uid types.UID, attempt time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.answered, uid)
	f.setWait(uid, attempt, f.Quarantine)
}

// setWait starts a wait of d for the claim's attempt, dropping waits that are over
// once there are many. Callers hold mu.
func (f *InFlight) setWait(uid types.UID, attempt time.Time, d time.Duration) wait {
	mono := f.monotonic()
	if f.waits == nil {
		f.waits = map[types.UID]wait{}
	}
	if len(f.waits) > 4096 {
		for u, old := range f.waits {
			if old.deadline <= mono {
				delete(f.waits, u)
			}
		}
	}
	w := wait{attempt: attempt, deadline: mono + d}
	f.waits[uid] = w
	return w
}

// wait is how long a process waits out an attempt whose answer it has not seen: until
// deadline on its monotonic clock.
type wait struct {
	attempt  time.Time
	deadline time.Duration
}

// monotonic is the time since the first call, on the process's monotonic clock, which
// no change of the wall clock moves. Callers hold mu.
func (f *InFlight) monotonic() time.Duration {
	if f.origin.IsZero() {
		f.origin = time.Now()
	}
	return time.Since(f.origin)
}

// Len is the number of identities reserved, answers remembered and waits kept (for
// tests of pruning).
func (f *InFlight) Len() (reserved, answered, waits int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reserved), len(f.answered), len(f.waits)
}
