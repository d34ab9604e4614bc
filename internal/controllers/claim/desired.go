package claim

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// userError is a claim or pool setting that makes registration impossible until one changes.
type userError struct {
	reason, msg string
}

func (e *userError) Error() string { return e.msg }

func invalidAnnotation(key, format string, args ...any) error {
	return &userError{reason: ipamv1alpha1.ClaimReadyInvalidAnnotationReason,
		msg: fmt.Sprintf("annotation %s: ", key) + fmt.Sprintf(format, args...)}
}

// asOutcome turns an error of desired or overrides into the claim's outcome.
func asOutcome(err error) outcome {
	var ue *userError
	var ce *registrar.ConfigError
	switch {
	case errors.As(err, &ue):
		return failed(ue.reason, ue.msg).final()
	case errors.As(err, &ce):
		return failed(ipamv1.IPAddressClaimReadyPoolNotReadyReason, ce.Msg).final()
	}
	return transient(err)
}

// identityAnnotations override the IPAM-API identity; a privilege (see allowedOverride).
var identityAnnotations = []string{ipamv1alpha1.ServiceNameAnnotation, ipamv1alpha1.NamespaceIDAnnotation, ipamv1alpha1.ClusterIDAnnotation}

// desired computes an unbound claim's registration from its annotations, pool and the config.
func (h *Handler) desired(ctx context.Context) (*record.Registration, error) {
	reg, err := h.ForPool(ctx, h.pool)
	if err != nil {
		return nil, err
	}
	ann := h.claim.Annotations
	// The address the user asked for, if any: the entry of the pool's family.
	if reg.Address, err = requested(ann, reg.Family); err != nil {
		return nil, err
	}
	if v := strings.TrimSpace(ann[ipamv1alpha1.AddressesAnnotation]); v != "" && reg.Address == "" {
		return nil, invalidAnnotation(ipamv1alpha1.AddressesAnnotation, "%q has no %s address for pool %s", v, reg.Family, h.pool.GetName())
	}
	if err := h.overrides(reg); err != nil {
		return nil, err
	}
	if err := h.allowedOverride(); err != nil {
		return nil, err
	}

	// The identity: the claim's name and its Namespace's UID, unless overridden.
	reg.Identity.ServiceName = h.claim.Name
	if v := strings.TrimSpace(ann[ipamv1alpha1.ServiceNameAnnotation]); v != "" {
		reg.Identity.ServiceName = v
	}
	if v := strings.TrimSpace(ann[ipamv1alpha1.NamespaceIDAnnotation]); v != "" {
		reg.Identity.NamespaceID = v
	} else {
		ns := &corev1.Namespace{}
		if err := h.Client.Get(ctx, types.NamespacedName{Name: h.claim.Namespace}, ns); err != nil {
			return nil, errors.Wrapf(err, "reading Namespace %s for the claim's namespace_id", h.claim.Namespace)
		}
		reg.Identity.NamespaceID = string(ns.UID)
	}
	if v := strings.TrimSpace(ann[ipamv1alpha1.ClusterIDAnnotation]); v != "" {
		reg.Identity.ClusterID = v
	}
	return reg, nil
}

// requested is the address of family fam the addresses annotation asks for, as a host
// CIDR ("": none).
func requested(ann map[string]string, fam ipamapi.Family) (string, error) {
	v := strings.TrimSpace(ann[ipamv1alpha1.AddressesAnnotation])
	if v == "" {
		return "", nil
	}
	out := ""
	for _, s := range strings.Split(v, ",") {
		a, err := ipamapi.ParseHost(s)
		if err != nil {
			return "", invalidAnnotation(ipamv1alpha1.AddressesAnnotation, "%v; give bare addresses or host CIDRs, comma-separated", err)
		}
		if ipamapi.FamilyOf(a) == fam {
			if out != "" {
				return "", invalidAnnotation(ipamv1alpha1.AddressesAnnotation, "more than one %s address in %q; give one per family", fam, v)
			}
			out = netip.PrefixFrom(a, a.BitLen()).String()
		}
	}
	return out, nil
}

// allowedOverride refuses identity overrides the pool does not allow, except a Service's
// claim naming its Service as service_name: that identity is its own namespace's anyway.
func (h *Handler) allowedOverride() error {
	var used []string
	for _, k := range identityAnnotations {
		if strings.TrimSpace(h.claim.Annotations[k]) != "" {
			used = append(used, k)
		}
	}
	if len(used) == 0 || h.pool.PoolSpec().AllowIdentityOverrides {
		return nil
	}
	if owner := metav1.GetControllerOf(h.claim); owner != nil && owner.Kind == "Service" && owner.APIVersion == "v1" &&
		slices.Equal(used, []string{ipamv1alpha1.ServiceNameAnnotation}) &&
		strings.TrimSpace(h.claim.Annotations[ipamv1alpha1.ServiceNameAnnotation]) == owner.Name {
		return nil
	}
	return &userError{reason: ipamv1alpha1.ClaimReadyIdentityOverrideNotAllowedReason,
		msg: fmt.Sprintf("annotation %s: %s %s does not allow claims to choose their IPAM-API identity; remove the annotation, "+
			"or set spec.allowIdentityOverrides: true on the pool", strings.Join(used, ", "), h.claim.Spec.PoolRef.Kind, h.pool.GetName())}
}

// overrides applies the claim's secret, retention and cleanup annotations, if any, to reg.
func (h *Handler) overrides(reg *record.Registration) error {
	ann := h.claim.Annotations
	if v, ok := ann[ipamv1alpha1.RetentionPeriodDaysAnnotation]; ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > 30 {
			return invalidAnnotation(ipamv1alpha1.RetentionPeriodDaysAnnotation, "%q is not a whole number of days from 0 to 30", v)
		}
		reg.RetentionPeriodDays = n
	}
	if v, ok := ann[ipamv1alpha1.DenyExternalCleanupAnnotation]; ok {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return invalidAnnotation(ipamv1alpha1.DenyExternalCleanupAnnotation, "%q is not \"true\" or \"false\"", v)
		}
		reg.DenyExternalCleanup = b
	}
	switch v := strings.TrimSpace(ann[ipamv1alpha1.SecretAnnotation]); {
	case v == "":
	case v == ipamv1alpha1.DefaultSecretName:
		reg.Secret = h.DefaultSecretRef()
	case record.SecretNameProblem(v, ipamv1alpha1.DefaultSecretName) != "":
		return invalidAnnotation(ipamv1alpha1.SecretAnnotation, "%s", record.SecretNameProblem(v, ipamv1alpha1.DefaultSecretName))
	default:
		reg.Secret = record.ObjectRef{Namespace: h.claim.Namespace, Name: v, Key: record.DefaultSecretKey}
	}
	return nil
}

// shareKey is the key a claim shares its address under ("": with nobody). The Service controller
// copies the Service's allow-local-shared-ip, as MetalLB shares only between Services with equal
// allow-shared-ip.
func shareKey(c metav1.Object) string {
	return strings.TrimSpace(c.GetAnnotations()[ipamv1alpha1.AllowLocalSharedIPAnnotation])
}
