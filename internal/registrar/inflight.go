package registrar

import (
	"context"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
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

	mu       sync.Mutex
	reserved map[string][]reservation
	byClaim  map[types.UID][]string
	answered map[types.UID]time.Time
}

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
	if len(f.answered) > 4096 {
		// Answers older than the quarantine tell nothing any more.
		for u, t := range f.answered {
			if time.Since(t) > f.Quarantine {
				delete(f.answered, u)
			}
		}
	}
}

// MayResendUnder reports whether a request sent now may go under the claim's recorded
// attempt time instead of a new one (saving the write of a new one): this process saw
// the outcome of that attempt, and a request sent now ends (within timeout) before the
// attempt's quarantine does, so a process that finds the record after a crash still
// waits long enough.
func (f *InFlight) MayResendUnder(uid types.UID, attempt time.Time, timeout time.Duration) bool {
	if attempt.IsZero() || timeout <= 0 {
		return false
	}
	f.mu.Lock()
	seen, ok := f.answered[uid]
	f.mu.Unlock()
	return ok && seen.Equal(attempt) && time.Since(attempt)+timeout < f.Quarantine
}

// MayStillBeInFlight reports until when an earlier attempt of the claim, whose outcome
// this process has not seen (it timed out, or another process or an earlier run of this
// one sent it), may still be carried out by the IPAM-API.
func (f *InFlight) MayStillBeInFlight(uid types.UID, attempt time.Time) (time.Time, bool) {
	if attempt.IsZero() {
		return time.Time{}, false
	}
	f.mu.Lock()
	seen, ok := f.answered[uid]
	f.mu.Unlock()
	if ok && seen.Equal(attempt) {
		return time.Time{}, false
	}
	until := attempt.Add(f.Quarantine)
	return until, time.Now().Before(until)
}

// Len is the number of identities reserved and answers remembered (for tests of pruning).
func (f *InFlight) Len() (reserved, answered int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reserved), len(f.answered)
}
