package registrar

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pkg/errors"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/metrics"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// InFlight is this process's one guard between requests to the IPAM-API, keyed by IPAM-API
// identity and by address in a zone. Per key it keeps
//   - the claims holding it (Reserve, until Forget), so two claims never use one identity or
//     address, even before the cache shows the other's record;
//   - its last request (a registration or a release): whose, its attempt time, whether it is
//     out or answered, and until when it is busy. While a request is out, or an unanswered one
//     may still be carried out, no other goes under the key: the IPAM-API does not serialise
//     them, simultaneous first registrations of one identity each allocate an address, and a
//     release carried out late frees what was registered since.
//
// Across processes, the attempt time on the claim's record guards a request: one this
// process did not see answered is waited out from it (Wait). Releases are
// recorded nowhere: a claim this process did not see live may have had one sent by the
// process before it, waited out for the first quarantine (MayStillBeReleasing).
type InFlight struct {
	// Reader tells whether a claim still exists.
	Reader client.Reader
	// Quarantine is how long a request without an answer may still complete.
	Quarantine time.Duration
	// Clock is the wall clock of attempt times, recorded on claims for any process; nil: the host's.
	Clock clock.PassiveClock
	// Monotonic times the waits; nil: the host's monotonic clock.
	Monotonic clock.PassiveClock

	mu      sync.Mutex
	slots   map[string]*slot
	byClaim map[types.UID][]string // the keys each claim holds
	// pruneAbove is how many slots are kept before dead ones are pruned: twice what the last
	// pruning left, at least minPruneAbove, so a burst prunes once per doubling, not per request.
	pruneAbove int
	origin     time.Time
	// alive is the claims seen live (SawAlive) in the first quarantine after the table was
	// first used; nil after it.
	alive map[types.UID]struct{}
}

// minPruneAbove is the fewest slots kept before old ones are pruned.
const minPruneAbove = 4096

// Key kinds: an IPAM-API identity (Registration.Key) or an address in a zone (record.HostKey).
const (
	identityKey = "identity|"
	addressKey  = "address|"
)

type slot struct {
	holders []holder
	host    string // the IPAM-API host, for metrics
	// The last request under the key, or the earlier attempt a claim met on its record.
	by            types.UID
	attempt       time.Time
	out, answered bool
	// until is when (monotonic) an unanswered request can no longer be carried out; an
	// answered one is remembered while a claim holds the key.
	until time.Duration
}

// busy reports whether a request under the key is out or may still be carried out.
func (s *slot) busy(mono time.Duration) bool { return s.out || !s.answered && s.until > mono }

// left is how long the key stays busy (0: it is not).
func (s *slot) left(mono time.Duration) time.Duration {
	if !s.busy(mono) {
		return 0
	}
	return s.until - mono
}

type holder struct {
	uid  types.UID
	name types.NamespacedName
	// address is an identity holder's address; share an address holder's share key.
	address, share string
	exclusive      bool
}

func (r holder) conflicts(address, share string, exclusive bool) bool {
	if exclusive {
		return share == "" || r.share != share
	}
	return HoldersConflict(address, r.address)
}

// HoldersConflict reports whether two registrations of one identity may not coexist: without
// an address the IPAM-API answers both with the same one, and with the same address releasing
// one frees the other's. Different explicit addresses (a Service moving) may coexist.
func HoldersConflict(a, b string) bool { return a == "" || b == "" || a == b }

// Reserve claims an IPAM-API identity key (with the claim's address, if any) for a claim. It
// fails, naming the other claim, when an existing claim holds a conflicting reservation,
// unless passes(other) (nil: none passes): the claim a Service's new claim supersedes, whose
// registration it takes over. Requests of the two never overlap all the same: Register
// sends nothing while one of the identity is busy.
func (f *InFlight) Reserve(ctx context.Context, key, address string, claim client.Object, passes func(other *ipamv1.IPAddressClaim) bool) (string, bool) {
	return f.reserve(ctx, identityKey+key, holder{address: address}, claim, passes)
}

// ReserveAddress claims an address (a record.HostKey) for a claim about to register it: two
// claims of this process never register one address at once unless both declare one share key.
func (f *InFlight) ReserveAddress(ctx context.Context, hostKey, share string, claim client.Object) (string, bool) {
	return f.reserve(ctx, addressKey+hostKey, holder{share: share, exclusive: true}, claim, nil)
}

func (f *InFlight) reserve(ctx context.Context, key string, mine holder, claim client.Object, passes func(*ipamv1.IPAddressClaim) bool) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.slot(key, "")
	kept := s.holders[:0]
	conflict := ""
	for _, other := range s.holders {
		if other.uid == claim.GetUID() {
			continue
		}
		c := &ipamv1.IPAddressClaim{}
		err := f.Reader.Get(ctx, other.name, c)
		if err != nil && apierrors.IsNotFound(err) || err == nil && c.UID != other.uid {
			// Gone: forget it.
			if f.byClaim[other.uid] = slices.DeleteFunc(f.byClaim[other.uid], func(k string) bool { return k == key }); len(f.byClaim[other.uid]) == 0 {
				delete(f.byClaim, other.uid)
			}
			continue
		}
		kept = append(kept, other)
		if other.conflicts(mine.address, mine.share, mine.exclusive) && (passes == nil || !passes(c)) {
			conflict = other.name.String()
		}
	}
	if conflict == "" {
		mine.uid, mine.name = claim.GetUID(), client.ObjectKeyFromObject(claim)
		kept = append(kept, mine)
		if f.byClaim == nil {
			f.byClaim = map[types.UID][]string{}
		}
		if !slices.Contains(f.byClaim[mine.uid], key) {
			f.byClaim[mine.uid] = append(f.byClaim[mine.uid], key)
		}
	}
	s.holders = kept
	return conflict, conflict == ""
}

// Forget drops what this process knows about a claim: what it holds, and the answers it
// saw once their request's quarantine is over. A request of the claim that may still be
// carried out keeps its key busy.
func (f *InFlight) Forget(uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	mono := f.monotonic()
	for _, key := range f.byClaim[uid] {
		s := f.slots[key]
		if s == nil {
			continue // pruned after another claim found this one gone
		}
		s.holders = slices.DeleteFunc(s.holders, func(h holder) bool { return h.uid == uid })
		switch {
		case s.busy(mono):
		case s.answered && s.until > mono:
			// An answer seen lately is kept until the request's quarantine would have ended
			// (pruned after): the claim's release, or a request sent again, waits for nothing.
		case len(s.holders) == 0:
			delete(f.slots, key)
		case s.by == uid:
			s.by, s.attempt, s.answered, s.until = "", time.Time{}, false, 0
		}
	}
	delete(f.byClaim, uid)
	// Empty maps are dropped: a Go map keeps the room a burst grew it to.
	if len(f.byClaim) == 0 {
		f.byClaim = nil
	}
	if len(f.slots) == 0 {
		f.slots, f.pruneAbove = nil, 0
	}
}

// slot is the key's slot, made if need be; endpoint, if known, names its host. Callers hold mu.
func (f *InFlight) slot(key, endpoint string) *slot {
	s, ok := f.slots[key]
	if !ok {
		if f.slots == nil {
			f.slots = map[string]*slot{}
		}
		if len(f.slots) > max(f.pruneAbove, minPruneAbove) {
			f.prune()
		}
		s = &slot{}
		f.slots[key] = s
	}
	if endpoint != "" {
		s.host = metrics.Host(endpoint)
	}
	return s
}

// prune drops the slots that tell nothing any more: no claim holds them, and their
// request is over and its answer old. Callers hold mu.
func (f *InFlight) prune() {
	mono := f.monotonic()
	for key, s := range f.slots {
		if len(s.holders) == 0 && !s.out && s.until <= mono {
			delete(f.slots, key)
		}
	}
	f.pruneAbove = 2 * len(f.slots)
}

// Register sends req, a registration under reg by the claim (or pool) uid, unless another
// request under its identity or address is busy: then it fails at once with a transient error,
// sending nothing. A request without an answer keeps both keys busy for the quarantine.
func (f *InFlight) Register(ctx context.Context, api ipamapi.Client, uid types.UID, reg *record.Registration, req ipamapi.Request) (*ipamapi.Response, error) {
	return f.send(ctx, "register", uid, reg, req, api.Register)
}

// Release sends req, a release under reg by the claim uid, as Register sends a registration: a
// release carried out late would free an address registered again meanwhile.
func (f *InFlight) Release(ctx context.Context, api ipamapi.Client, uid types.UID, reg *record.Registration, req ipamapi.Request) (*ipamapi.Response, error) {
	return f.send(ctx, "release", uid, reg, req, api.Release)
}

func (f *InFlight) send(ctx context.Context, op string, uid types.UID, reg *record.Registration, req ipamapi.Request,
	call func(context.Context, ipamapi.Request) (*ipamapi.Response, error)) (*ipamapi.Response, error) {
	keys := keysOf(reg, req.Address)
	f.mu.Lock()
	mono := f.monotonic()
	for _, key := range keys {
		if s := f.slots[key]; s != nil && s.busy(mono) {
			msg := "an earlier request for this identity or address is still in flight"
			if !s.out {
				msg = "an earlier request for this identity or address ended without an answer; waiting until " +
					f.Now().Add(s.left(mono)).UTC().Format(time.RFC3339) + " before sending another"
			}
			f.mu.Unlock()
			return nil, &ipamapi.Error{Op: op, Class: ipamapi.ClassTransient, Message: msg, NotSent: true}
		}
	}
	for _, key := range keys {
		s := f.slot(key, reg.Endpoint)
		s.by, s.attempt, s.out, s.answered, s.until = uid, reg.Attempt, true, false, mono+f.Quarantine
	}
	f.mu.Unlock()

	lost := true // a call that panics counts as one whose answer was lost
	defer func() { f.ended(keys, lost) }()
	res, err := call(ctx, req)
	var e *ipamapi.Error
	lost = errors.As(err, &e) && e.Unknown
	return res, err
}

// keysOf is the keys of a registration request under reg for address.
func keysOf(reg *record.Registration, address string) []string {
	keys := []string{identityKey + reg.Key()}
	if address != "" {
		addr, err := ipamapi.CanonicalCIDR(address)
		if err != nil {
			addr = address
		}
		keys = append(keys, addressKey+record.HostKey(reg.Endpoint, reg.Zone, addr))
	}
	return keys
}

// ended records the end of a request under keys: answered (remembered for a quarantine, so
// that a release or a request sent again under its attempt waits for nothing; pruned after),
// or lost (busy for a quarantine).
func (f *InFlight) ended(keys []string, lost bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	mono := f.monotonic()
	for _, key := range keys {
		s := f.slots[key] // busy while out: neither Forget nor prune dropped it
		s.out, s.answered, s.until = false, !lost, mono+f.Quarantine
	}
}

// Now reads the wall clock of attempt times (and of claims' ages); waits for requests are
// timed on the monotonic clock.
func (f *InFlight) Now() time.Time {
	if f.Clock == nil {
		return time.Now()
	}
	return f.Clock.Now()
}

// AttemptTime is the time to record for a registration request sent now.
func (f *InFlight) AttemptTime() time.Time { return f.Now().UTC() }

// Wait reports for how long a request under reg's identity or address may still be
// carried out (0: none may): one this process sent that is out or got no answer, another's
// that is out, and, if recorded, the attempt recorded for the claim uid on reg, unless this
// process saw its answer (a record's attempt is not recorded for a claim whose IPAddress
// shows it answered). A release or a registration sent before such a request ends could be
// overtaken by it. The wait for a recorded attempt is decided once, when this process first
// meets the attempt's wall-clock time, then timed on the monotonic clock, so a jump of the
// wall clock neither stretches nor cuts it. An attempt time ahead of the clock is waited out
// for one quarantine: it was sent before now all the same.
func (f *InFlight) Wait(uid types.UID, reg *record.Registration, recorded bool) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	mono := f.monotonic()
	if recorded && !reg.Attempt.IsZero() {
		s := f.slot(identityKey+reg.Key(), reg.Endpoint)
		if (s.by != uid || !s.attempt.Equal(reg.Attempt)) && !s.busy(mono) {
			s.by, s.attempt, s.out, s.answered = uid, reg.Attempt, false, false
			s.until = mono + min(reg.Attempt.Add(f.Quarantine).Sub(f.Now()), f.Quarantine)
		}
	}
	left := time.Duration(0)
	for _, key := range keysOf(reg, reg.Address) {
		if s := f.slots[key]; s != nil {
			left = max(left, s.left(mono))
		}
	}
	return left
}

// SawAlive notes that this process saw the claim live (not being deleted): only this process
// can have sent a release for it since.
func (f *InFlight) SawAlive(uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.monotonic() >= f.Quarantine {
		f.alive = nil
		return
	}
	if f.alive == nil {
		f.alive = map[types.UID]struct{}{}
	}
	f.alive[uid] = struct{}{}
}

// MayStillBeReleasing reports for how long a release that an earlier process (the leader
// before this one) may have sent for a deleted claim may still be carried out (0: none may).
// Releases are recorded nowhere (a release costs no write). An earlier process sent nothing
// after this one first used the table, so, for a claim this process did not see live first,
// that is the first quarantine after it; claims seen live are this process's alone. The claims
// seen are kept for that quarantine only.
func (f *InFlight) MayStillBeReleasing(uid types.UID) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	mono := f.monotonic()
	if mono >= f.Quarantine {
		f.alive = nil
		return 0
	}
	if _, seen := f.alive[uid]; seen {
		return 0
	}
	return f.Quarantine - mono
}

// Pending counts, by IPAM-API host, the registrations out now and those quarantined, for metrics.
func (f *InFlight) Pending() map[string]metrics.Pending {
	f.mu.Lock()
	defer f.mu.Unlock()
	mono := f.monotonic()
	out := map[string]metrics.Pending{}
	for key, s := range f.slots {
		if !strings.HasPrefix(key, identityKey) || !s.busy(mono) {
			continue // the address of a registration is counted by its identity
		}
		p := out[s.host]
		if s.out {
			p.InFlight++
		} else {
			p.Quarantined++
		}
		out[s.host] = p
	}
	return out
}

// monotonic is the time since the first call, on the process's monotonic clock, which
// no change of the wall clock moves. Callers hold mu.
func (f *InFlight) monotonic() time.Duration {
	clk := OrHost(f.Monotonic)
	if f.origin.IsZero() {
		f.origin = clk.Now()
	}
	return clk.Since(f.origin)
}
