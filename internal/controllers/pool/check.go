package pool

import (
	"context"
	"fmt"

	"github.com/pkg/errors"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// check is the result of a readiness check: a Ready reason and its message.
type check struct{ reason, message string }

// probeServiceName is the service_name of the readiness check's request.
const probeServiceName = "vitistack-ipam-pool-probe"

// target is what a pool's checks ask the IPAM-API with: its registration (endpoint,
// zone, family, identity), the client for its endpoint and its secret's value.
type target struct {
	reg    record.Registration
	api    ipamapi.Client
	secret ipamapi.Secret
	// closed: the Secret was being deleted, or its value had changed since its
	// fingerprint, when read: nothing new is registered under it.
	closed bool
}

// target resolves what the pool's checks need, or says why it cannot (a check).
func (r *Reconciler) target(ctx context.Context, pool ipamv1alpha1.Pool) (*target, *check) {
	reg, err := r.ForPool(ctx, pool)
	if err != nil {
		var ce *registrar.ConfigError
		if errors.As(err, &ce) {
			return nil, &check{ipamv1alpha1.PoolReadyIPAMAPIUnreachableReason, ce.Msg}
		}
		return nil, &check{ipamv1alpha1.PoolReadyIPAMAPIUnreachableReason, err.Error()}
	}
	api, err := r.API(ctx, reg)
	if err != nil {
		return nil, &check{ipamv1alpha1.PoolReadyCABundleNotFoundReason, err.Error()}
	}
	sec, err := r.Secrets.Get(ctx, reg.Secret, true)
	if err != nil {
		var inv *registrar.SecretInvalidError
		var nf *registrar.SecretNotFoundError
		switch {
		case errors.As(err, &inv):
			return nil, &check{ipamv1alpha1.PoolReadySecretInvalidReason, err.Error()}
		case errors.As(err, &nf) && nf.Hint != "":
			return nil, &check{ipamv1alpha1.PoolReadySecretNotFoundReason, err.Error()}
		case errors.As(err, &nf):
			return nil, &check{ipamv1alpha1.PoolReadySecretNotFoundReason, err.Error() + ": create it (type Opaque) or fix spec.secretRef"}
		}
		return nil, &check{ipamv1alpha1.PoolReadyIPAMAPIUnreachableReason, err.Error()}
	}
	return &target{reg: *reg, api: api, secret: sec.Value, closed: sec.Deleting || sec.Changed()}, nil
}

// check asks the IPAM-API whether it accepts the pool's zone, family and secret, with
// a release of an address nobody can hold (from a documentation range): it changes
// nothing; 404 means every check passed, 400 carries the reason. It returns the target
// it checked (nil: none could be resolved).
func (r *Reconciler) check(ctx context.Context, pool ipamv1alpha1.Pool) (check, *target) {
	t, fail := r.target(ctx, pool)
	if fail != nil {
		return *fail, nil
	}
	return checkZone(ctx, pool, *t), t
}

// checkZone is check's request, once its target is resolved.
func checkZone(ctx context.Context, pool ipamv1alpha1.Pool, t target) check {
	reg, api := &t.reg, t.api
	reg.Address = "192.0.2.1/32" // TEST-NET-1, in no zone
	if reg.Family == ipamapi.FamilyIPv6 {
		reg.Address = "2001:db8::1/128" // documentation range, in no zone
	}
	reg.Identity.ServiceName, reg.Identity.NamespaceID = probeServiceName, probeServiceName
	_, err := api.Release(ipamapi.WithOperation(ctx, ipamapi.OpProbe), reg.Request(t.secret))
	accepted := check{ipamv1alpha1.PoolReadyReason, fmt.Sprintf("the IPAM-API at %s accepts zone %s, family %s", reg.Endpoint, reg.Zone, reg.Family)}
	refused := func(what string) check {
		return check{ipamv1alpha1.PoolReadyZoneRejectedReason, fmt.Sprintf("the readiness check (a release of %s, which nobody holds) was refused "+
			"by the IPAM-API at %s: %v; %s", reg.Address, reg.Endpoint, err, what)}
	}
	if lacks, passes, ok := ipamapi.ZoneGone(err, reg.Zone, reg.Family); ok && ipamv1alpha1.WorkedBefore(pool) {
		return check{ipamv1alpha1.PoolReadyBackendFailingReason, fmt.Sprintf("the IPAM-API at %s %s although the pool worked before (%s): %v",
			reg.Endpoint, lacks, passes, err)}
	}
	switch ipamapi.ClassOf(err) {
	case ipamapi.ClassNotHeld:
		return accepted
	case ipamapi.ClassValidation:
		return refused("fix spec.zone or spec.ipFamily")
	case ipamapi.ClassNoPrefixes:
		return refused(fmt.Sprintf("zone %s has no %s prefixes: fix spec.zone or spec.ipFamily", reg.Zone, reg.Family))
	case ipamapi.ClassBackendFailing:
		return check{ipamv1alpha1.PoolReadyBackendFailingReason, fmt.Sprintf("the IPAM-API at %s answers, but its own backend is failing: %v",
			reg.Endpoint, err)}
	case "":
		if err == nil {
			return accepted // not expected from a real server; the address is in no zone
		}
		return check{ipamv1alpha1.PoolReadyIPAMAPIUnreachableReason, err.Error()}
	}
	return check{ipamv1alpha1.PoolReadyIPAMAPIUnreachableReason, fmt.Sprintf("%v; check the endpoint URL (spec.endpoint or --ipam-api-url)", err)}
}
