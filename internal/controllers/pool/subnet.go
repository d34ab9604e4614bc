package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	"github.com/pkg/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// +kubebuilder:rbac:groups=ipam.vitistack.io,resources=vitistackippools;globalvitistackippools,verbs=patch

// subnetProbeServiceName is the service_name of the check of a pool's subnet against
// its zone; its namespace_id is the pool's UID.
const subnetProbeServiceName = "vitistack-ipam-subnet-probe"

// checkSubnet asks the IPAM-API whether a subnet-mode pool's subnet lies in its zone,
// and returns a SubnetOutsideZone check when it does not (nil: inside, or no answer
// either way; checked is false for the latter, and soon too when the answer only waits
// for the pool's CA bundle or Secret to be protected). Only a registration checks an
// address against a zone, so it registers the subnet's first address (which subnet mode
// never hands out) under the pool's probe identity and releases it at once, recording
// it on the pool in between. It runs after the pool's readiness check passed.
//
// The registration goes under the Secret as a claim's does: the record first, then a
// last, uncached read of the Secret, which is protected then if it is not
// (registrar.Secrets.Protect), with this value. The Secret protector lets go in two
// phases (it marks the Secret, then looks for records uncached): either this read sees
// the mark and takes the Secret back, or the protector sees the record. Otherwise the
// protector could let the Secret go while the check registers under it, and its address
// could never be given back, nor the pool deleted.
func (r *Reconciler) checkSubnet(ctx context.Context, pool ipamv1alpha1.Pool, t *target) (outside *check, checked, soon bool) {
	if t == nil {
		return nil, false, false
	}
	reg, api, secret := &t.reg, t.api, t.secret
	spec := pool.PoolSpec()
	prefix, err := netip.ParsePrefix(spec.Subnet)
	if err != nil {
		return nil, false, false // refused at admission
	}
	probe := *reg
	probe.Address = netip.PrefixFrom(prefix.Masked().Addr(), prefix.Addr().BitLen()).String()
	probe.Identity.ServiceName, probe.Identity.NamespaceID = subnetProbeServiceName, string(pool.GetUID())
	probe.RetentionPeriodDays, probe.Attempt = 0, r.InFlight.AttemptTime()
	if _, err := r.APIToRegister(ctx, &probe); err != nil {
		// Its CA bundle is not protected yet (a moment after the pool appears): checked soon.
		ctrl.LoggerFrom(ctx).V(1).Info("Not checking the pool's subnet against its zone yet", "reason", err.Error())
		return nil, false, true
	}
	if t.closed {
		// Being deleted, or its value changed: nothing is registered under it.
		ctrl.LoggerFrom(ctx).V(1).Info("Not checking the pool's subnet against its zone: its Secret is being deleted or its value changed",
			"secret", reg.Secret.String())
		return nil, false, true
	}
	if err := r.setProbe(ctx, pool, &probe); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Not checking the pool's subnet against its zone")
		return nil, false, false
	}
	// The record is written before the Secret's last read (and write), as a claim's is
	// (registrar.Secrets.Protect: two-phase letting go).
	if sec, err := r.Secrets.Protect(ctx, reg.Secret); err != nil || !sec.Usable(false) || sec.Value != secret {
		// Not protected (the error says why), or it changed meanwhile: the record goes, unsent.
		reason := "its Secret changed"
		if err != nil {
			reason = err.Error()
		}
		ctrl.LoggerFrom(ctx).V(1).Info("Not checking the pool's subnet against its zone yet", "secret", reg.Secret.String(), "reason", reason)
		if err := r.setProbe(ctx, pool, nil); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Taking the record of the pool's subnet check off")
		}
		return nil, false, true
	}
	_, err = r.InFlight.Register(ipamapi.WithOperation(ctx, ipamapi.OpProbe), api, pool.GetUID(), &probe, probe.Request(secret))
	class := ipamapi.ClassOf(err)
	if class != ipamapi.ClassNotInZone && class != ipamapi.ClassWrongSecret && class != ipamapi.ClassValidation {
		// Registered, or perhaps registered: given back before the record goes.
		if wait, err := r.releaseProbe(ctx, pool, api, &probe, secret); err != nil || wait > 0 {
			// The record stays on the pool: its next reconcile gives the address back.
			ctrl.LoggerFrom(ctx).Info("The address of the pool's subnet check is given back later", "address", probe.Address, "reason", err, "after", wait)
			return nil, false, false
		}
	} else if err := r.setProbe(ctx, pool, nil); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Taking the record of the pool's subnet check off")
	}
	if class != ipamapi.ClassNotInZone {
		return nil, err == nil || class == ipamapi.ClassWrongSecret, false
	}
	return &check{ipamv1alpha1.PoolReadySubnetOutsideZoneReason, fmt.Sprintf("subnet %s lies outside zone %s: the IPAM-API at %s "+
		"refuses its address %s as not valid for the zone (%v); fix spec.subnet or spec.zone", spec.Subnet, spec.Zone, reg.Endpoint, probe.Address, err)}, true, false
}

// probeRecord is what SubnetProbeAnnotation holds: the address and the identity it was
// registered under (recorded, as the pool's UID and the cluster's change with
// clusterctl move), and when the registration was sent (zero: not known, and not
// waited for).
type probeRecord struct {
	Address  string           `json:"address"`
	Identity ipamapi.Identity `json:"identity"`
	Attempt  time.Time        `json:"attempt,omitzero"`
}

// finishSubnetProbe releases the address of a subnet check that was cut short (the
// record is still on the pool) and takes the record off, once its registration can no
// longer be carried out (wait: come back then): a release that overtook it would leave
// the address registered for good. fail says why the address cannot be given back now
// (the pool's Ready condition shows it); err is a failed write of the pool.
func (r *Reconciler) finishSubnetProbe(ctx context.Context, pool ipamv1alpha1.Pool) (wait time.Duration, fail *check, err error) {
	value, ok := pool.GetAnnotations()[ipamv1alpha1.SubnetProbeAnnotation]
	if !ok {
		return 0, nil, nil
	}
	var rec probeRecord
	if err := json.Unmarshal([]byte(value), &rec); err != nil || rec.Address == "" {
		return 0, nil, r.setProbe(ctx, pool, nil) // not the provider's: nothing it registered
	}
	t, fail := r.target(ctx, pool)
	if fail != nil {
		return 0, &check{fail.reason, fmt.Sprintf("the address %s, which a check of the pool's subnet that was cut short registered, "+
			"cannot be given back: %s", rec.Address, fail.message)}, nil
	}
	reg := &t.reg
	reg.Address, reg.Identity, reg.RetentionPeriodDays, reg.Attempt = rec.Address, rec.Identity, 0, rec.Attempt
	if wait := r.InFlight.Wait(pool.GetUID(), reg, true); wait > 0 {
		ctrl.LoggerFrom(ctx).V(1).Info("The pool's subnet check may still be carried out; releasing its address later", "address", reg.Address, "after", wait)
		return wait, nil, nil
	}
	wait, err = r.releaseProbe(ctx, pool, t.api, reg, t.secret)
	if e := (*ipamapi.Error)(nil); errors.As(err, &e) {
		// Why the IPAM-API refuses, in the pool's own terms: its readiness check.
		c := checkZone(ctx, pool, *t)
		if c.reason == ipamv1alpha1.PoolReadyReason {
			c.reason = ipamv1alpha1.PoolReadyIPAMAPIUnreachableReason
		}
		c.message = fmt.Sprintf("the address %s, which a check of the pool's subnet that was cut short registered, could not be "+
			"given back (%v); tried again in a minute. The readiness check: %s", rec.Address, e, c.message)
		return 0, &c, nil
	}
	return wait, nil, err
}

// releaseProbe gives the probe's address back (not held: given back already) and
// takes the record off the pool. wait: a registration of the address may still be
// carried out, and nothing was sent; an *ipamapi.Error: the IPAM-API did not release it.
func (r *Reconciler) releaseProbe(ctx context.Context, pool ipamv1alpha1.Pool, api ipamapi.Client, probe *record.Registration,
	secret ipamapi.Secret) (wait time.Duration, err error) {
	if left := r.InFlight.Wait(pool.GetUID(), probe, false); left > 0 {
		return left, nil
	}
	if _, err := r.InFlight.Release(ipamapi.WithOperation(ctx, ipamapi.OpProbe), api, pool.GetUID(), probe, probe.Request(secret)); err != nil &&
		ipamapi.ClassOf(err) != ipamapi.ClassNotHeld {
		return 0, errors.Wrapf(err, "releasing %s, registered to check the pool's subnet against its zone", probe.Address)
	}
	return 0, r.setProbe(ctx, pool, nil)
}

// setProbe records a subnet check's registration on the pool (nil: takes it off).
func (r *Reconciler) setProbe(ctx context.Context, pool ipamv1alpha1.Pool, probe *record.Registration) error {
	value := ""
	if probe != nil {
		b, err := json.Marshal(probeRecord{Address: probe.Address, Identity: probe.Identity, Attempt: probe.Attempt})
		if err != nil {
			return err
		}
		value = string(b)
	}
	if have, ok := pool.GetAnnotations()[ipamv1alpha1.SubnetProbeAnnotation]; have == value && ok == (probe != nil) {
		return nil
	}
	before := pool.DeepCopyObject().(ipamv1alpha1.Pool)
	ann := pool.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	if probe == nil {
		delete(ann, ipamv1alpha1.SubnetProbeAnnotation)
	} else {
		ann[ipamv1alpha1.SubnetProbeAnnotation] = value
	}
	pool.SetAnnotations(ann)
	return errors.Wrap(r.Client.Patch(ctx, pool, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})),
		"recording the pool's subnet check")
}
