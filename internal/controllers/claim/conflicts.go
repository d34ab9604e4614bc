package claim

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/pkg/errors"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
)

// checkIdentityFree refuses an identity another claim holds (registrar.HoldersConflict). Not
// terminal: the other holder may be pending, moving or going away.
func (h *Handler) checkIdentityFree(ctx context.Context, reg *record.Registration) *outcome {
	key := reg.Key()
	other := ""
	addrs := &ipamv1.IPAddressList{}
	if err := index.ListByRegistration(ctx, h.Client, addrs, key); err != nil {
		return stop(transient(errors.Wrap(err, "listing IPAddresses by registration")))
	}
	bound := map[types.UID]bool{} // claims whose IPAddress, not their pending record, speaks for them
	for _, a := range addrs.Items {
		owner := metav1.GetControllerOf(&a)
		if owner != nil {
			bound[owner.UID] = true
		}
		if !metav1.IsControlledBy(&a, h.claim) && registrar.HoldersConflict(reg.Address, a.Annotations[ipamv1alpha1.RegisteredAddressAnnotation]) &&
			(owner == nil || !h.supersedesNamed(ctx, a.Namespace, owner.Name)) {
			other = "IPAddress " + a.Namespace + "/" + a.Name
		}
	}
	claims := &ipamv1.IPAddressClaimList{}
	if err := index.ListByRegistration(ctx, h.Client, claims, key); err != nil {
		return stop(transient(errors.Wrap(err, "listing IPAddressClaims by registration")))
	}
	for _, c := range claims.Items {
		if rec, _ := record.OnClaim(c.Annotations); c.UID != h.claim.UID && !bound[c.UID] && rec != nil && registrar.HoldersConflict(reg.Address, rec.Address) &&
			!supersedes(h.claim, &c) {
			other = "IPAddressClaim " + c.Namespace + "/" + c.Name
		}
	}
	if other == "" {
		passes := func(c *ipamv1.IPAddressClaim) bool { return supersedes(h.claim, c) }
		if holder, ok := h.InFlight.Reserve(ctx, key, reg.Address, h.claim, passes); !ok {
			other = "IPAddressClaim " + holder
		}
	}
	if other == "" {
		return nil
	}
	// Refused, the claim holds no reservation: the other may need none of it to go on (a
	// Service moved twice: its newest claim takes over, the one in between goes).
	h.forget()
	msg := fmt.Sprintf("the IPAM-API identity (service_name %q, namespace_id %q, cluster_id %q) is already used by %s; "+
		"give this claim a unique %s annotation", reg.Identity.ServiceName, reg.Identity.NamespaceID, reg.Identity.ClusterID,
		other, ipamv1alpha1.ServiceNameAnnotation)
	if owner := metav1.GetControllerOf(h.claim); owner != nil && owner.Kind == "Service" {
		msg = fmt.Sprintf("another claim of Service %s (%s) holds its IPAM-API identity with no address yet, or with the same "+
			"address; waiting until it is bound or released", owner.Name, other)
	}
	return stop(failed(ipamv1alpha1.ClaimReadyIdentityInUseReason, msg))
}

// holders lists the other claims that hold or are registering the address of hostKey.
func (h *Handler) holders(ctx context.Context, hostKey string) ([]*ipamv1.IPAddressClaim, error) {
	var names []client.ObjectKey
	addrs := &ipamv1.IPAddressList{}
	if err := index.ListByHost(ctx, h.Client, addrs, hostKey); err != nil {
		return nil, errors.Wrap(err, "listing IPAddresses by address")
	}
	for _, a := range addrs.Items {
		if owner := metav1.GetControllerOf(&a); owner != nil && owner.UID != h.claim.UID {
			names = append(names, client.ObjectKey{Namespace: a.Namespace, Name: owner.Name})
		}
	}
	claims := &ipamv1.IPAddressClaimList{}
	if err := index.ListByHost(ctx, h.Client, claims, hostKey); err != nil {
		return nil, errors.Wrap(err, "listing IPAddressClaims by address")
	}
	for _, c := range claims.Items {
		if c.UID != h.claim.UID && c.DeletionTimestamp.IsZero() {
			names = append(names, client.ObjectKeyFromObject(&c))
		}
	}
	slices.SortFunc(names, func(a, b client.ObjectKey) int { return strings.Compare(a.String(), b.String()) })
	names = slices.Compact(names)
	var out []*ipamv1.IPAddressClaim
	for _, n := range names {
		c := &ipamv1.IPAddressClaim{}
		if err := h.Client.Get(ctx, n, c); err != nil {
			if client.IgnoreNotFound(err) == nil {
				continue
			}
			return nil, errors.Wrap(err, "reading the claim that holds the address")
		}
		if !supersedes(h.claim, c) && !supersedes(c, h.claim) {
			out = append(out, c) // the two claims of a handover are no other holders
		}
	}
	return out, nil
}

// supersedes reports whether claim replaces other: their Service marked other superseded-by claim.
func supersedes(claim, other client.Object) bool {
	a, b := metav1.GetControllerOf(claim), metav1.GetControllerOf(other)
	return a != nil && b != nil && a.UID == b.UID && other.GetNamespace() == claim.GetNamespace() &&
		other.GetAnnotations()[ipamv1alpha1.SupersededByAnnotation] == claim.GetName()
}

// supersedesNamed is supersedes for the claim of that name (false if it cannot be read).
func (h *Handler) supersedesNamed(ctx context.Context, namespace, name string) bool {
	c := &ipamv1.IPAddressClaim{}
	return h.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, c) == nil && supersedes(h.claim, c)
}

// takeOver is the address a claim this one supersedes holds under the same identity and secret
// ("" if none): a Service moved to another pool keeps its address, and neither claim waits.
func (h *Handler) takeOver(ctx context.Context, reg *record.Registration) (string, error) {
	addrs := &ipamv1.IPAddressList{}
	if err := index.ListByRegistration(ctx, h.Client, addrs, reg.Key()); err != nil {
		return "", errors.Wrap(err, "listing IPAddresses by registration")
	}
	for _, a := range addrs.Items {
		if owner := metav1.GetControllerOf(&a); owner != nil && a.DeletionTimestamp.IsZero() && h.supersedesNamed(ctx, a.Namespace, owner.Name) {
			if rec, err := record.OnAddress(a.Labels, a.Annotations); err == nil && rec != nil && rec.Secret.Equal(reg.Secret) {
				return rec.Address, nil
			}
		}
	}
	return "", nil
}

// namedElsewhere names another live claim whose IPAddress, or whose record once sent,
// names reg's registration (identity, address and secret) ("" if none). Releasing it
// would free an address that claim is bound to or is registering: a Service moved to
// another pool and back before the move was done, whichever of its claims is superseded.
// The other claim releases it when it goes. Claims being deleted do not count: each of
// them releases, and the second is told "not held".
func (h *Handler) namedElsewhere(ctx context.Context, reg *record.Registration) (string, error) {
	same := func(r *record.Registration) bool {
		return r != nil && r.Key() == reg.Key() && r.HostKey() == reg.HostKey() && r.Secret.Equal(reg.Secret)
	}
	addrs := &ipamv1.IPAddressList{}
	if err := index.ListByRegistration(ctx, h.Client, addrs, reg.Key()); err != nil {
		return "", errors.Wrap(err, "listing IPAddresses by registration")
	}
	for _, a := range addrs.Items {
		owner := metav1.GetControllerOf(&a)
		if owner == nil || owner.UID == h.claim.UID || !a.DeletionTimestamp.IsZero() {
			continue
		}
		if rec, err := record.OnAddress(a.Labels, a.Annotations); err != nil || !same(rec) {
			continue
		}
		c := &ipamv1.IPAddressClaim{}
		if err := h.Client.Get(ctx, client.ObjectKey{Namespace: a.Namespace, Name: owner.Name}, c); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return "", errors.Wrap(err, "reading the claim of an IPAddress with the same registration")
		}
		if c.UID == owner.UID && c.DeletionTimestamp.IsZero() {
			return "IPAddressClaim " + c.Namespace + "/" + c.Name, nil
		}
	}
	claims := &ipamv1.IPAddressClaimList{}
	if err := index.ListByRegistration(ctx, h.Client, claims, reg.Key()); err != nil {
		return "", errors.Wrap(err, "listing IPAddressClaims by registration")
	}
	for _, c := range claims.Items {
		if c.UID == h.claim.UID || !c.DeletionTimestamp.IsZero() {
			continue
		}
		if rec, _ := record.OnClaim(c.Annotations); same(rec) && rec.Address != "" && (rec.Phase == record.PhaseRegistered || !rec.Attempt.IsZero()) {
			return "IPAddressClaim " + c.Namespace + "/" + c.Name, nil
		}
	}
	return "", nil
}

// checkShare refuses a requested address another claim holds unless both declare the same
// shareKey: otherwise one IP could end up on two node NICs, or any namespace could join any
// address under the default secret. Retried with back-off: the holder may let go.
func (h *Handler) checkShare(ctx context.Context, reg *record.Registration) *outcome {
	if reg.Address == "" || reg.Picked() {
		return nil
	}
	other, err := h.unconsenting(ctx, reg)
	if err != nil || other == nil {
		return outcomeOf(err)
	}
	return stop(failed(ipamv1alpha1.ClaimReadyAddressInUseReason, fmt.Sprintf("address %s in zone %s is bound to IPAddressClaim %s/%s; %s, "+
		"or request another address", reg.Address, reg.Zone, other.Namespace, other.Name, h.shareHint())))
}

// unconsenting is another claim, in the cluster or registering in this process now, that
// holds reg's address without this claim's share key (nil: none).
func (h *Handler) unconsenting(ctx context.Context, reg *record.Registration) (*ipamv1.IPAddressClaim, error) {
	others, err := h.holders(ctx, reg.HostKey())
	if err != nil {
		return nil, err
	}
	mine := shareKey(h.claim)
	if holder, ok := h.InFlight.ReserveAddress(ctx, reg.HostKey(), mine, h.claim); !ok {
		// Being registered by another claim here; its record may not be cached yet.
		ns, name, _ := strings.Cut(holder, "/")
		others = append(others, &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	}
	for _, other := range others {
		if mine == "" || shareKey(other) != mine {
			return other, nil
		}
	}
	return nil, nil
}

// shareHint says how two claims may share an address.
func (h *Handler) shareHint() string {
	if shareKey(h.claim) != "" {
		return fmt.Sprintf("it declares another share key (%s) or none", ipamv1alpha1.AllowLocalSharedIPAnnotation)
	}
	if _, empty := h.claim.Annotations[ipamv1alpha1.AllowLocalSharedIPAnnotation]; empty {
		return fmt.Sprintf("this claim's %s is empty, and an empty share key is no share key: to share it, give both claims "+
			"the same non-empty value", ipamv1alpha1.AllowLocalSharedIPAnnotation)
	}
	return fmt.Sprintf("to share it, give both claims the same %s annotation", ipamv1alpha1.AllowLocalSharedIPAnnotation)
}

// heldForUs is the outcome of an "updated" answer naming an address another claim holds without
// consent: the IPAM-API retained it for this identity while the other asked for it by name under
// the same secret. Never bound twice: this claim keeps its registration and binds it once freed.
func (h *Handler) heldForUs(ctx context.Context, reg *record.Registration) *outcome {
	other, err := h.unconsenting(ctx, reg)
	if err != nil || other == nil {
		return outcomeOf(err)
	}
	return stop(failed(ipamv1alpha1.ClaimReadyAddressInUseReason, fmt.Sprintf("the IPAM-API answered with %s, which it already held for "+
		"this claim's identity (kept for it after an earlier claim with this identity was released, say), but IPAddressClaim %s/%s "+
		"is bound to it; %s. This claim keeps the registration and binds %s once %s/%s lets it go", reg.Address, other.Namespace,
		other.Name, h.shareHint(), reg.Address, other.Namespace, other.Name)))
}

// outcomeOf is nil for no error, else the transient outcome.
func outcomeOf(err error) *outcome {
	if err == nil {
		return nil
	}
	return stop(transient(err))
}

// shared is a bound claim's AddressShared condition: who else holds its address, and consent.
func (h *Handler) shared(ctx context.Context, rec *record.Registration) (*metav1.Condition, error) {
	others, err := h.holders(ctx, rec.HostKey())
	if err != nil || len(others) == 0 {
		return nil, err
	}
	mine := shareKey(h.claim)
	var names, without []string
	for _, o := range others {
		names = append(names, o.Namespace+"/"+o.Name)
		if mine == "" || shareKey(o) != mine {
			without = append(without, o.Namespace+"/"+o.Name)
		}
	}
	if len(without) > 0 {
		return &metav1.Condition{Type: ipamv1alpha1.ClaimAddressSharedCondition, Status: metav1.ConditionTrue,
			Reason: ipamv1alpha1.ClaimAddressSharedWithoutConsentReason,
			Message: fmt.Sprintf("%s is also bound to IPAddressClaim %s without a share key in common (%s): one of them must "+
				"request another address", rec.Address, strings.Join(without, ", "), ipamv1alpha1.AllowLocalSharedIPAnnotation)}, nil
	}
	return &metav1.Condition{Type: ipamv1alpha1.ClaimAddressSharedCondition, Status: metav1.ConditionTrue, Reason: ipamv1alpha1.ClaimAddressSharedReason,
		Message: fmt.Sprintf("%s is shared with IPAddressClaim %s (share key in %s)", rec.Address, strings.Join(names, ", "),
			ipamv1alpha1.AllowLocalSharedIPAnnotation)}, nil
}
