package controllers

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/pkg/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/subnet"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// candidatesPerReconcile bounds how many taken candidates one reconcile skips.
const candidatesPerReconcile = 16

// subnetState is what this process knows about subnet-mode pools beyond the cluster:
// candidates being registered, and addresses found held by someone else.
type subnetState struct {
	// recheck is how long a candidate found held by someone else is skipped before it
	// is tried again: its holder may let it go (a released address stays held until the
	// IPAM-API's sweeper frees it).
	recheck time.Duration
	mu      sync.Mutex
	picked  map[string]map[netip.Addr]types.UID // pool -> candidate -> claim
	takenAt map[string]map[netip.Addr]time.Time // pool -> address -> when found taken
}

// forget drops a claim's picks.
func (s *subnetState) forget(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.picked {
		for a, u := range m {
			if u == uid {
				delete(m, a)
			}
		}
	}
}

func (s *subnetState) markTaken(pool string, a netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.takenAt == nil {
		s.takenAt = map[string]map[netip.Addr]time.Time{}
	}
	if s.takenAt[pool] == nil {
		s.takenAt[pool] = map[netip.Addr]time.Time{}
	}
	s.takenAt[pool][a] = time.Now()
}

// next picks, atomically, the lowest usable address that is not used, not picked by
// another claim and not found taken lately.
func (s *subnetState) next(plan *subnet.Plan, key string, uid types.UID, used map[netip.Addr]bool) (netip.Addr, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cand, ok := plan.Next(func(a netip.Addr) bool {
		if used[a] {
			return true
		}
		if u, ok := s.picked[key][a]; ok && u != uid {
			return true
		}
		t, ok := s.takenAt[key][a]
		return ok && time.Since(t) < s.recheck
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

// takenCount is the number of addresses of a plan found taken lately.
func (s *subnetState) takenCount(key string, plan *subnet.Plan) int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := int32(0)
	for a, t := range s.takenAt[key] {
		if plan.Usable(a) && time.Since(t) < s.recheck {
			n++
		}
	}
	return n
}

// subnetKey scopes picks and taken addresses to an IPAM-API zone (pools whose subnets
// overlap see each other's picks).
func subnetKey(endpoint, zone string) string {
	return ipamapi.NormalizeEndpoint(endpoint) + "|" + zone
}

// allocateInSubnet registers a host address of the pool's subnet for the claim: the
// address the user asked for, or candidates picked in order, each recorded on the
// claim before it is sent. A candidate someone else holds is skipped; one another
// holder of the same secret holds ("updated" on the first attempt) is given back.
func (h *ClaimHandler) allocateInSubnet(ctx context.Context, address *ipamv1.IPAddress, reg *registration) error {
	spec := h.pool.PoolSpec()
	plan, err := subnet.New(spec.Subnet, spec.Gateway, spec.ExcludedAddresses)
	if err != nil {
		return h.fail(ipamv1.IPAddressClaimReadyPoolNotReadyReason, err.Error()+"; fix the pool's spec.subnet", "", reconcile.TerminalError(err))
	}
	if reg.Address != "" && !reg.Candidate {
		if a, err := ipamapi.ParseHost(reg.Address); err != nil || !plan.Usable(a) {
			return h.failWith(&claimError{reason: ipamv1.IPAddressClaimReadyAllocationFailedReason, event: ipamv1alpha1.ClaimReadyInvalidAnnotationReason,
				terminal: true, msg: fmt.Sprintf("annotation %s: %s is not a usable address of subnet %s (network, broadcast, gateway and excluded addresses are not)",
					ipamv1alpha1.AddressesAnnotation, reg.Address, spec.Subnet)})
		}
	}
	api, secret, err := h.connect(ctx, reg, true)
	if err != nil {
		return err
	}
	key := subnetKey(reg.Endpoint, reg.Zone)
	if reg.Declined {
		if err := h.decline(ctx, api, secret, reg, key); err != nil {
			return err
		}
	}

	for range candidatesPerReconcile {
		if reg.Address == "" {
			cand, ok, err := h.pickCandidate(ctx, plan, key)
			if err != nil {
				return err
			}
			if !ok {
				if err := h.setRecordIfAny(ctx, reg); err != nil {
					return err
				}
				msg := fmt.Sprintf("subnet %s of %s %s has no free address: every usable address is in use, excluded or held "+
					"elsewhere; the claim binds when one frees up", spec.Subnet, h.claim.Spec.PoolRef.Kind, h.pool.GetName())
				return h.fail(ipamv1.IPAddressClaimReadyPoolExhaustedReason, msg, "", errors.New(msg))
			}
			reg.Address, reg.Candidate, reg.Attempt = netip.PrefixFrom(cand, cand.BitLen()).String(), true, time.Time{}
		}
		if err := h.checkIdentityFree(ctx, reg); err != nil {
			return err
		}
		if until, waiting := h.mayStillBeInFlight(h.claim.UID, reg.Attempt); waiting {
			msg := fmt.Sprintf("an earlier registration of %s may still be in flight in the IPAM-API; the next is sent after %s",
				reg.Address, until.UTC().Format(time.RFC3339))
			h.setReady(metav1.ConditionFalse, ipamv1.IPAddressClaimReadyAllocationFailedReason, msg)
			h.wakeAt(h.claim, until)
			return errors.New(msg)
		}
		firstAttempt := reg.Attempt.IsZero()
		reg.Attempt = time.Now().UTC()
		if err := h.writeRecord(ctx, reg); err != nil {
			return err
		}
		res, err := api.Register(ctx, reg.request(secret))
		if answered(err) {
			h.sawAnswer(h.claim.UID, reg.Attempt)
		}
		cand, _ := ipamapi.ParseHost(reg.Address)
		switch {
		case err == nil && res.Updated() && firstAttempt && reg.Candidate:
			// Another holder of the same secret has it: two nodes must never share an
			// address. Give this claim's hold back and take the next candidate.
			if err := h.decline(ctx, api, secret, reg, key); err != nil {
				return err
			}
		case err == nil:
			// The pick stays until the IPAddress is in the cache (see bound), so no other
			// claim of this process picks the address meanwhile.
			return h.registered(ctx, address, reg, res)
		case ipamapi.ClassOf(err) == ipamapi.ClassWrongSecret && reg.Candidate:
			h.subnets.markTaken(key, cand)
			reg.Address, reg.Attempt = "", time.Time{}
		default:
			if !unknownOutcome(err) && provesNothingHeld(err) {
				if cerr := h.clearRecord(ctx); cerr != nil {
					return cerr
				}
				h.forgetPicks()
			}
			return h.registerFailed(reg, err)
		}
	}
	if err := h.setRecordIfAny(ctx, reg); err != nil {
		return err
	}
	msg := fmt.Sprintf("the first %d candidates of subnet %s were held elsewhere; trying the next ones", candidatesPerReconcile, spec.Subnet)
	return h.fail(ipamv1.IPAddressClaimReadyAllocationFailedReason, msg, "", errors.New(msg))
}

// decline releases this claim's hold on a candidate someone else holds, and moves on.
func (h *ClaimHandler) decline(ctx context.Context, api ipamapi.Client, secret ipamapi.Secret, reg *registration, key string) error {
	if !reg.Declined {
		// Saved before the release: after a restart it is given back, never accepted.
		reg.Declined = true
		if err := h.writeRecord(ctx, reg); err != nil {
			return err
		}
	}
	req := reg.request(secret)
	req.RetentionPeriodDays = 0
	if _, err := api.Release(ctx, req); err != nil && !ipamapi.IsNotHeld(err) {
		return h.registerFailed(reg, err) // the next reconcile gives it back before anything else
	}
	cand, _ := ipamapi.ParseHost(reg.Address)
	h.subnets.markTaken(key, cand)
	reg.Address, reg.Attempt, reg.Declined = "", time.Time{}, false
	return nil
}

// pickCandidate returns the lowest usable address of the subnet that no IPAddress of
// the pool has, no other claim of the pool has recorded, and that is not known to be
// held elsewhere.
func (h *ClaimHandler) pickCandidate(ctx context.Context, plan *subnet.Plan, key string) (netip.Addr, bool, error) {
	kind := h.claim.Spec.PoolRef.Kind
	opts := func(index string) []client.ListOption {
		o := []client.ListOption{client.MatchingFields{index: PoolRefValue(kind, h.pool.GetName())}}
		if h.pool.GetNamespace() != "" {
			o = append(o, client.InNamespace(h.pool.GetNamespace()))
		}
		return o
	}
	used := map[netip.Addr]bool{}
	addrs := &ipamv1.IPAddressList{}
	if err := h.Client.List(ctx, addrs, opts(AddressPoolRefIndex)...); err != nil {
		return netip.Addr{}, false, errors.Wrap(err, "listing the pool's IPAddresses")
	}
	for _, a := range addrs.Items {
		if ip, err := netip.ParseAddr(a.Spec.Address); err == nil {
			used[ip] = true
		}
	}
	claims := &ipamv1.IPAddressClaimList{}
	if err := h.Client.List(ctx, claims, opts(ClaimPoolRefIndex)...); err != nil {
		return netip.Addr{}, false, errors.Wrap(err, "listing the pool's claims")
	}
	for _, c := range claims.Items {
		if rec, _ := claimRecord(c.Annotations); c.UID != h.claim.UID && rec != nil && rec.Address != "" {
			if ip, err := ipamapi.ParseHost(rec.Address); err == nil {
				used[ip] = true
			}
		}
	}
	cand, ok := h.subnets.next(plan, key, h.claim.UID, used)
	return cand, ok, nil
}

func (h *ClaimHandler) forgetPicks() { h.subnets.forget(h.claim.UID) }

// setRecordIfAny saves the claim's record as it is now, or removes it when it names
// nothing any more, at once.
func (h *ClaimHandler) setRecordIfAny(ctx context.Context, reg *registration) error {
	if reg.Address == "" && !reg.Registered {
		return h.clearRecord(ctx)
	}
	return h.writeRecord(ctx, reg)
}

// subnetStatus fills a subnet-mode pool's status: size, addresses held elsewhere, and
// whether it is exhausted.
func (a *ProviderAdapter) subnetStatus(pool ipamv1alpha1.Pool, inUse int32) *metav1.Condition {
	spec, st := pool.PoolSpec(), pool.PoolStatus()
	if spec.Subnet == "" {
		st.SubnetSize, st.AddressesTakenElsewhere = nil, nil
		return nil
	}
	plan, err := subnet.New(spec.Subnet, spec.Gateway, spec.ExcludedAddresses)
	if err != nil {
		return nil
	}
	size := plan.Size()
	endpoint := spec.Endpoint
	if endpoint == "" {
		endpoint = a.Config.DefaultEndpoint
	}
	taken := a.subnets.takenCount(subnetKey(endpoint, spec.Zone), plan)
	st.SubnetSize, st.AddressesTakenElsewhere = &size, &taken
	c := &metav1.Condition{Type: ipamv1alpha1.PoolExhaustedCondition, Status: metav1.ConditionFalse, Reason: ipamv1alpha1.PoolNotExhaustedReason,
		Message: fmt.Sprintf("%d of %d addresses in use, %d held elsewhere", inUse, size, taken), ObservedGeneration: pool.GetGeneration()}
	if int64(inUse)+int64(taken) >= size {
		c.Status, c.Reason = metav1.ConditionTrue, ipamv1alpha1.PoolExhaustedReason
		c.Message = fmt.Sprintf("all %d usable addresses of subnet %s are in use (%d) or held elsewhere (%d): free some, "+
			"or widen the subnet or shrink excludedAddresses", size, spec.Subnet, inUse, taken)
	}
	return c
}
