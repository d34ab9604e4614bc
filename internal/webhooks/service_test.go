package webhooks_test

import (
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/webhooks"
)

const (
	zoneAnn      = ipamv1alpha1.ZoneAnnotation
	familyAnn    = ipamv1alpha1.IPFamilyAnnotation
	addressesAnn = ipamv1alpha1.AddressesAnnotation
	retentionAnn = ipamv1alpha1.RetentionPeriodDaysAnnotation
	denyAnn      = ipamv1alpha1.DenyExternalCleanupAnnotation
	secretAnn    = ipamv1alpha1.SecretAnnotation
	poolAnn      = ipamv1alpha1.PoolAnnotation
)

// servicePools are the GlobalVitistackIPPools a Service test works with; the names are
// unique per test (pools are cluster-scoped).
type servicePools struct {
	ns                                       string
	inetV4, inetV6, hnetV4, v6Only, v6OnlyZn string
}

// serviceSetup creates a namespace, the pools inet/IPv4, inet/IPv6, hnet-private/IPv4
// and <v6only-ns>/IPv6, and Secrets: "good" (32 characters), "nokey" (no "secret"
// key), "short" and "long" (values the IPAM-API refuses).
func serviceSetup(t *testing.T) servicePools {
	g := NewWithT(t)
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "svc-"}}
	g.Expect(env.Client.Create(ctx, nsObj)).To(Succeed())
	ns := nsObj.Name
	p := servicePools{ns: ns, inetV4: "inet-v4-" + ns, inetV6: "inet-v6-" + ns, hnetV4: "hnet-v4-" + ns,
		v6Only: "v6only-v6-" + ns, v6OnlyZn: "v6only-" + ns}
	for _, pool := range []struct {
		name, zone string
		fam        ipamv1alpha1.IPFamily
	}{{p.inetV4, "inet", ipamv1alpha1.IPv4}, {p.inetV6, "inet", ipamv1alpha1.IPv6}, {p.hnetV4, "hnet-private", ipamv1alpha1.IPv4}, {p.v6Only, p.v6OnlyZn, ipamv1alpha1.IPv6}} {
		g.Expect(env.Client.Create(ctx, &ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: pool.name},
			Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: pool.zone, IPFamily: pool.fam}})).To(Succeed())
	}
	for name, data := range map[string]map[string][]byte{
		"good":  {"secret": []byte(strings.Repeat("g00d", 8))},
		"nokey": {"password": []byte("s3cret-under-the-wrong-key")},
		"short": {"secret": []byte("s3cr3t!")},
		"long":  {"secret": []byte(strings.Repeat("L0ng", 17))},
	} {
		g.Expect(env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Type: corev1.SecretTypeOpaque, Data: data})).To(Succeed())
	}
	return p
}

func lbService(ns, name string, ann map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

// v6Only makes an IPv6-only Service; dualStack a dual-stack one (the test API server
// has dual-stack service ranges).
func v6Only(s *corev1.Service) { s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol} }

func dualStack(s *corev1.Service) {
	s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
}

func TestServiceWebhookRejectsBadAnnotations(t *testing.T) {
	p := serviceSetup(t)
	ns := p.ns
	cases := []struct {
		name   string
		ann    map[string]string
		mutate func(*corev1.Service)
		want   []string
		hidden []string // must not appear (secret values, problems there are not)
	}{
		// 1. unknown values
		{name: "unknown family", ann: map[string]string{familyAnn: "ipv5"},
			want: []string{`metadata.annotations[ipam.vitistack.io/ip-family]: Unsupported value: "ipv5": supported values: "ipv4", "ipv6", "dual"`}},
		{name: "unknown zone", ann: map[string]string{zoneAnn: "nowhere"},
			want: []string{`metadata.annotations[ipam.vitistack.io/zone]: Invalid value: "nowhere": unknown zone: no GlobalVitistackIPPool serves zone nowhere (known zones: `,
				"hnet-private, inet", p.v6OnlyZn,
				"); set ipam.vitistack.io/zone to a zone a GlobalVitistackIPPool serves, or create a GlobalVitistackIPPool with spec.zone=nowhere"}},
		// 2. families the Service cannot carry
		{name: "dual on a SingleStack Service", ann: map[string]string{zoneAnn: "inet", familyAnn: "dual"},
			want: []string{`metadata.annotations[ipam.vitistack.io/ip-family]: Invalid value: "dual": dual needs spec.ipFamilyPolicy PreferDualStack or RequireDualStack; this Service is SingleStack`}},
		{name: "ipv6 on an IPv4 Service", ann: map[string]string{zoneAnn: "inet", familyAnn: "ipv6"},
			want: []string{`metadata.annotations[ipam.vitistack.io/ip-family]: Invalid value: "ipv6": the Service's spec.ipFamilies [IPv4] cannot carry an ipv6 address`}},
		{name: "ipv4 on a dual-stack Service", ann: map[string]string{zoneAnn: "inet"}, mutate: dualStack,
			want: []string{`metadata.annotations[ipam.vitistack.io/ip-family]: Invalid value: "ipv4": gives the Service one address, but it has two IP families ` +
				`(spec.ipFamilies [IPv4 IPv6]) and MetalLB refuses one address for it: ask for dual, or set spec.ipFamilyPolicy SingleStack and ` +
				`spec.ipFamilies [IPv4] in the same change`}},
		{name: "ipv4 on an IPv6 Service", ann: map[string]string{zoneAnn: "inet"}, mutate: v6Only,
			want: []string{`metadata.annotations[ipam.vitistack.io/ip-family]: Invalid value: "ipv4": the Service's spec.ipFamilies [IPv6] cannot carry an ipv4 address`}},
		// 3. addresses
		{name: "two addresses of one family", ann: map[string]string{addressesAnn: "10.1.0.1,10.1.0.2"},
			want: []string{`metadata.annotations[ipam.vitistack.io/addresses]: Invalid value: "10.1.0.1,10.1.0.2": more than one ipv4 address: MetalLB takes one address per family`}},
		{name: "unparsable address", ann: map[string]string{addressesAnn: "10.1.0.300"},
			want: []string{`metadata.annotations[ipam.vitistack.io/addresses]: Invalid value: "10.1.0.300": "10.1.0.300" is not an IP address; give bare IP addresses, comma-separated, one per family`}},
		{name: "address of a family not asked for", ann: map[string]string{zoneAnn: "inet", addressesAnn: "2a05:1234::5"},
			want: []string{`metadata.annotations[ipam.vitistack.io/addresses]: Invalid value: "2a05:1234::5": has an ipv6 address, but ipam.vitistack.io/ip-family is "ipv4": remove it, or ask for dual`}},
		// 4. numbers and booleans
		{name: "retention that is no number", ann: map[string]string{retentionAnn: "ten"},
			want: []string{`metadata.annotations[ipam.vitistack.io/retention-period-days]: Invalid value: "ten": must be a whole number of days from 0 to 30`}},
		{name: "retention over 30 days", ann: map[string]string{retentionAnn: "31"},
			want: []string{`metadata.annotations[ipam.vitistack.io/retention-period-days]: Invalid value: "31": must be from 0 to 30 days`}},
		{name: "deny-external-cleanup that is no boolean", ann: map[string]string{denyAnn: "maybe"},
			want: []string{`metadata.annotations[ipam.vitistack.io/deny-external-cleanup]: Invalid value: "maybe": must be "true" or "false"`}},
		{name: "the default secret's keyword in capitals", ann: map[string]string{"ipam.vitistack.io/secret": "Default"},
			want: []string{`metadata.annotations[ipam.vitistack.io/secret]: Invalid value: "Default": "Default" is not a valid Secret name ` +
				`(lower-case letters, digits, '-' and '.'); the keyword for the provider's default secret is "default", in lower case`}},
		// 5. pools
		{name: "zone without a pool of the family", ann: map[string]string{zoneAnn: p.v6OnlyZn},
			want: []string{fmt.Sprintf(`metadata.annotations[ipam.vitistack.io/ip-family]: Invalid value: "ipv4": zone %s has no GlobalVitistackIPPool for ipv4: `+
				`create a GlobalVitistackIPPool with spec.zone=%s and spec.ipFamily=IPv4, or ask for another family`, p.v6OnlyZn, p.v6OnlyZn)}},
		{name: "dual in a zone without IPv6 pools", ann: map[string]string{zoneAnn: "hnet-private", familyAnn: "dual"}, mutate: dualStack,
			want: []string{`metadata.annotations[ipam.vitistack.io/ip-family]: Invalid value: "dual": zone hnet-private has no GlobalVitistackIPPool for ipv6: ` +
				`create a GlobalVitistackIPPool with spec.zone=hnet-private and spec.ipFamily=IPv6, or ask for another family`},
			hidden: []string{"for ipv4"}},
		{name: "named pool that does not exist", ann: map[string]string{zoneAnn: "inet", poolAnn: p.inetV4 + ", missing-" + ns},
			want: []string{fmt.Sprintf(`metadata.annotations[ipam.vitistack.io/pool]: Invalid value: "%s, missing-%s": GlobalVitistackIPPool missing-%s does not exist: `+
				`create it, or remove it from ipam.vitistack.io/pool`, p.inetV4, ns, ns)}},
		{name: "named pools that miss the family", ann: map[string]string{zoneAnn: "inet", poolAnn: p.inetV6},
			want: []string{fmt.Sprintf(`metadata.annotations[ipam.vitistack.io/pool]: Invalid value: "%s": none of the named pools serves zone inet with family ipv4 `+
				`(named: %s (zone inet, IPv6)): add a GlobalVitistackIPPool with spec.zone=inet and spec.ipFamily=IPv4 to ipam.vitistack.io/pool`, p.inetV6, p.inetV6)}},
		{name: "named pools that cover one family of dual", ann: map[string]string{zoneAnn: "inet", familyAnn: "dual", poolAnn: p.inetV4}, mutate: dualStack,
			want: []string{fmt.Sprintf(`none of the named pools serves zone inet with family ipv6 (named: %s (zone inet, IPv4)): `+
				`add a GlobalVitistackIPPool with spec.zone=inet and spec.ipFamily=IPv6 to ipam.vitistack.io/pool`, p.inetV4)},
			hidden: []string{"family ipv4"}},
		{name: "named pool of another zone", ann: map[string]string{zoneAnn: "inet", poolAnn: p.hnetV4},
			want: []string{fmt.Sprintf(`none of the named pools serves zone inet with family ipv4 (named: %s (zone hnet-private, IPv4))`, p.hnetV4)}},
		// 6. secrets
		{name: "secret that does not exist", ann: map[string]string{secretAnn: "missing"},
			want: []string{fmt.Sprintf(`metadata.annotations[ipam.vitistack.io/secret]: Invalid value: "missing": Secret %s/missing does not exist: `+
				`create an Opaque Secret missing in namespace %s with key "secret" holding 8 to 64 characters, or set ipam.vitistack.io/secret to "default"`, ns, ns)}},
		{name: "secret without the key", ann: map[string]string{secretAnn: "nokey"},
			want: []string{fmt.Sprintf(`metadata.annotations[ipam.vitistack.io/secret]: Invalid value: "nokey": Secret %s/nokey has no key "secret": `+
				`put the IPAM-API secret (8 to 64 characters) under key "secret"`, ns)},
			hidden: []string{"s3cret-under-the-wrong-key"}},
		{name: "secret value too short", ann: map[string]string{secretAnn: "short"},
			want: []string{fmt.Sprintf(`metadata.annotations[ipam.vitistack.io/secret]: Invalid value: "short": the value under key "secret" of Secret %s/short `+
				`must be 8 to 64 characters long for the IPAM-API`, ns)},
			hidden: []string{"s3cr3t!"}},
		{name: "secret value too long", ann: map[string]string{secretAnn: "long"},
			want:   []string{fmt.Sprintf(`Secret %s/long must be 8 to 64 characters long for the IPAM-API`, ns)},
			hidden: []string{"L0ngL0ng"}},
		{name: "secret name that is no object name", ann: map[string]string{secretAnn: "My_Secret"},
			want: []string{fmt.Sprintf(`metadata.annotations[ipam.vitistack.io/secret]: Invalid value: "My_Secret": must be "default" or the name of a Secret in namespace %s: `, ns)}},
		// Every problem is reported at once.
		{name: "several problems", ann: map[string]string{zoneAnn: "nowhere", retentionAnn: "-1", denyAnn: "yes", secretAnn: "missing"},
			want: []string{`ipam.vitistack.io/zone]: Invalid value: "nowhere": unknown zone`, `ipam.vitistack.io/retention-period-days]: Invalid value: "-1": must be from 0 to 30 days`,
				`ipam.vitistack.io/deny-external-cleanup]: Invalid value: "yes"`, `ipam.vitistack.io/secret]: Invalid value: "missing"`}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			svc := lbService(ns, fmt.Sprintf("bad-%d", i), tc.ann)
			if tc.mutate != nil {
				tc.mutate(svc)
			}
			err := env.Client.Create(ctx, svc)
			g.Expect(err).To(HaveOccurred())
			g.Expect(err.Error()).To(HavePrefix(fmt.Sprintf(`admission webhook "validation.service.ipam.vitistack.io" denied the request: Service "bad-%d" is invalid: `, i)))
			for _, want := range tc.want {
				g.Expect(err.Error()).To(ContainSubstring(want))
			}
			for _, h := range tc.hidden {
				g.Expect(err.Error()).NotTo(ContainSubstring(h))
			}
			// Nothing was stored (no side effects: the controller never sees it).
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(svc), &corev1.Service{})).NotTo(Succeed())
		})
	}
}

func TestServiceWebhookAllows(t *testing.T) {
	p := serviceSetup(t)
	ns := p.ns
	garbage := map[string]string{zoneAnn: "nowhere", familyAnn: "ipv5", addressesAnn: "no", retentionAnn: "99", denyAnn: "maybe", secretAnn: "missing", poolAnn: "none"}
	cases := []struct {
		name   string
		ns     string
		ann    map[string]string
		mutate func(*corev1.Service)
	}{
		{name: "no annotations: the default zone's IPv4 pool"},
		{name: "valid ipv4 with every annotation", ann: map[string]string{
			zoneAnn: "inet", familyAnn: "ipv4", addressesAnn: "83.118.168.10", retentionAnn: "30", denyAnn: "true",
			secretAnn: "good", poolAnn: p.inetV4 + "," + p.inetV6, ipamv1alpha1.AllowLocalSharedIPAnnotation: "pre-shared-key-x"}},
		{name: "address as a host CIDR", ann: map[string]string{zoneAnn: "inet", addressesAnn: "83.118.168.11/32"}},
		{name: "the default secret", ann: map[string]string{secretAnn: "default"}},
		{name: "valid ipv6", ann: map[string]string{zoneAnn: "inet", familyAnn: "ipv6", addressesAnn: "2a05:1234::10"}, mutate: v6Only},
		{name: "valid dual", ann: map[string]string{zoneAnn: "inet", familyAnn: "dual", addressesAnn: "83.118.168.12, 2a05:1234::12"}, mutate: dualStack},
		{name: "valid dual with named pools", ann: map[string]string{zoneAnn: "inet", familyAnn: "dual", poolAnn: p.inetV6 + "," + p.inetV4},
			mutate: func(s *corev1.Service) { s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack) }},
		{name: "a ClusterIP Service with garbage annotations", ann: garbage,
			mutate: func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeClusterIP }},
		{name: "a LoadBalancer Service in kube-system with garbage annotations", ns: "kube-system", ann: garbage},
		{name: "a LoadBalancer Service of another class with garbage annotations", ann: garbage,
			mutate: func(s *corev1.Service) { s.Spec.LoadBalancerClass = ptr.To("example.com/other") }},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			svcNS := ns
			if tc.ns != "" {
				svcNS = tc.ns
			}
			svc := lbService(svcNS, fmt.Sprintf("ok-%s-%d", ns, i), tc.ann)
			if tc.mutate != nil {
				tc.mutate(svc)
			}
			g.Expect(env.Client.Create(ctx, svc)).To(Succeed())
			g.Expect(env.Client.Delete(ctx, svc)).To(Succeed())
		})
	}

	t.Run("deleting is allowed", func(t *testing.T) {
		g := NewWithT(t)
		svc := lbService(ns, "deleted", map[string]string{zoneAnn: "inet"})
		g.Expect(env.Client.Create(ctx, svc)).To(Succeed())
		g.Expect(env.Client.Delete(ctx, svc)).To(Succeed())
	})
}

// Updates are judged on the new object, except those that change nothing the
// annotations mean or only remove annotations: a Service that became invalid later (its
// Secret changed, a pool went away) can still be edited, cleaned up and deleted.
func TestServiceWebhookUpdates(t *testing.T) {
	g := NewWithT(t)
	p := serviceSetup(t)
	ns := p.ns
	svc := lbService(ns, "web", map[string]string{zoneAnn: "inet", retentionAnn: "5", secretAnn: "good"})
	g.Expect(env.Client.Create(ctx, svc)).To(Succeed())
	update := func(mutate func(*corev1.Service)) error {
		return updateService(client.ObjectKeyFromObject(svc), mutate)
	}

	// A bad new value is refused.
	err := update(func(s *corev1.Service) { s.Annotations[zoneAnn] = "nowhere" })
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring(`metadata.annotations[ipam.vitistack.io/zone]: Invalid value: "nowhere": unknown zone`))
	err = update(func(s *corev1.Service) { s.Annotations[secretAnn] = "short" })
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring(`Secret ` + ns + `/short must be 8 to 64 characters long`))

	// The Secret goes bad after the Service was admitted. (The controller may be adding
	// its finalizer to the Secret at the same time: retry on conflict.)
	g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sec := &corev1.Secret{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "good"}, sec); err != nil {
			return err
		}
		sec.Data["secret"] = []byte("tiny")
		return env.Client.Update(ctx, sec)
	})).To(Succeed())

	// Edits that leave the annotations' meaning alone, or only remove annotations, pass.
	g.Expect(update(func(s *corev1.Service) { s.Labels = map[string]string{"app": "web"} })).To(Succeed())
	g.Expect(update(func(s *corev1.Service) { s.Spec.Ports[0].Port = 8080 })).To(Succeed())
	g.Expect(update(func(s *corev1.Service) { delete(s.Annotations, retentionAnn) })).To(Succeed())
	// A changed annotation is judged on the whole new object.
	err = update(func(s *corev1.Service) { s.Annotations[retentionAnn] = "7" })
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring(`Secret ` + ns + `/good must be 8 to 64 characters long`))
	g.Expect(err.Error()).NotTo(ContainSubstring("tiny"))
	// Turning the Service into another type is not judged, whatever its annotations.
	g.Expect(update(func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
		s.Annotations[zoneAnn] = "nowhere"
	})).To(Succeed())
	// Back to LoadBalancer it is judged again.
	err = update(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer })
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring(`Invalid value: "nowhere": unknown zone`))

	g.Expect(env.Client.Delete(ctx, svc)).To(Succeed())
}

// A dual-stack Service goes to ipv4 by its ip-family annotation and SingleStack in one
// change (the annotation alone is refused: MetalLB refuses one address for a Service of
// two families): the addresses annotation still names the IPv6 address the controller
// wrote, which it takes out, so the update passes. A user who writes an address of a
// family not asked for is refused.
func TestServiceWebhookLetsAFamilyGo(t *testing.T) {
	g := NewWithT(t)
	p := serviceSetup(t)
	svc := lbService(p.ns, "dual", map[string]string{zoneAnn: "inet", familyAnn: "dual", addressesAnn: "83.118.168.5,2a05:1234::5"})
	dualStack(svc)
	g.Expect(env.Client.Create(ctx, svc)).To(Succeed())
	update := func(mutate func(*corev1.Service)) error {
		return updateService(client.ObjectKeyFromObject(svc), mutate)
	}
	err := update(func(s *corev1.Service) { s.Annotations[familyAnn] = "ipv4" })
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring(`set spec.ipFamilyPolicy SingleStack and spec.ipFamilies [IPv4] in the same change`))
	g.Expect(update(func(s *corev1.Service) {
		s.Annotations[familyAnn] = "ipv4"
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	})).To(Succeed())
	err = update(func(s *corev1.Service) { s.Annotations[addressesAnn] = "83.118.168.6,2a05:1234::6" })
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring(`metadata.annotations[ipam.vitistack.io/addresses]: Invalid value: "83.118.168.6,2a05:1234::6": ` +
		`has an ipv6 address, but ipam.vitistack.io/ip-family is "ipv4": remove it, or ask for dual`))
	g.Expect(env.Client.Delete(ctx, svc)).To(Succeed())
}

// Two Services may share an address only on ports that do not overlap, as MetalLB
// shares it only then: the second one asking for the first one's address with the same
// share key on the same port is refused, naming the other Service and the port; on
// another port it is admitted, and then refused a change of its port to the first one's.
func TestServiceWebhookRefusesASharedAddressOnAnOverlappingPort(t *testing.T) {
	g := NewWithT(t)
	p := serviceSetup(t)
	ann := map[string]string{zoneAnn: "inet", addressesAnn: "83.118.168.7", "ipam.vitistack.io/allow-local-shared-ip": "web"}
	g.Expect(env.Client.Create(ctx, lbService(p.ns, "http", ann))).To(Succeed())
	err := env.Client.Create(ctx, lbService(p.ns, "http-again", ann))
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring(`metadata.annotations[ipam.vitistack.io/allow-local-shared-ip]: Invalid value: "web": Service ` + p.ns +
		`/http shares this key and the address 83.118.168.7, and also uses TCP/80: MetalLB shares an address only between Services whose ` +
		`ports do not overlap; use another port, address or share key`))
	https := lbService(p.ns, "https", ann)
	https.Spec.Ports[0].Port = 443
	g.Expect(env.Client.Create(ctx, https)).To(Succeed())

	// Editing the port of the one on 443 to 80, and nothing else, is refused as well.
	err = updateService(client.ObjectKeyFromObject(https), func(s *corev1.Service) { s.Spec.Ports[0].Port = 80 })
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring(`Service ` + p.ns + `/http shares this key and the address 83.118.168.7, and also uses TCP/80`))
	g.Expect(updateService(client.ObjectKeyFromObject(https), func(s *corev1.Service) { s.Spec.Ports[0].Port = 8443 })).To(Succeed())
}

// updateService changes the Service as stored, retrying on a conflict.
func updateService(key client.ObjectKey, mutate func(*corev1.Service)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s := &corev1.Service{}
		if err := env.Client.Get(ctx, key, s); err != nil {
			return err
		}
		mutate(s)
		return env.Client.Update(ctx, s)
	})
}

// The webhook configuration installed from config/services sends only LoadBalancer
// Services, outside the system namespaces.
func TestServiceWebhookConfiguration(t *testing.T) {
	g := NewWithT(t)
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: "service-validating-webhook-configuration"}, cfg)).To(Succeed())
	g.Expect(cfg.Webhooks).To(HaveLen(1))
	wh := cfg.Webhooks[0]
	g.Expect(wh.Name).To(Equal("validation.service.ipam.vitistack.io"))
	g.Expect(*wh.ClientConfig.URL).To(HaveSuffix("/validate--v1-service"))
	g.Expect(wh.MatchConditions).To(ConsistOf(HaveField("Expression", "has(object.spec.type) && object.spec.type == 'LoadBalancer'")))
	g.Expect(wh.NamespaceSelector.MatchExpressions).To(ConsistOf(HaveField("Values",
		ConsistOf("kube-system", "kube-public", "kube-node-lease", "capi-ipam-vitistack-system"))))
	g.Expect(*wh.TimeoutSeconds).To(BeEquivalentTo(5))
	g.Expect(*wh.FailurePolicy).To(Equal(admissionregistrationv1.Fail))
	g.Expect(*wh.SideEffects).To(Equal(admissionregistrationv1.SideEffectClassNone))
}

// A Service of one family switches to dual stack under RequireDualStack: under
// PreferDualStack MetalLB would give it an address of the new family itself, so the
// switch is refused, naming the policy to use.
func TestServiceWebhookSwitchesToDualStackOnlyRequired(t *testing.T) {
	g := NewWithT(t)
	p := serviceSetup(t)
	svc := lbService(p.ns, "grow", map[string]string{zoneAnn: "inet"})
	g.Expect(env.Client.Create(ctx, svc)).To(Succeed())
	update := func(policy corev1.IPFamilyPolicy) error {
		return updateService(client.ObjectKeyFromObject(svc), func(s *corev1.Service) {
			s.Annotations[familyAnn] = "dual"
			s.Spec.IPFamilyPolicy = ptr.To(policy)
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		})
	}
	err := update(corev1.IPFamilyPolicyPreferDualStack)
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring(`spec.ipFamilyPolicy: Invalid value: "PreferDualStack": a switch to dual stack needs RequireDualStack`))
	g.Expect(update(corev1.IPFamilyPolicyRequireDualStack)).To(Succeed())
	g.Expect(env.Client.Delete(ctx, svc)).To(Succeed())

	// A Service of two IP families that asked for one (refused since, but made before)
	// has no address from MetalLB: asking for dual under PreferDualStack fixes it.
	old := lbService(p.ns, "two", map[string]string{zoneAnn: "inet", familyAnn: "dual"})
	dualStack(old)
	g.Expect(env.Client.Create(ctx, old)).To(Succeed())
	before := &corev1.Service{}
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(old), before)).To(Succeed())
	before.Annotations[familyAnn] = "ipv4"
	now := before.DeepCopy()
	now.Annotations[familyAnn] = "dual"
	_, err = (&webhooks.Service{Client: env.Client, APIReader: env.Client, DefaultZone: "hnet-private"}).ValidateUpdate(ctx, before, now)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(env.Client.Delete(ctx, old)).To(Succeed())
}
