package record

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/pkg/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// Registration is everything needed to talk to the IPAM-API about one claim's address
// except the secret's value. It is recorded on the claim (as JSON) before the first
// request is sent and completed with the address when the IPAM-API answers, and on the
// IPAddress (as annotations and labels) once that exists. From then on the recorded
// registration is used for every call, whatever the pool or the flags say later.
type Registration struct {
	Endpoint            string           `json:"endpoint"`
	CABundle            ObjectRef        `json:"caBundle,omitzero"`
	Zone                string           `json:"zone"`
	Family              ipamapi.Family   `json:"ipFamily"`
	Identity            ipamapi.Identity `json:"identity"`
	Secret              ObjectRef        `json:"secret"`
	Address             string           `json:"address,omitempty"` // canonical CIDR: requested, or registered
	RetentionPeriodDays int              `json:"retentionPeriodDays"`
	DenyExternalCleanup bool             `json:"denyExternalCleanup"`
	// Phase is where the registration is; it decides what is sent next, and it is written
	// on the claim before any request that depends on it.
	Phase Phase `json:"phase,omitempty"`
	// RotatingTo is a recorded rotation intent: the Secret the address is being moved
	// to. It is written before the IPAM-API is asked (new_secret) and removed once the
	// IPAddress records the new owner. While it is set, who owns the address is asked
	// with this Secret before any other call, release included.
	RotatingTo ObjectRef `json:"rotatingTo,omitzero"`
	// RotationRefused names the secret a rotation to was refused, so it is not retried
	// until the desired secret changes again.
	RotationRefused string `json:"rotationRefused,omitempty"`
	// Attempt is when the last registration request was sent. Until its answer has been
	// seen, no other request for the identity is sent before Attempt + the quarantine.
	Attempt time.Time `json:"attempt,omitzero"`
}

// Phase is where a claim's registration is. A claim once bound counts as Registered
// whatever its own record says: the IPAddress took the record over when it was made.
type Phase string

const (
	// PhasePending means that the request for the identity, with the address the user asked for if
	// any, is about to go out or went out at Attempt (zero: nothing was sent).
	PhasePending Phase = "Pending"
	// PhaseCandidate means that Address is a subnet-mode candidate the provider picked. An answer
	// that it was held already ("updated") may mean someone else holds it under the same
	// secret: the claim gives it back.
	PhaseCandidate Phase = "Candidate"
	// PhaseDeclining means that the candidate is held by someone else; this claim's hold on it is
	// being given back. After a restart it is given back, never taken.
	PhaseDeclining Phase = "Declining"
	// PhaseRegistered means that the IPAM-API answered with Address (a claim once bound
	// whose record was made before the answer may not name it: sending it again learns it).
	PhaseRegistered Phase = "Registered"
)

// Picked reports whether Address is a candidate the provider picked, not one the user
// asked for.
func (r *Registration) Picked() bool { return r.Phase == PhaseCandidate || r.Phase == PhaseDeclining }

// onWire is the record as JSON: the phase, and for v0.1.0 (which reads it on a
// downgrade) the same phase as the three flags it knows. A registered record without an
// address is not "registered" to v0.1.0, which then learns the address before releasing
// it (it would release nothing).
type onWire struct {
	plain
	Registered bool `json:"registered,omitempty"`
	Candidate  bool `json:"candidate,omitempty"`
	Declined   bool `json:"declined,omitempty"`
}

type plain Registration // without the JSON methods

// MarshalJSON writes the record with its phase in both forms.
func (r Registration) MarshalJSON() ([]byte, error) {
	return json.Marshal(onWire{plain: plain(r), Registered: r.Phase == PhaseRegistered && r.Address != "", Candidate: r.Picked(),
		Declined: r.Phase == PhaseDeclining})
}

// UnmarshalJSON reads a record; one without a phase it knows (written by v0.1.0, or by a
// later version) has it from the flags.
func (r *Registration) UnmarshalJSON(b []byte) error {
	var w onWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*r = Registration(w.plain)
	switch {
	case r.Phase == PhasePending, r.Picked(), r.Phase == PhaseRegistered:
	case w.Registered:
		r.Phase = PhaseRegistered
	case w.Declined:
		r.Phase = PhaseDeclining
	case w.Candidate:
		r.Phase = PhaseCandidate
	default:
		r.Phase = PhasePending
	}
	return nil
}

// Key identifies the holder in the IPAM-API; two claims must never share it.
func (r *Registration) Key() string {
	return strings.Join([]string{ipamapi.NormalizeEndpoint(r.Endpoint), r.Zone, string(r.Family),
		r.Identity.ServiceName, r.Identity.NamespaceID, r.Identity.ClusterID}, "|")
}

// HostKey identifies an address in the IPAM-API (endpoint, zone and the address);
// "" when the registration names no address yet.
func (r *Registration) HostKey() string {
	if r.Address == "" {
		return ""
	}
	return HostKey(r.Endpoint, r.Zone, r.Address)
}

// HostKey identifies an address in one zone of one IPAM-API.
func HostKey(endpoint, zone, address string) string {
	return ipamapi.NormalizeEndpoint(endpoint) + "|" + zone + "|" + address
}

// Request is the IPAM-API request for the registration, sent with secret.
func (r *Registration) Request(secret ipamapi.Secret) ipamapi.Request {
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

// Secrets are the Secrets the registration references: its owner and, during a
// rotation, the one it is moving to.
func (r *Registration) Secrets() []ObjectRef {
	out := []ObjectRef{r.Secret}
	if !r.RotatingTo.IsZero() {
		out = append(out, r.RotatingTo)
	}
	return out
}

// OnClaim reads the registration recorded on a claim's annotations; nil if there is none.
func OnClaim(annotations map[string]string) (*Registration, error) {
	raw, ok := annotations[ipamv1alpha1.RegistrationAnnotation]
	if !ok {
		return nil, nil
	}
	r := &Registration{}
	if err := json.Unmarshal([]byte(raw), r); err != nil {
		return nil, errors.Wrapf(err, "annotation %s is not a registration record", ipamv1alpha1.RegistrationAnnotation)
	}
	if r.Endpoint == "" || r.Zone == "" || r.Family == "" || r.Secret.Name == "" {
		return nil, errors.Errorf("annotation %s is not a complete registration record (endpoint, zone, ipFamily and secret are required)",
			ipamv1alpha1.RegistrationAnnotation)
	}
	return r, nil
}

// SetOn records the registration on a claim's annotations.
func (r *Registration) SetOn(claim client.Object) {
	b, _ := json.Marshal(r) //nolint:errchkjson // plain strings, numbers and a time
	ann := claim.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[ipamv1alpha1.RegistrationAnnotation] = string(b)
	claim.SetAnnotations(ann)
}

// Remove deletes the registration record from a claim's annotations.
func Remove(claim client.Object) {
	ann := claim.GetAnnotations()
	delete(ann, ipamv1alpha1.RegistrationAnnotation)
	claim.SetAnnotations(ann)
}
