package record_test

import (
	"encoding/json"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

func full() *record.Registration {
	return &record.Registration{
		Endpoint: "https://ipam.example/v2", Zone: "inet", Family: ipamapi.FamilyIPv4,
		CABundle: record.ObjectRef{Kind: "ConfigMap", Namespace: "ns", Name: "ca", Key: "ca.crt"},
		Identity: ipamapi.Identity{ServiceName: "web", NamespaceID: "uid-1", ClusterID: "c-1"},
		Secret:   record.ObjectRef{Kind: "Secret", Namespace: "ns", Name: "s", Key: "secret"},
		Address:  "83.118.168.4/32", RetentionPeriodDays: 7, DenyExternalCleanup: true, Phase: record.PhaseRegistered,
	}
}

// What is written on a claim or an IPAddress reads back the same.
func TestRoundTrip(t *testing.T) {
	g := NewWithT(t)
	r := full()
	r.RotatingTo = record.ObjectRef{Namespace: "ns", Name: "next", Key: "secret"}
	r.Attempt = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	claim := &ipamv1.IPAddressClaim{}
	r.SetOn(claim)
	got, err := record.OnClaim(claim.Annotations)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(r))
	g.Expect(got.Secrets()).To(HaveLen(2), "owner and rotation target")
	record.Remove(claim)
	g.Expect(record.OnClaim(claim.Annotations)).To(BeNil())

	addr := full()
	labels, ann := map[string]string{}, map[string]string{}
	addr.WriteTo(labels, ann)
	back, err := record.OnAddress(labels, ann)
	g.Expect(err).NotTo(HaveOccurred())
	back.Endpoint = addr.Endpoint // normalised on read
	g.Expect(back).To(Equal(addr))
	g.Expect(back.Key()).To(Equal(addr.Key()))
	g.Expect(ann[ipamv1alpha1.RegisteredSecretRefAnnotation]).To(Equal("ns/s/secret"), "a reference, never a value")
}

// The phase is written both as itself and as the three flags of v0.1.0, which reads the
// record after a downgrade; a record v0.1.0 wrote (flags only) reads with its phase.
func TestPhaseOnTheWire(t *testing.T) {
	g := NewWithT(t)
	v010 := map[record.Phase]string{
		record.PhasePending:    `{}`,
		record.PhaseCandidate:  `{"candidate":true}`,
		record.PhaseDeclining:  `{"candidate":true,"declined":true}`,
		record.PhaseRegistered: `{"registered":true}`,
	}
	for phase, flags := range v010 {
		r := full()
		r.Phase = phase
		claim := &ipamv1.IPAddressClaim{}
		r.SetOn(claim)
		written := claim.Annotations[ipamv1alpha1.RegistrationAnnotation]
		g.Expect(written).To(ContainSubstring(`"phase":"` + string(phase) + `"`))

		var asV010, want map[string]any
		g.Expect(json.Unmarshal([]byte(written), &asV010)).To(Succeed())
		g.Expect(json.Unmarshal([]byte(flags), &want)).To(Succeed())
		for _, flag := range []string{"registered", "candidate", "declined"} {
			g.Expect(asV010[flag] == true).To(Equal(want[flag] == true), "%s as v0.1.0 reads it: %s", phase, flag)
		}

		delete(asV010, "phase")
		old, _ := json.Marshal(asV010)
		got, err := record.OnClaim(map[string]string{ipamv1alpha1.RegistrationAnnotation: string(old)})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got.Phase).To(Equal(phase), "a record v0.1.0 wrote as %s", flags)
	}
}

// A registered record without an address (a claim once bound, whose record was made
// before the answer) is not "registered" to v0.1.0: it learns the address before it
// releases, rather than releasing nothing.
func TestARegisteredRecordWithoutAnAddressIsPendingToV010(t *testing.T) {
	g := NewWithT(t)
	r := full()
	r.Address = ""
	claim := &ipamv1.IPAddressClaim{}
	r.SetOn(claim)
	g.Expect(claim.Annotations[ipamv1alpha1.RegistrationAnnotation]).To(And(ContainSubstring(`"phase":"Registered"`),
		Not(ContainSubstring(`"registered"`))))
	got, err := record.OnClaim(claim.Annotations)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Phase).To(Equal(record.PhaseRegistered))
}

// Broken records are refused with a message naming the annotation.
func TestBrokenRecords(t *testing.T) {
	for name, ann := range map[string]map[string]string{
		"not JSON":   {ipamv1alpha1.RegistrationAnnotation: "{"},
		"incomplete": {ipamv1alpha1.RegistrationAnnotation: `{"zone":"inet"}`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := record.OnClaim(ann)
			NewWithT(t).Expect(err).To(MatchError(ContainSubstring(ipamv1alpha1.RegistrationAnnotation)))
		})
	}
	_, err := record.OnAddress(map[string]string{}, map[string]string{ipamv1alpha1.RegisteredAddressAnnotation: "10.0.0.1/32"})
	NewWithT(t).Expect(err).To(MatchError(ContainSubstring("incomplete")))
}

func TestObjectRefs(t *testing.T) {
	g := NewWithT(t)
	for _, s := range []string{"ns/name/key", "ConfigMap:ns/name/ca.crt"} {
		r, err := record.ParseObjectRef(s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.String()).To(Equal(s))
	}
	for _, s := range []string{"ns/name", "ns//key", "a/b/c/d"} {
		_, err := record.ParseObjectRef(s)
		g.Expect(err).To(HaveOccurred(), s)
	}
	parsed, _ := record.ParseObjectRef("ns/s/secret")
	g.Expect(parsed.Equal(record.ObjectRef{Namespace: "ns", Name: "s", Key: "secret"})).To(BeTrue(), "Kind Secret spelled out or not")
}

// Fingerprints live on the Secret: they change with the value, never name it.
func TestFingerprints(t *testing.T) {
	g := NewWithT(t)
	a, b := record.Fingerprint([]byte("value-one-1234")), record.Fingerprint([]byte("value-two-1234"))
	g.Expect(a).NotTo(Equal(b))
	g.Expect(a).NotTo(ContainSubstring("value-one"))
	ann := map[string]string{}
	g.Expect(record.SetFingerprints(ann, map[string]string{"secret": a})).To(BeTrue())
	g.Expect(record.SetFingerprints(ann, map[string]string{"secret": a})).To(BeFalse(), "unchanged")
	g.Expect(record.Fingerprints(ann)).To(Equal(map[string]string{"secret": a}))
	g.Expect(record.SetFingerprints(ann, nil)).To(BeTrue())
	g.Expect(ann).To(BeEmpty())
	g.Expect(record.Fingerprints(map[string]string{ipamv1alpha1.SecretFingerprintsAnnotation: "garbage"})).To(BeEmpty())
}
