package controllers_test

import (
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
)

// The claims' part of the bad-input matrix (the pools' and the Services' parts are the
// webhook suites', refused at admission): every bad claim, annotation or pool a claim
// can meet, on the real API server with the manager and its webhooks, ends as Ready=False
// with the exact reason, a message that names the field and the fix, and one Warning
// event of the named reason. Afterwards the IPAM-API holds nothing for the namespace,
// and every claim can be deleted at once.
func TestBadClaimInputs(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	pools := map[string]ipamv1alpha1.VitistackIPPoolSpec{
		"inet-v4":    routedPool("inet", ipamv1alpha1.IPv4),
		"subnet":     subnetPool("hnet-private", ipamv1alpha1.IPv4, "10.70.0.0/28", "10.70.0.1", "10.70.0.5"),
		"nowhere":    routedPool("nowhere", ipamv1alpha1.IPv4),
		"private-v6": routedPool("hnet-private", ipamv1alpha1.IPv6),
	}
	for name, spec := range pools {
		newPool(t, ns.Name, name, spec)
	}
	for name, value := range map[string]string{"short": "abc", "long": strings.Repeat("L", 65)} {
		g.Expect(env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name},
			Data: map[string][]byte{"secret": []byte(value)}})).To(Succeed())
	}
	g.Expect(env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "nokey"},
		Data: map[string][]byte{"password": []byte("s3cret-under-the-wrong-key")}})).To(Succeed())
	registerDirect(t, `{"secret":"another-owners-secret","zone":"inet","ip_family":"ipv4","address":"83.118.168.200/32",`+
		`"service":{"service_name":"elsewhere","namespace_id":"x","cluster_id":"y"}}`)

	const (
		addresses = ipamv1alpha1.AddressesAnnotation
		retention = ipamv1alpha1.RetentionPeriodDaysAnnotation
		deny      = ipamv1alpha1.DenyExternalCleanupAnnotation
		secret    = ipamv1alpha1.SecretAnnotation
	)
	cases := []struct {
		name, pool string
		ann        map[string]string
		reason     string   // Ready=False reason
		event      string   // Warning event reason ("" = reason)
		texts      []string // in the message: the field and the fix
	}{
		{"address that is no address", "inet-v4", map[string]string{addresses: "10.1.0.300"}, "InvalidAnnotation", "InvalidAnnotation",
			[]string{"annotation ipam.vitistack.io/addresses", "give bare addresses or host CIDRs, comma-separated"}},
		{"two addresses of one family", "inet-v4", map[string]string{addresses: "83.118.168.1,83.118.168.2"}, "InvalidAnnotation", "InvalidAnnotation",
			[]string{"annotation ipam.vitistack.io/addresses", "more than one ipv4 address", "give one per family"}},
		{"no address of the pool's family", "inet-v4", map[string]string{addresses: "2a05:1234::5"}, "InvalidAnnotation", "InvalidAnnotation",
			[]string{"annotation ipam.vitistack.io/addresses", `"2a05:1234::5" has no ipv4 address for pool inet-v4`}},
		{"address outside the zone", "inet-v4", map[string]string{addresses: "192.0.2.5"}, "AddressNotInZone", "AddressNotInZone",
			[]string{"address 192.0.2.5/32 does not belong to zone inet", "request an address of the zone"}},
		{"address held under another secret", "inet-v4", map[string]string{addresses: "83.118.168.200"}, "AddressTaken", "AddressTaken",
			[]string{"address 83.118.168.200/32 is held under another secret in zone inet", "request another address, or use the secret that owns it"}},
		{"subnet: the gateway asked for", "subnet", map[string]string{addresses: "10.70.0.1"}, "InvalidAnnotation", "InvalidAnnotation",
			[]string{"annotation ipam.vitistack.io/addresses", "10.70.0.1/32 is not a usable address of subnet 10.70.0.0/28"}},
		{"subnet: an excluded address asked for", "subnet", map[string]string{addresses: "10.70.0.5"}, "InvalidAnnotation", "InvalidAnnotation",
			[]string{"10.70.0.5/32 is not a usable address of subnet 10.70.0.0/28", "excluded addresses are not"}},
		{"subnet: the broadcast address asked for", "subnet", map[string]string{addresses: "10.70.0.15"}, "InvalidAnnotation", "InvalidAnnotation",
			[]string{"10.70.0.15/32 is not a usable address of subnet 10.70.0.0/28"}},
		{"subnet: an address outside the subnet", "subnet", map[string]string{addresses: "10.71.0.9"}, "InvalidAnnotation", "InvalidAnnotation",
			[]string{"10.71.0.9/32 is not a usable address of subnet 10.70.0.0/28"}},
		{"retention that is no number", "inet-v4", map[string]string{retention: "ten"}, "InvalidAnnotation", "InvalidAnnotation",
			[]string{"annotation ipam.vitistack.io/retention-period-days", `"ten" is not a whole number of days from 0 to 30`}},
		{"retention over 30 days", "inet-v4", map[string]string{retention: "31"}, "InvalidAnnotation", "InvalidAnnotation",
			[]string{"annotation ipam.vitistack.io/retention-period-days", `"31" is not a whole number of days from 0 to 30`}},
		{"negative retention", "inet-v4", map[string]string{retention: "-1"}, "InvalidAnnotation", "InvalidAnnotation",
			[]string{`"-1" is not a whole number of days from 0 to 30`}},
		{"deny-external-cleanup that is no boolean", "inet-v4", map[string]string{deny: "maybe"}, "InvalidAnnotation", "InvalidAnnotation",
			[]string{"annotation ipam.vitistack.io/deny-external-cleanup", `"maybe" is not "true" or "false"`}},
		{"secret that does not exist", "inet-v4", map[string]string{secret: "nope"}, "SecretNotFound", "",
			[]string{"Secret " + ns.Name + "/nope with key secret not found", "create it", "or change the ipam.vitistack.io/secret annotation or the pool's secretRef"}},
		{"secret without the key", "inet-v4", map[string]string{secret: "nokey"}, "SecretNotFound", "",
			[]string{"Secret " + ns.Name + `/nokey has no key "secret": add the key "secret" with the IPAM-API secret (8 to 64 characters) to it`}},
		{"the default secret's keyword in capitals", "inet-v4", map[string]string{secret: "Default"}, "InvalidAnnotation", "InvalidAnnotation",
			[]string{"annotation ipam.vitistack.io/secret", `"Default" is not a valid Secret name`, `the keyword for the provider's default secret is "default"`}},
		{"secret value too short", "inet-v4", map[string]string{secret: "short"}, "SecretInvalid", "",
			[]string{"the value of Secret " + ns.Name + "/short key secret must be 8 to 64 characters long for the IPAM-API (it has 3)"}},
		{"secret value too long", "inet-v4", map[string]string{secret: "long"}, "SecretInvalid", "",
			[]string{"must be 8 to 64 characters long for the IPAM-API (it has 65)"}},
		{"cluster-id override the pool does not allow", "inet-v4", map[string]string{ipamv1alpha1.ClusterIDAnnotation: "theirs"}, "IdentityOverrideNotAllowed",
			"IdentityOverrideNotAllowed", []string{"annotation ipam.vitistack.io/cluster-id", "does not allow claims to choose their IPAM-API identity",
				"set spec.allowIdentityOverrides: true on the pool"}},
		{"service-name override the pool does not allow", "inet-v4", map[string]string{ipamv1alpha1.ServiceNameAnnotation: "db"}, "IdentityOverrideNotAllowed",
			"IdentityOverrideNotAllowed", []string{"annotation ipam.vitistack.io/service-name", "remove the annotation"}},
		{"namespace-id override the pool does not allow", "inet-v4", map[string]string{ipamv1alpha1.NamespaceIDAnnotation: "x"}, "IdentityOverrideNotAllowed",
			"IdentityOverrideNotAllowed", []string{"annotation ipam.vitistack.io/namespace-id"}},
		{"pool that does not exist", "missing", nil, "PoolNotReady", "",
			[]string{`VitistackIPPool "missing" not found`}},
		{"pool of a zone the IPAM-API does not know", "nowhere", nil, "PoolNotReady", "",
			[]string{"invalid zone 'nowhere'", "fix the pool"}},
		{"pool of a family the zone does not have", "private-v6", nil, "PoolNotReady", "",
			[]string{"no prefixes found for zone hnet-private with IP family ipv6", "fix the pool's spec.zone or spec.ipFamily"}},
	}
	claims := make([]*ipamv1.IPAddressClaim, len(cases))
	for i, c := range cases {
		claims[i] = newClaim(t, ns.Name, fmt.Sprintf("bad-%02d", i), c.pool, c.ann)
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			cond := readyCondition(t, claims[i], metav1.ConditionFalse, c.reason)
			for _, text := range c.texts {
				g.Expect(cond.Message).To(ContainSubstring(text))
			}
			event := c.event
			if event == "" {
				event = c.reason
			}
			hasEvent(t, claims[i], corev1.EventTypeWarning, event, "")
		})
	}
	// Nothing was registered for the namespace, and every claim goes at once.
	for _, r := range env.Sim.Registrations() {
		for _, h := range r.Holders {
			g.Expect(h.NamespaceID).NotTo(Equal(string(ns.UID)), "%s was registered for a bad claim", r.Address)
		}
	}
	for _, c := range claims {
		deleteAndWait(t, c)
	}
}
