package claim

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
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

// candidatesPerReconcile bounds how many taken candidates one reconcile skips.
const candidatesPerReconcile = 16

// subnetState is what this process knows of subnet-mode pools: candidates being registered,
// addresses found held elsewhere (skipped for a while), and, from the cache's events, the
// addresses each pool's IPAddresses and claim records name, so a pick never lists the pool.
type subnetState struct {
	recheck time.Duration
	mu      sync.Mutex
	picked  map[string]map[netip.Addr]types.UID // zone key -> candidate -> claim
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

// occupancy keeps subnetState's view of the pools from the cache's events: O(1) each.
func (s *subnetState) occupancy() handler.TypedEventHandler[client.Object, reconcile.Request] {
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			s.observe(e.Object, false)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			s.observe(e.ObjectNew, false)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			s.observe(e.Object, true)
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

// forget drops a claim's picks.
func (s *subnetState) forget(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, m := range s.picked {
		for a, u := range m {
			if u == uid {
				delete(m, a)
			}
		}
		if len(m) == 0 {
			delete(s.picked, key)
		}
	}
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
		if time.Since(t) >= s.window() {
			delete(s.takenAt[key], b)
		}
	}
	s.takenAt[key][a] = time.Now()
}

// next picks, atomically, the lowest usable address of the pool that no object names,
// that is not skipped, not picked by another claim and not found taken lately.
func (s *subnetState) next(plan *subnet.Plan, key, pool string, uid types.UID, skip map[netip.Addr]bool) (netip.Addr, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	used := s.used[pool]
	cand, ok := plan.Next(func(a netip.Addr) bool {
		if used[a] > 0 || skip[a] {
			return true
		}
		if u, ok := s.picked[key][a]; ok && u != uid {
			return true
		}
		t, ok := s.takenAt[key][a]
		return ok && time.Since(t) < s.window()
	})
	if ok {
		if s.picked == nil {
			s.picked = map[string]map[netip.Addr]types.UID{}
		}
		if s.picked[key] == nil {
			s.picked[key] = map[netip.Addr]types.UID{}
		}
		s.picked[key][cand] = uid
	}
	return cand, ok
}

// subnetKey scopes picks and taken addresses to an IPAM-API zone, across overlapping pools.
func subnetKey(endpoint, zone string) string {
	return ipamapi.NormalizeEndpoint(endpoint) + "|" + zone
}

// allocateInSubnet registers a host address of the pool's subnet: the one the user asked for,
// or candidates picked in order, each recorded on the claim before it is sent. A candidate
// someone else holds is skipped; only one the IPAM-API registered anew is bound.
func (h *Handler) allocateInSubnet(ctx context.Context, address *ipamv1.IPAddress, reg *record.Registration) outcome {
	spec := h.pool.PoolSpec()
	plan, err := subnet.New(spec.Subnet, spec.Gateway, spec.ExcludedAddresses)
	if err != nil {
		return failed(ipamv1.IPAddressClaimReadyPoolNotReadyReason, err.Error()+"; fix the pool's spec.subnet").final()
	}
	if reg.Address != "" && !reg.Candidate {
		if a, err := ipamapi.ParseHost(reg.Address); err != nil || !plan.Usable(a) {
			return asOutcome(invalidAnnotation(ipamv1alpha1.AddressesAnnotation, "%s is not a usable address of subnet %s "+
				"(network, broadcast, gateway and excluded addresses are not)", reg.Address, spec.Subnet))
		}
		if o := h.checkShare(ctx, reg); o != nil {
			return *o
		}
	}
	api, sec, o := h.connect(ctx, reg)
	if o != nil {
		return *o
	}
	key := subnetKey(reg.Endpoint, reg.Zone)
	if reg.Declined {
		if o := h.decline(ctx, api, sec, reg, key); o != nil {
			return *o
		}
	}

	skip := map[netip.Addr]bool{} // reserved by another claim of this process just now
	for range candidatesPerReconcile {
		if reg.Address == "" {
			cand, ok := h.pickCandidate(plan, key, skip)
			if !ok {
				if err := h.setRecordIfAny(ctx, reg); err != nil {
					return transient(err)
				}
				return failed(ipamv1.IPAddressClaimReadyPoolExhaustedReason, fmt.Sprintf("subnet %s of %s %s has no free address: every usable "+
					"address is in use, excluded or held elsewhere; the claim binds when one frees up", spec.Subnet, h.claim.Spec.PoolRef.Kind, h.pool.GetName()))
			}
			reg.Address, reg.Candidate, reg.Attempt = netip.PrefixFrom(cand, cand.BitLen()).String(), true, time.Time{}
			// Another claim of this process may be registering it, its record not cached yet.
			if _, ok := h.InFlight.ReserveAddress(ctx, reg.HostKey(), "", h.claim); !ok {
				skip[cand], reg.Address = true, ""
				continue
			}
		}
		if o := h.checkIdentityFree(ctx, reg); o != nil {
			return *o
		}
		if left := h.mayStillBeInFlight(reg); left > 0 {
			return failed(ipamv1.IPAddressClaimReadyAllocationFailedReason, fmt.Sprintf("an earlier registration of %s may still be in "+
				"flight in the IPAM-API; the next is sent after %s", reg.Address, h.after(left))).retryIn(left)
		}
		s, stop := h.send(ctx, api, sec, reg)
		if stop != nil {
			return *stop
		}
		res, err, firstAttempt := s.res, s.err, s.firstAttempt
		cand, _ := ipamapi.ParseHost(reg.Address)
		switch {
		case err == nil && res.Updated() && reg.Candidate && !h.wasBound():
			// Held already, by another holder of the same secret or by this claim after a lost
			// answer; nothing tells which. Two nodes must never share an address: give it back (a
			// lost answer costs a candidate), unless this claim was bound to it (IPAddress lost).
			if o := h.decline(ctx, api, sec, reg, key); o != nil {
				return *o
			}
		case err == nil:
			// The pick stays until the IPAddress is in the cache (see bound).
			return h.registered(ctx, address, reg, res)
		case ipamapi.ClassOf(err) == ipamapi.ClassWrongSecret && reg.Candidate:
			h.subnets.markTaken(key, cand)
			reg.Address, reg.Attempt = "", time.Time{}
		case ipamapi.ClassOf(err) == ipamapi.ClassNotInZone && reg.Candidate:
			// A pool error, shown on the pool too.
			return h.refuse(ctx, failed(ipamv1alpha1.ClaimReadySubnetOutsideZoneReason, fmt.Sprintf("the IPAM-API says %s of subnet %s "+
				"is not in zone %s: the pool's subnet lies outside its zone; fix spec.subnet or spec.zone of %s %s", reg.Address, spec.Subnet,
				reg.Zone, h.claim.Spec.PoolRef.Kind, h.pool.GetName())), valueKey(reg.Secret, sec, nil), reg, true)
		default:
			return h.registerFailed(ctx, reg, sec, err, firstAttempt)
		}
	}
	if err := h.setRecordIfAny(ctx, reg); err != nil {
		return transient(err)
	}
	return failed(ipamv1.IPAddressClaimReadyAllocationFailedReason,
		fmt.Sprintf("the first %d candidates of subnet %s were held elsewhere; trying the next ones", candidatesPerReconcile, spec.Subnet))
}

// decline releases this claim's hold on a candidate someone else holds, and moves on.
func (h *Handler) decline(ctx context.Context, api ipamapi.Client, sec *registrar.Secret, reg *record.Registration, key string) *outcome {
	if !reg.Declined {
		// Saved before the release: after a restart it is given back, never accepted.
		reg.Declined = true
		if err := h.writeRecord(ctx, reg, nil); err != nil {
			o := transient(err)
			return &o
		}
	}
	req := reg.Request(sec.Value)
	req.RetentionPeriodDays = 0
	if _, err := api.Release(ctx, req); err != nil && !ipamapi.IsNotHeld(err) {
		// The record keeps Declined: the next reconcile gives it back before anything else.
		o := failed(ipamv1.IPAddressClaimReadyAllocationFailedReason, fmt.Sprintf("giving back %s, which someone else holds, failed: %v; "+
			"retrying with back-off", reg.Address, err))
		return &o
	}
	cand, _ := ipamapi.ParseHost(reg.Address)
	h.subnets.markTaken(key, cand)
	reg.Address, reg.Attempt, reg.Declined = "", time.Time{}, false
	return nil
}

// pickCandidate picks the claim's next candidate (subnetState.next).
func (h *Handler) pickCandidate(plan *subnet.Plan, key string, skip map[netip.Addr]bool) (netip.Addr, bool) {
	return h.subnets.next(plan, key, poolKey(h.claim.Spec.PoolRef, h.claim.Namespace), h.claim.UID, skip)
}

// setRecordIfAny writes the claim's record now, or removes it when it names nothing.
func (h *Handler) setRecordIfAny(ctx context.Context, reg *record.Registration) error {
	if reg.Address == "" && !reg.Registered {
		if _, ok := h.claim.Annotations[ipamv1alpha1.RegistrationAnnotation]; !ok {
			return nil
		}
		return h.writeRecord(ctx, nil, nil)
	}
	return h.writeRecord(ctx, reg, nil)
}
