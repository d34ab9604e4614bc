package claim

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// carry is what a bound claim's own annotations ask of its registered record; only they reach
// a bound address, never a changed pool or flag.
type carry struct {
	// want is the registered record with the claim's secret, retention and cleanup.
	want record.Registration
	// dropRefusal: the claim is back to the owning secret, so a refused rotation is moot.
	dropRefusal bool
	// rotate: another secret than the owner, and not the one whose rotation was refused.
	rotate bool
	// reregister: no rotation, but another retention or cleanup setting.
	reregister bool
}

// toCarry compares the claim's annotations with rec; cur is the claim's own record (nil: none).
// An unreadable annotation is an error: it never touches a bound address.
func (h *Handler) toCarry(rec, cur *record.Registration) (c carry, err error) {
	c.want = *rec
	if err := h.overrides(&c.want); err != nil {
		return carry{}, err
	}
	refused := ""
	if cur != nil {
		refused = cur.RotationRefused
	}
	sameSecret := c.want.Secret.Equal(rec.Secret)
	c.dropRefusal = sameSecret && refused != ""
	c.rotate = !sameSecret && c.want.Secret.String() != refused
	c.reregister = !c.rotate && (c.want.RetentionPeriodDays != rec.RetentionPeriodDays || c.want.DenyExternalCleanup != rec.DenyExternalCleanup)
	return c, nil
}

// ignored warns of what the claim's annotations ask that a bound claim cannot have: another
// address, or another IPAM-API identity. The claim keeps what it has; nothing is sent.
func (h *Handler) ignored(done outcome, rec *record.Registration) outcome {
	ann := h.claim.Annotations
	var asks []string
	if a, err := requested(ann, rec.Family); err == nil && a != "" && a != rec.Address {
		asks = append(asks, fmt.Sprintf("%s=%s", ipamv1alpha1.AddressesAnnotation, strings.TrimSpace(ann[ipamv1alpha1.AddressesAnnotation])))
	}
	for _, o := range []struct{ key, has string }{{ipamv1alpha1.ServiceNameAnnotation, rec.Identity.ServiceName},
		{ipamv1alpha1.NamespaceIDAnnotation, rec.Identity.NamespaceID}, {ipamv1alpha1.ClusterIDAnnotation, rec.Identity.ClusterID}} {
		if v := strings.TrimSpace(ann[o.key]); v != "" && v != o.has {
			asks = append(asks, fmt.Sprintf("%s=%s", o.key, v))
		}
	}
	if len(asks) == 0 {
		return done
	}
	return done.note(corev1.EventTypeWarning, ipamv1alpha1.EventAnnotationIgnoredReason, actionAllocate, fmt.Sprintf("the claim is bound to %s "+
		"under its IPAM-API identity, and keeps both: it ignores %s; delete the claim (and its machine) to get another",
		rec.Address, strings.Join(asks, ", ")))
}

// bound handles a claim whose IPAddress exists; the IPAddress's record is authoritative. The
// IPAM-API is asked again only to finish a recorded rotation or to carry the claim's changed
// secret, retention or cleanup, always with the bound address. Nothing changed: no call, no write.
func (h *Handler) bound(ctx context.Context, address *ipamv1.IPAddress) outcome {
	// One being deleted stays bound: ipamutil's ProtectAddress finalizer keeps it until the
	// claim goes.
	if !metav1.IsControlledBy(address, h.claim) {
		return failed(ipamv1.IPAddressClaimReadyAllocationFailedReason, fmt.Sprintf("IPAddress %s/%s exists but does not belong to this "+
			"claim; it is waited for", address.Namespace, address.Name))
	}
	rec, err := record.OnAddress(address.Labels, address.Annotations)
	if err != nil {
		return failed(ipamv1.IPAddressClaimReadyAllocationFailedReason, err.Error()).final()
	}
	// Counted as used before the pick is forgotten (the cache may lag): no other claim picks it.
	h.subnets.observe(address, false)
	h.forget()
	done := allocated(address.Spec.Address)
	if rec == nil {
		return done
	}
	cur, _ := record.OnClaim(h.claim.Annotations)
	if cur != nil && !cur.RotatingTo.IsZero() {
		if o, finished := h.finishRotation(ctx, address, rec, cur); !finished {
			return o
		}
	}
	if cond, err := h.shared(ctx, rec); err != nil {
		return transient(err)
	} else if cond != nil {
		done.set = append(done.set, *cond)
	} else {
		done.drop = append(done.drop, ipamv1alpha1.ClaimAddressSharedCondition)
	}

	// A value changed in place since registration: the address stays bound but is neither
	// released nor rotated until the value is back; the protector wakes the claim either way.
	switch changed, known := h.Secrets.Protected.Changed(rec.Secret); {
	case changed:
		o := failed(ipamv1alpha1.ClaimReadySecretValueChangedReason, fmt.Sprintf("the value of Secret %s/%s key %s changed after "+
			"address %s was registered under it: the address stays bound to this claim, but releasing or rotating it waits until the "+
			"previous value is restored (to move addresses to a new value, put it in a new Secret and point the claims at it)",
			rec.Secret.Namespace, rec.Secret.Name, rec.Secret.Key, address.Spec.Address))
		o.set, o.drop = done.set, done.drop
		return o.final()
	case !known && conditions.GetReason(h.claim, ipamv1.IPAddressClaimReadyCondition) == ipamv1alpha1.ClaimReadySecretValueChangedReason:
		done.ready = "" // as it was, until the protector has looked at the Secret
	}

	c, err := h.toCarry(rec, cur)
	if err != nil {
		// Said once per change of the claim (a bound claim is reconciled when it changes).
		return done.note(corev1.EventTypeWarning, ipamv1alpha1.ClaimReadyInvalidAnnotationReason, actionAllocate,
			err.Error()+"; the bound address keeps its registration until the annotation is fixed")
	}
	done = h.ignored(done, rec)
	if c.dropRefusal {
		if err := h.writeRecord(ctx, h.withRefusal(rec, "")); err != nil {
			return transient(err)
		}
		done.drop = append(done.drop, ipamv1alpha1.ClaimSecretRotatedCondition)
	}
	if c.rotate {
		return h.rotate(ctx, address, rec, &c.want, done)
	}
	if !c.reregister {
		return done
	}
	// Retention or cleanup changed: re-register with the owner's secret and the address.
	api, owner, o := h.owner(ctx, rec)
	if o != nil {
		return *o
	}
	req := rec.Request(owner.Value)
	req.RetentionPeriodDays, req.DenyExternalCleanup = c.want.RetentionPeriodDays, c.want.DenyExternalCleanup
	onClaim := h.withRefusal(rec, "")
	if now, _ := record.OnClaim(h.claim.Annotations); now != nil { // a refusal just dropped stays dropped
		onClaim.RotationRefused = now.RotationRefused
	}
	onClaim.RetentionPeriodDays, onClaim.DenyExternalCleanup = req.RetentionPeriodDays, req.DenyExternalCleanup
	if err := h.registerBound(ctx, api, rec, onClaim, req); err != nil {
		return transient(err)
	}
	rec.RetentionPeriodDays, rec.DenyExternalCleanup = c.want.RetentionPeriodDays, c.want.DenyExternalCleanup
	rec.WriteTo(address.Labels, address.Annotations) // the Reconciler patches the IPAddress
	return done
}

// unanswered is how long a request recorded on the claim (cur) whose answer the registered
// record (rec, with the attempt it shows answered) does not show may still be carried out (0:
// none may, or this process saw its answer): a bound claim's re-registration, rotation or
// question of who owns its address, after a crash or a lost answer. Nothing else is sent for
// the identity, and it is not released, before that ends: the IPAM-API does not serialise
// the requests of one identity, and a registration carried out after the release holds the
// address for good.
func (h *Handler) unanswered(cur, rec *record.Registration) time.Duration {
	if cur == nil || cur.Attempt.IsZero() || cur.Attempt.Equal(rec.Attempt) || cur.Key() != rec.Key() {
		return 0
	}
	return h.InFlight.Wait(h.claim.UID, cur, true)
}

// registerBound sends req, a request for the address a claim has registered (rec), recorded on
// the claim first as every registration request is: onClaim, with the attempt time (one write:
// these requests follow a user's change, or finish one). A recorded attempt without an answer on record is waited out first. Once answered (a refusal
// is an answer too), rec takes the attempt time: the IPAddress shows which request its record
// answers.
func (h *Handler) registerBound(ctx context.Context, api ipamapi.Client, rec, onClaim *record.Registration, req ipamapi.Request) error {
	cur, _ := record.OnClaim(h.claim.Annotations)
	if left := h.unanswered(cur, rec); left > 0 {
		return &ipamapi.Error{Op: "register", Class: ipamapi.ClassTransient, NotSent: true, Message: "an earlier request for " +
			rec.Address + " recorded on the claim may still be carried out in the IPAM-API; waiting until " + h.after(left)}
	}
	// Always a new attempt time, after the last: sent under the one the IPAddress shows
	// answered, a request whose answer is lost would look answered to the next process.
	onClaim.Attempt = h.InFlight.AttemptTime()
	for _, last := range []time.Time{rec.Attempt, attemptOf(cur)} {
		if !onClaim.Attempt.After(last) {
			onClaim.Attempt = last.Add(time.Nanosecond)
		}
	}
	if err := h.writeRecord(ctx, onClaim); err != nil {
		return err
	}
	_, err := h.InFlight.Register(ctx, api, h.claim.UID, onClaim, req)
	if e := (*ipamapi.Error)(nil); err == nil || errors.As(err, &e) && !e.Unknown && !e.NotSent {
		rec.Attempt = onClaim.Attempt // answered, if only with a refusal
	}
	return err
}

// attemptOf is the attempt time of a record (zero: none).
func attemptOf(r *record.Registration) time.Time {
	if r == nil {
		return time.Time{}
	}
	return r.Attempt
}

// withRefusal is rec as the claim's record, with the given refused rotation and no intent. It
// keeps the attempt time on the claim's record: that of the last request sent, whose answer
// rec may not show yet (see unanswered).
func (h *Handler) withRefusal(rec *record.Registration, refused string) *record.Registration {
	r := *rec
	r.RotatingTo, r.RotationRefused = record.ObjectRef{}, refused
	if cur, _ := record.OnClaim(h.claim.Annotations); cur != nil && cur.Key() == rec.Key() {
		r.Attempt = cur.Attempt
	}
	return &r
}

// owner reads the Secret that owns a registered address, refusing a value changed since.
func (h *Handler) owner(ctx context.Context, rec *record.Registration) (ipamapi.Client, *registrar.Secret, *outcome) {
	api, err := h.API(ctx, rec)
	if err != nil {
		return nil, nil, stop(transient(err))
	}
	sec, err := h.Secrets.Get(ctx, rec.Secret, false)
	if err != nil {
		return nil, nil, stop(transient(err))
	}
	switch {
	case sec.Changed():
		return nil, nil, stop(secretChanged(sec).retryIn(h.secretRecheck()))
	case !sec.Usable(true):
		return nil, nil, stop(transient(errors.Errorf("waiting for Secret %s/%s to be fingerprinted by the provider", sec.Ref.Namespace, sec.Ref.Name)))
	}
	return api, sec, nil
}

// rotate moves a bound address to a new secret (new_secret) as a recorded intent: written to
// the claim before the IPAM-API is asked; the IPAddress records the new owner once it says yes;
// the intent goes once the IPAddress shows it. After a crash or conflict at any step,
// finishRotation asks the IPAM-API who owns the address first.
func (h *Handler) rotate(ctx context.Context, address *ipamv1.IPAddress, rec, want *record.Registration, done outcome) outcome {
	// A refusal by the IPAM-API or a changed value is recorded (RotationRefused, no intent)
	// and not retried until the claim names another secret; a missing or invalid Secret
	// is not, so fixing it retries. One event per change of the condition.
	refusedRotation := func(msg string, remember bool) outcome {
		if remember {
			if err := h.writeRecord(ctx, h.withRefusal(rec, want.Secret.String())); err != nil {
				return transient(err)
			}
		}
		c := metav1.Condition{Type: ipamv1alpha1.ClaimSecretRotatedCondition, Status: metav1.ConditionFalse,
			Reason: ipamv1alpha1.ClaimSecretRotationRefusedReason, Message: msg}
		done.set = append(done.set, c)
		if prev := conditions.Get(h.claim, c.Type); prev != nil && prev.Status == c.Status && prev.Message == c.Message {
			return done
		}
		return done.note(corev1.EventTypeWarning, ipamv1alpha1.ClaimSecretRotationRefusedReason, actionRotate, msg)
	}
	next, err := h.Secrets.Get(ctx, want.Secret, true)
	if err != nil {
		var nf *registrar.SecretNotFoundError
		var inv *registrar.SecretInvalidError
		if errors.As(err, &nf) || errors.As(err, &inv) {
			return refusedRotation(fmt.Sprintf("cannot rotate %s to the secret %s: %v", rec.Address, want.Secret, err), false)
		}
		return transient(err)
	}
	if next.Changed() || next.Deleting {
		return refusedRotation(fmt.Sprintf("cannot rotate %s to the secret %s: it is being deleted, or its value changed after "+
			"addresses were registered under it", rec.Address, want.Secret), true)
	}
	api, old, o := h.owner(ctx, rec)
	if o != nil {
		return *o
	}
	// Before anything is asked or the new Secret is protected: written before a last read
	// (and write) of the Secret, as a registration's record is (two-phase letting go):
	// either that read sees the protector letting it go and takes it back, or the
	// protector sees the intent.
	intent := h.withRefusal(rec, "")
	intent.RotatingTo = want.Secret
	if cur, _ := record.OnClaim(h.claim.Annotations); cur == nil || !cur.RotatingTo.Equal(want.Secret) || !next.Usable(false) {
		if err := h.writeRecord(ctx, intent); err != nil {
			return transient(err)
		}
		again, err := h.Secrets.Protect(ctx, want.Secret)
		if err != nil {
			return transient(err)
		}
		if !again.Usable(false) || again.Value != next.Value {
			return transient(errors.Errorf("Secret %s/%s changed while it was being protected; reading it again before %s is rotated to it",
				next.Ref.Namespace, next.Ref.Name, rec.Address))
		}
	}
	req := rec.Request(old.Value)
	req.NewSecret = next.Value
	req.RetentionPeriodDays, req.DenyExternalCleanup = want.RetentionPeriodDays, want.DenyExternalCleanup
	if err := h.registerBound(ctx, api, rec, intent, req); err != nil {
		if ipamapi.ClassOf(err) == ipamapi.ClassRotationRefused {
			return refusedRotation(fmt.Sprintf("the IPAM-API refused to give %s the secret %s (%v): the address is shared by several "+
				"services or held by another, so it keeps the secret %s", rec.Address, want.Secret, err, rec.Secret), true)
		}
		return transient(err) // the intent stays: the next reconcile asks who owns it first
	}
	oldRef := rec.Secret
	rec.Secret = want.Secret
	rec.RetentionPeriodDays, rec.DenyExternalCleanup = want.RetentionPeriodDays, want.DenyExternalCleanup
	rec.WriteTo(address.Labels, address.Annotations)
	return h.rotated(done, rec, oldRef)
}

func (h *Handler) rotated(done outcome, rec *record.Registration, old record.ObjectRef) outcome {
	done.set = append(done.set, metav1.Condition{Type: ipamv1alpha1.ClaimSecretRotatedCondition, Status: metav1.ConditionTrue,
		Reason: ipamv1alpha1.ClaimSecretRotatedReason, Message: fmt.Sprintf("%s is owned by the secret %s", rec.Address, rec.Secret)})
	return done.note(corev1.EventTypeNormal, ipamv1alpha1.EventSecretRotatedReason, actionRotate, fmt.Sprintf("%s is now owned by the secret %s (was %s)", rec.Address, rec.Secret, old))
}

// finishRotation settles a recorded rotation intent before anything else (see settleRotation):
// the IPAddress takes the new owner, or the intent goes. finished: the claim may go on with rec.
func (h *Handler) finishRotation(ctx context.Context, address *ipamv1.IPAddress, rec, cur *record.Registration) (outcome, bool) {
	old := rec.Secret
	if err := h.settleRotation(ctx, rec, cur.RotatingTo, false); err != nil {
		return transient(err), false
	}
	if !rec.Secret.Equal(old) {
		rec.WriteTo(address.Labels, address.Annotations) // the intent goes once the IPAddress shows it
		return h.rotated(allocated(address.Spec.Address), rec, old), false
	}
	if err := h.writeRecord(ctx, h.withRefusal(rec, "")); err != nil {
		return transient(err), false
	}
	return outcome{}, true
}

// settleRotation settles a rotation of reg's address to the secret to that a record says was
// under way (none: to is zero): reg takes the secret that owns the address now. Used where
// the IPAddress cannot show the outcome: it was lost, or the claim is being released.
// Releasing, a target Secret being deleted (a user rolling the rotation back) is asked all
// the same, or claim and Secret would wait for each other for ever.
func (h *Handler) settleRotation(ctx context.Context, reg *record.Registration, to record.ObjectRef, releasing bool) error {
	if to.IsZero() || to.Equal(reg.Secret) || reg.Address == "" { // an intent always names its address
		return nil
	}
	newOwns, err := h.ownedBy(ctx, reg, to, releasing)
	if err != nil {
		return errors.Wrapf(err, "finding out whether the rotation of %s to the secret %s happened", reg.Address, to)
	}
	if newOwns {
		reg.Secret = to
	}
	return nil
}

// ownedBy asks the IPAM-API whether the secret ref owns rec's address: registering it with that
// secret succeeds only if so, or if it was free (registering it, as a rotation would have).
// Releasing, a Secret being deleted is asked too, if it is still protected with its value.
func (h *Handler) ownedBy(ctx context.Context, rec *record.Registration, ref record.ObjectRef, releasing bool) (bool, error) {
	api, err := h.API(ctx, rec)
	if err != nil {
		return false, err
	}
	sec, err := h.Secrets.Get(ctx, ref, false)
	var gone *registrar.SecretNotFoundError
	if errors.As(err, &gone) && !gone.NoKey && !rec.Secret.Equal(ref) {
		// A rotation goes out only once its target is protected, and the protector keeps a
		// target while an intent names it: a target that is gone never took the address.
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// Releasing, a Secret being deleted will do while it has the value it was
	// fingerprinted with; otherwise the question is a registration under it.
	if !sec.Usable(releasing) {
		// Its answer would be ambiguous with another value, or unprotected: wait.
		return false, errors.Errorf("Secret %s/%s is not protected with an unchanged value; waiting", ref.Namespace, ref.Name)
	}
	asked := *rec
	if cur, _ := record.OnClaim(h.claim.Annotations); cur != nil {
		asked.RotatingTo, asked.RotationRefused = cur.RotatingTo, cur.RotationRefused
	}
	err = h.registerBound(ctx, api, rec, &asked, rec.Request(sec.Value))
	switch {
	case err == nil:
		return true, nil
	case ipamapi.ClassOf(err) == ipamapi.ClassWrongSecret:
		return false, nil
	}
	return false, err
}

// after is the time d from now, for a message.
func (h *Handler) after(d time.Duration) string {
	return h.InFlight.Now().Add(d).UTC().Format(time.RFC3339)
}
