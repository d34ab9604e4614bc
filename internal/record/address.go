package record

import (
	"strconv"
	"time"

	"github.com/pkg/errors"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// WriteTo records the registration on an IPAddress's labels and annotations.
func (r *Registration) WriteTo(labels, annotations map[string]string) {
	labels[ipamv1alpha1.ZoneLabel] = r.Zone
	labels[ipamv1alpha1.IPFamilyLabel] = string(r.Family)
	annotations[ipamv1alpha1.RegisteredEndpointAnnotation] = r.Endpoint
	if ca := r.CABundle.String(); ca != "" {
		annotations[ipamv1alpha1.RegisteredCABundleRefAnnotation] = ca
	}
	annotations[ipamv1alpha1.RegisteredAddressAnnotation] = r.Address
	annotations[ipamv1alpha1.RegisteredServiceNameAnnotation] = r.Identity.ServiceName
	annotations[ipamv1alpha1.RegisteredNamespaceIDAnnotation] = r.Identity.NamespaceID
	annotations[ipamv1alpha1.RegisteredClusterIDAnnotation] = r.Identity.ClusterID
	annotations[ipamv1alpha1.RegisteredSecretRefAnnotation] = r.Secret.String()
	annotations[ipamv1alpha1.RegisteredRetentionPeriodDaysAnnotation] = strconv.Itoa(r.RetentionPeriodDays)
	annotations[ipamv1alpha1.RegisteredDenyExternalCleanupAnnotation] = strconv.FormatBool(r.DenyExternalCleanup)
	if r.Attempt.IsZero() {
		delete(annotations, ipamv1alpha1.RegisteredAttemptAnnotation)
	} else {
		annotations[ipamv1alpha1.RegisteredAttemptAnnotation] = r.Attempt.UTC().Format(time.RFC3339Nano)
	}
}

// OnAddress reads the registration recorded on an IPAddress; nil if there is none.
func OnAddress(labels, annotations map[string]string) (*Registration, error) {
	addr, ok := annotations[ipamv1alpha1.RegisteredAddressAnnotation]
	if !ok {
		return nil, nil
	}
	r := &Registration{
		Phase:    PhaseRegistered,
		Endpoint: ipamapi.NormalizeEndpoint(annotations[ipamv1alpha1.RegisteredEndpointAnnotation]),
		Zone:     labels[ipamv1alpha1.ZoneLabel],
		Family:   ipamapi.Family(labels[ipamv1alpha1.IPFamilyLabel]),
		Address:  addr,
		Identity: ipamapi.Identity{
			ServiceName: annotations[ipamv1alpha1.RegisteredServiceNameAnnotation],
			NamespaceID: annotations[ipamv1alpha1.RegisteredNamespaceIDAnnotation],
			ClusterID:   annotations[ipamv1alpha1.RegisteredClusterIDAnnotation],
		},
		DenyExternalCleanup: annotations[ipamv1alpha1.RegisteredDenyExternalCleanupAnnotation] == "true",
	}
	var err error
	if r.Secret, err = ParseObjectRef(annotations[ipamv1alpha1.RegisteredSecretRefAnnotation]); err != nil {
		return nil, errors.Wrapf(err, "annotation %s", ipamv1alpha1.RegisteredSecretRefAnnotation)
	}
	if r.CABundle, err = ParseObjectRef(annotations[ipamv1alpha1.RegisteredCABundleRefAnnotation]); err != nil {
		return nil, errors.Wrapf(err, "annotation %s", ipamv1alpha1.RegisteredCABundleRefAnnotation)
	}
	if v := annotations[ipamv1alpha1.RegisteredRetentionPeriodDaysAnnotation]; v != "" {
		if r.RetentionPeriodDays, err = strconv.Atoi(v); err != nil {
			return nil, errors.Wrapf(err, "annotation %s", ipamv1alpha1.RegisteredRetentionPeriodDaysAnnotation)
		}
	}
	if v := annotations[ipamv1alpha1.RegisteredAttemptAnnotation]; v != "" {
		if r.Attempt, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return nil, errors.Wrapf(err, "annotation %s", ipamv1alpha1.RegisteredAttemptAnnotation)
		}
	}
	if r.Endpoint == "" || r.Zone == "" || r.Family == "" || r.Secret.Name == "" ||
		r.Identity.ServiceName == "" || r.Identity.NamespaceID == "" || r.Identity.ClusterID == "" {
		return nil, errors.New("the IPAddress's registration record is incomplete (labels ipam.vitistack.io/zone, ip-family or registered-* annotations missing)")
	}
	return r, nil
}
