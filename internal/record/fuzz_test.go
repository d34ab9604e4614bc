package record_test

import (
	"maps"
	"testing"

	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
)

// The registration record on a claim is outside input (anyone who may edit the claim
// may edit it): a record that reads without an error is complete, and what it reads
// as is written back and read again as the same record.
func FuzzOnClaim(f *testing.F) {
	good := &ipamv1.IPAddressClaim{}
	full().SetOn(good)
	f.Add(good.Annotations[ipamv1alpha1.RegistrationAnnotation])
	f.Add(`{"endpoint":"http://x","zone":"inet","ipFamily":"ipv4","secret":{"namespace":"n","name":"s","key":"secret"},"attempt":"2026-01-02T03:04:05Z"}`)
	f.Add(`{"endpoint":"","zone":"inet"}`)
	f.Add(`{"retentionPeriodDays":"7"}`)
	f.Add(`null`)
	f.Add(`[]`)
	f.Add(``)
	f.Fuzz(func(t *testing.T, raw string) {
		r, err := record.OnClaim(map[string]string{ipamv1alpha1.RegistrationAnnotation: raw})
		if err != nil {
			return
		}
		if r == nil || r.Endpoint == "" || r.Zone == "" || r.Family == "" || r.Secret.Name == "" {
			t.Fatalf("%q read as an incomplete record without an error: %+v", raw, r)
		}
		c := &ipamv1.IPAddressClaim{}
		r.SetOn(c)
		again, err := record.OnClaim(c.Annotations)
		if err != nil {
			t.Fatalf("a record written back does not read: %v", err)
		}
		if again.Key() != r.Key() || again.HostKey() != r.HostKey() || !again.Attempt.Equal(r.Attempt) || !again.Secret.Equal(r.Secret) {
			t.Fatalf("written back, %q reads as %+v, was %+v", raw, again, r)
		}
	})
}

// The record on an IPAddress (labels and annotations): one that reads is complete and
// reads the same after being written back.
func FuzzOnAddress(f *testing.F) {
	labels, ann := map[string]string{}, map[string]string{}
	full().WriteTo(labels, ann)
	f.Add(labels[ipamv1alpha1.ZoneLabel], labels[ipamv1alpha1.IPFamilyLabel], ann[ipamv1alpha1.RegisteredEndpointAnnotation],
		ann[ipamv1alpha1.RegisteredAddressAnnotation], ann[ipamv1alpha1.RegisteredSecretRefAnnotation],
		ann[ipamv1alpha1.RegisteredCABundleRefAnnotation], ann[ipamv1alpha1.RegisteredRetentionPeriodDaysAnnotation])
	f.Add("inet", "ipv4", "http://x", "", "ns/s", "", "-1")
	f.Add("inet", "ipv6", "http://x/v2/", "2001:db8::1/128", ":ns/s/k", "ConfigMap:ns/ca/", "99999999999999999999")
	f.Fuzz(func(t *testing.T, zone, family, endpoint, address, secret, ca, retention string) {
		labels := map[string]string{ipamv1alpha1.ZoneLabel: zone, ipamv1alpha1.IPFamilyLabel: family}
		ann := map[string]string{
			ipamv1alpha1.RegisteredEndpointAnnotation: endpoint, ipamv1alpha1.RegisteredAddressAnnotation: address,
			ipamv1alpha1.RegisteredSecretRefAnnotation: secret, ipamv1alpha1.RegisteredCABundleRefAnnotation: ca,
			ipamv1alpha1.RegisteredRetentionPeriodDaysAnnotation: retention,
		}
		r, err := record.OnAddress(labels, ann)
		if err != nil {
			return
		}
		if r == nil || r.Endpoint == "" || r.Zone == "" || r.Family == "" || r.Secret.Name == "" || r.Phase != record.PhaseRegistered {
			t.Fatalf("read as an incomplete record without an error: %+v", r)
		}
		l2, a2 := maps.Clone(labels), map[string]string{}
		r.WriteTo(l2, a2)
		again, err := record.OnAddress(l2, a2)
		if err != nil {
			t.Fatalf("a record written back does not read: %v", err)
		}
		if again.Key() != r.Key() || again.HostKey() != r.HostKey() || !again.Secret.Equal(r.Secret) || !again.CABundle.Equal(r.CABundle) ||
			again.RetentionPeriodDays != r.RetentionPeriodDays {
			t.Fatalf("written back, reads as %+v, was %+v", again, r)
		}
	})
}

// Secret and CA bundle references (namespace/name/key, with Kind: in front): one that
// parses names all three parts and reads the same from what String writes.
func FuzzParseObjectRef(f *testing.F) {
	for _, s := range []string{"ns/name/key", "ConfigMap:ns/ca/ca.crt", "Secret:ns/s/secret", ":ns/s/k", "a:b:c/d/e", "ns/name", "/ /x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := record.ParseObjectRef(s)
		if err != nil || s == "" {
			return
		}
		if r.Namespace == "" || r.Name == "" || r.Key == "" {
			t.Fatalf("%q parsed with an empty part: %+v", s, r)
		}
		again, err := record.ParseObjectRef(r.String())
		if err != nil || !again.Equal(r) {
			t.Fatalf("%q: String %q reads as %+v (%v), was %+v", s, r.String(), again, err, r)
		}
	})
}
