package claim

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/pkg/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/subnet"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// subnetState is what this process knows of subnet-mode pools: addresses found held elsewhere
// (skipped for a while), and, from the cache's events, the addresses each pool's IPAddresses
// and claim records name, so a pick never lists the pool. A candidate being registered before
// its record is cached is held in the in-flight table (ReserveAddress).
type subnetState struct {
	recheck time.Duration
	clock   clock.PassiveClock // nil: the host's
	mu      sync.Mutex
	takenAt map[string]map[netip.Addr]time.Time // zone key -> address -> when found taken
	// used counts, per poolKey, the objects naming each address; named is what each one names.
	used  map[string]map[netip.Addr]int
	named map[types.UID]occupant
}

// occupant is the address an IPAddress or a claim's record names in a pool.
type occupant struct {
	pool string
	addr netip.Addr
}

// poolKey names a pool of a claim or an IPAddress in namespace ns.
func poolKey(ref ipamv1.IPPoolReference, ns string) string {
	if ref.Kind == ipamv1alpha1.GlobalVitistackIPPoolKind {
		ns = ""
	}
	return ns + "/" + index.PoolRefValue(ref.Kind, ref.Name)
}

// occupantOf is the address a claim's record or an IPAddress names in its pool.
func occupantOf(o client.Object) (occupant, bool) {
	switch x := o.(type) {
	case *ipamv1.IPAddress:
		a, err := netip.ParseAddr(x.Spec.Address)
		if err != nil || x.Spec.PoolRef.APIGroup != ipamv1alpha1.GroupVersion.Group {
			return occupant{}, false
		}
		return occupant{pool: poolKey(x.Spec.PoolRef, x.Namespace), addr: a}, true
	case *ipamv1.IPAddressClaim:
		rec, err := record.OnClaim(x.Annotations)
		if err != nil || rec == nil || rec.Address == "" || x.Spec.PoolRef.APIGroup != ipamv1alpha1.GroupVersion.Group {
			return occupant{}, false
		}
		a, err := ipamapi.ParseHost(rec.Address)
		if err != nil {
			return occupant{}, false
		}
		return occupant{pool: poolKey(x.Spec.PoolRef, x.Namespace), addr: a}, true
	}
	return occupant{}, false
}

// observe records what an object names now (gone: nothing any more).
func (s *subnetState) observe(o client.Object, gone bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	uid := o.GetUID()
	if old, ok := s.named[uid]; ok {
		if s.used[old.pool][old.addr]--; s.used[old.pool][old.addr] <= 0 {
			delete(s.used[old.pool], old.addr)
		}
		delete(s.named, uid)
	}
	occ, ok := occupantOf(o)
	if gone || !ok {
		return
	}
	if s.named == nil {
		s.named, s.used = map[types.UID]occupant{}, map[string]map[netip.Addr]int{}
	}
	if s.used[occ.pool] == nil {
		s.used[occ.pool] = map[netip.Addr]int{}
	}
	s.used[occ.pool][occ.addr]++
	s.named[uid] = occ
}

// occupancy keeps subnetState's view of the pools from the cache's events, O(1) each, and
// tells also of each object what the cache shows (gone: no longer there).
func (s *subnetState) occupancy(also func(o client.Object, gone bool)) handler.TypedEventHandler[client.Object, reconcile.Request] {
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			s.observe(e.Object, false)
			also(e.Object, false)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			s.observe(e.ObjectNew, false)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			s.observe(e.Object, true)
			also(e.Object, true)
		},
	}
}

// window is how long an address found taken is skipped (a minute unless configured).
func (s *subnetState) window() time.Duration {
	if s.recheck <= 0 {
		return time.Minute
	}
	return s.recheck
}

func (s *subnetState) markTaken(key string, a netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.takenAt == nil {
		s.takenAt = map[string]map[netip.Addr]time.Time{}
	}
	if s.takenAt[key] == nil {
		s.takenAt[key] = map[netip.Addr]time.Time{}
	}
	for b, t := range s.takenAt[key] { // prune what is no longer skipped
		if registrar.OrHost(s.clock).Since(t) >= s.window() {
			delete(s.takenAt[key], b)
		}
	}
	s.takenAt[key][a] = registrar.OrHost(s.clock).Now()
}

// next is the lowest usable address of the pool that no object names, that is not skipped
// and not found taken lately.
func (s *subnetState) next(plan *subnet.Plan, key, pool string, skip map[netip.Addr]bool) (netip.Addr, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	used := s.used[pool]
	return plan.Next(func(a netip.Addr) bool {
		t, taken := s.takenAt[key][a]
		return used[a] > 0 || skip[a] || taken && registrar.OrHost(s.clock).Since(t) < s.window()
	})
}

// subnetKey scopes taken addresses to an IPAM-API zone, across overlapping pools (as
// record.HostKey scopes the reservation of a candidate).
func subnetKey(endpoint, zone string) string {
	return ipamapi.NormalizeEndpoint(endpoint) + "|" + zone
}

// pick makes the lowest address of the subnet that nothing names, and no other claim
// of this process is registering, the claim's candidate; none left: PoolExhausted.
func (h *Handler) pick(ctx context.Context, plan *subnet.Plan, reg *record.Registration) *outcome {
	skip := map[netip.Addr]bool{} // reserved by another claim of this process just now
	for {
		cand, ok := h.subnets.next(plan, subnetKey(reg.Endpoint, reg.Zone), poolKey(h.claim.Spec.PoolRef, h.claim.Namespace), skip)
		if !ok {
			if err := h.setRecordIfAny(ctx, reg); err != nil {
				return stop(transient(err))
			}
			return stop(failed(ipamv1.IPAddressClaimReadyPoolExhaustedReason, fmt.Sprintf("subnet %s of %s %s has no free address: every "+
				"usable address is in use, excluded or held elsewhere; the claim binds when one frees up", h.pool.PoolSpec().Subnet,
				h.claim.Spec.PoolRef.Kind, h.pool.GetName())))
		}
		reg.Address, reg.Phase, reg.Attempt = netip.PrefixFrom(cand, cand.BitLen()).String(), record.PhaseCandidate, time.Time{}
		// Another claim of this process may be registering it, its record not cached yet.
		if _, ok := h.InFlight.ReserveAddress(ctx, reg.HostKey(), "", h.claim); ok {
			return nil
		}
		skip[cand], reg.Address = true, ""
	}
}

// decline gives back a candidate someone else holds, then skips it. The Declining phase is
// recorded first, with the give-back's attempt time, as a registration is: after a restart
// the candidate is given back, never taken, and a give-back whose answer this process did
// not see (an earlier manager's) is waited out before it is sent again. Carried out late,
// it would free the address should this claim, or one made again under its name (the same
// identity), register it meanwhile.
func (h *Handler) decline(ctx context.Context, api ipamapi.Client, sec *registrar.Secret, reg *record.Registration) outcome {
	if reg.Phase == record.PhaseDeclining {
		if left := h.InFlight.Wait(h.claim.UID, reg, true); left > 0 {
			return failed(ipamv1.IPAddressClaimReadyAllocationFailedReason, fmt.Sprintf("giving back %s, which someone else holds: "+
				"an earlier give-back may still be carried out in the IPAM-API; sent again after %s", reg.Address, h.after(left))).retryIn(left)
		}
	}
	reg.Phase, reg.Attempt = record.PhaseDeclining, h.InFlight.AttemptTime()
	if err := h.writeRecord(ctx, reg); err != nil {
		return transient(err)
	}
	// Given back with the claim's retention: a hold this identity had retained from an
	// earlier claim of the same name stays retained (subnet mode does not return retained
	// addresses: an "updated" candidate cannot tell that hold from someone else's), and is
	// free once the retention ends.
	req := reg.Request(sec.Value)
	if _, err := h.InFlight.Release(ctx, api, h.claim.UID, reg, req); err != nil && !ipamapi.IsNotHeld(err) {
		return failed(ipamv1.IPAddressClaimReadyAllocationFailedReason, fmt.Sprintf("giving back %s, which someone else holds, failed: %v; "+
			"retrying with back-off", reg.Address, err))
	}
	return h.skip(ctx, reg)
}

// skip drops a candidate held elsewhere from the record, and, for the subnet recheck window,
// from what any claim of the zone may pick; the claim comes back at once for the next.
// So each address of a zone is tried at most once per window, whatever the number of
// claims; once none is left to try, the claim says PoolExhausted and backs off. The claim
// holds nothing of the candidate any more: after the window any claim may pick it, and a
// claim may ask for it by name.
func (h *Handler) skip(ctx context.Context, reg *record.Registration) outcome {
	taken := reg.Address
	if a, err := ipamapi.ParseHost(taken); err == nil {
		h.subnets.markTaken(subnetKey(reg.Endpoint, reg.Zone), a)
	}
	// The record stays, without an address: it keeps the Secret protected for the next.
	reg.Address, reg.Phase, reg.Attempt = "", record.PhasePending, time.Time{}
	if err := h.writeRecord(ctx, reg); err != nil {
		return transient(err)
	}
	h.forget()
	return transient(errors.Errorf("%s is held elsewhere in zone %s; the next address is tried", taken, reg.Zone)).retryIn(time.Millisecond)
}

// setRecordIfAny writes the claim's record now, or removes it when it names nothing.
func (h *Handler) setRecordIfAny(ctx context.Context, reg *record.Registration) error {
	if reg.Address == "" && reg.Phase != record.PhaseRegistered {
		if _, ok := h.claim.Annotations[ipamv1alpha1.RegistrationAnnotation]; !ok {
			return nil
		}
		return h.writeRecord(ctx, nil)
	}
	return h.writeRecord(ctx, reg)
}
