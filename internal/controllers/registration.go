package controllers

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/pkg/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// objectRef names a key of a Secret, or of a ConfigMap or Secret holding a CA bundle.
type objectRef struct {
	Kind      string `json:"kind,omitempty"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Key       string `json:"key"`
}

func (r objectRef) String() string {
	if r.Name == "" {
		return ""
	}
	s := r.Namespace + "/" + r.Name + "/" + r.Key
	if r.Kind != "" && r.Kind != "Secret" {
		s = r.Kind + ":" + s
	}
	return s
}

func parseObjectRef(s string) (objectRef, error) {
	if s == "" {
		return objectRef{}, nil
	}
	r := objectRef{Kind: "Secret"}
	if kind, rest, ok := strings.Cut(s, ":"); ok {
		r.Kind, s = kind, rest
	}
	parts := strings.Split(s, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return objectRef{}, errors.Errorf("%q is not namespace/name/key", s)
	}
	r.Namespace, r.Name, r.Key = parts[0], parts[1], parts[2]
	return r, nil
}

// registration is everything needed to talk to the IPAM-API about one claim's address
// except the secret's value. It is recorded on the claim (as JSON) before the first
// request is sent and completed with the address when the IPAM-API answers, and on the
// IPAddress (as annotations and labels) once that exists. From then on the recorded
// registration is used for every call, whatever the pool or the flags say later.
type registration struct {
	Endpoint            string           `json:"endpoint"`
	CABundle            objectRef        `json:"caBundle,omitzero"`
	Zone                string           `json:"zone"`
	Family              ipamapi.Family   `json:"ipFamily"`
	Identity            ipamapi.Identity `json:"identity"`
	Secret              objectRef        `json:"secret"`
	Address             string           `json:"address,omitempty"` // canonical CIDR: requested, or registered
	RetentionPeriodDays int              `json:"retentionPeriodDays"`
	DenyExternalCleanup bool             `json:"denyExternalCleanup"`
	// Registered is true once the IPAM-API has answered with Address.
	Registered bool `json:"registered,omitempty"`
	// Candidate is true when Address is a subnet-mode candidate the provider picked (not
	// one the user asked for): if the IPAM-API says it was already held ("updated") on
	// the first attempt, someone else holds it, and this claim lets it go.
	Candidate bool `json:"candidate,omitempty"`
	// Declined is true while this claim's hold on a candidate held by someone else is
	// being given back.
	Declined bool `json:"declined,omitempty"`
	// RotationRefused names the secret a rotation to was refused, so it is not retried
	// until the desired secret changes again.
	RotationRefused string `json:"rotationRefused,omitempty"`
	// Attempt is when the last registration request was sent. Until its answer has been
	// seen, no other request for the identity is sent before Attempt + the quarantine.
	Attempt time.Time `json:"attempt,omitzero"`
}

// key identifies the holder in the IPAM-API; two claims must never share it.
func (r *registration) key() string {
	return strings.Join([]string{ipamapi.NormalizeEndpoint(r.Endpoint), r.Zone, string(r.Family),
		r.Identity.ServiceName, r.Identity.NamespaceID, r.Identity.ClusterID}, "|")
}

func (r *registration) request(secret ipamapi.Secret) ipamapi.Request {
	return ipamapi.Request{
		Secret:              secret,
		Zone:                r.Zone,
		Family:              r.Family,
		Address:             r.Address,
		Identity:            r.Identity,
		RetentionPeriodDays: r.RetentionPeriodDays,
		DenyExternalCleanup: r.DenyExternalCleanup,
	}
}

// claimRecord reads the registration recorded on a claim; nil if there is none.
func claimRecord(annotations map[string]string) (*registration, error) {
	raw, ok := annotations[ipamv1alpha1.RegistrationAnnotation]
	if !ok {
		return nil, nil
	}
	r := &registration{}
	if err := json.Unmarshal([]byte(raw), r); err != nil {
		return nil, errors.Wrapf(err, "annotation %s is not a registration record", ipamv1alpha1.RegistrationAnnotation)
	}
	return r, nil
}

// setOn records the registration on a claim's annotations.
func (r *registration) setOn(claim client.Object) {
	b, _ := json.Marshal(r) //nolint:errchkjson // plain strings, numbers and a time
	ann := claim.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[ipamv1alpha1.RegistrationAnnotation] = string(b)
	claim.SetAnnotations(ann)
}

// writeTo records the registration on an IPAddress's labels and annotations.
func (r *registration) writeTo(labels, annotations map[string]string) {
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
}

// recordedOn reads the registration recorded on an IPAddress; nil if there is none.
func recordedOn(labels, annotations map[string]string) (*registration, error) {
	addr, ok := annotations[ipamv1alpha1.RegisteredAddressAnnotation]
	if !ok {
		return nil, nil
	}
	r := &registration{
		Registered: true,
		Endpoint:   ipamapi.NormalizeEndpoint(annotations[ipamv1alpha1.RegisteredEndpointAnnotation]),
		Zone:       labels[ipamv1alpha1.ZoneLabel],
		Family:     ipamapi.Family(labels[ipamv1alpha1.IPFamilyLabel]),
		Address:    addr,
		Identity: ipamapi.Identity{
			ServiceName: annotations[ipamv1alpha1.RegisteredServiceNameAnnotation],
			NamespaceID: annotations[ipamv1alpha1.RegisteredNamespaceIDAnnotation],
			ClusterID:   annotations[ipamv1alpha1.RegisteredClusterIDAnnotation],
		},
		DenyExternalCleanup: annotations[ipamv1alpha1.RegisteredDenyExternalCleanupAnnotation] == "true",
	}
	var err error
	if r.Secret, err = parseObjectRef(annotations[ipamv1alpha1.RegisteredSecretRefAnnotation]); err != nil {
		return nil, errors.Wrapf(err, "annotation %s", ipamv1alpha1.RegisteredSecretRefAnnotation)
	}
	if r.CABundle, err = parseObjectRef(annotations[ipamv1alpha1.RegisteredCABundleRefAnnotation]); err != nil {
		return nil, errors.Wrapf(err, "annotation %s", ipamv1alpha1.RegisteredCABundleRefAnnotation)
	}
	if v := annotations[ipamv1alpha1.RegisteredRetentionPeriodDaysAnnotation]; v != "" {
		if r.RetentionPeriodDays, err = strconv.Atoi(v); err != nil {
			return nil, errors.Wrapf(err, "annotation %s", ipamv1alpha1.RegisteredRetentionPeriodDaysAnnotation)
		}
	}
	if r.Endpoint == "" || r.Zone == "" || r.Family == "" || r.Secret.Name == "" ||
		r.Identity.ServiceName == "" || r.Identity.NamespaceID == "" || r.Identity.ClusterID == "" {
		return nil, errors.New("the IPAddress's registration record is incomplete (labels ipam.vitistack.io/zone, ip-family or registered-* annotations missing)")
	}
	return r, nil
}

func secretKey(r objectRef) types.NamespacedName {
	return types.NamespacedName{Namespace: r.Namespace, Name: r.Name}
}
