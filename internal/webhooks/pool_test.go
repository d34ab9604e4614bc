package webhooks_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/testenv"
)

var (
	env *testenv.Env
	ctx = context.Background()
)

func TestMain(m *testing.M) {
	var err error
	env, err = testenv.Start(ctx, testenv.DefaultOptions())
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the test environment:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}

func namespace(t *testing.T) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "pool-"}}
	NewWithT(t).Expect(env.Client.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// Every static rule is enforced by the API server (CEL and OpenAPI), with a message
// that names the field and the fix.
func TestPoolValidationRejectsBadSpecs(t *testing.T) {
	ns := namespace(t)
	valid := func() ipamv1alpha1.VitistackIPPoolSpec {
		return ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4}
	}
	cases := []struct {
		name   string
		global bool
		mutate func(s *ipamv1alpha1.VitistackIPPoolSpec)
		want   string
	}{
		{"gateway of the other family", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) { s.Gateway = "2a05:1234::1" },
			"gateway must be an address of the pool's ipFamily"},
		{"gateway that is no address", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) { s.Gateway = "10.0.0.300" },
			"gateway must be a valid IP address"},
		{"IPv4 prefix over 32", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) { s.Prefix = ptr.To[int32](33) },
			"prefix must be between 1 and 32 for ipFamily IPv4"},
		{"prefix over 128", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) {
			s.IPFamily = ipamv1alpha1.IPv6
			s.Prefix = ptr.To[int32](129)
		}, "spec.prefix: Invalid value: 129: spec.prefix in body should be less than or equal to 128"},
		{"retention over 30 days", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) { s.RetentionPeriodDays = ptr.To[int32](31) },
			"spec.retentionPeriodDays: Invalid value: 31: spec.retentionPeriodDays in body should be less than or equal to 30"},
		{"zone that is not a DNS label", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) { s.Zone = "Hnet_Private" },
			"spec.zone: Invalid value: \"Hnet_Private\": spec.zone in body should match"},
		{"unknown family", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) { s.IPFamily = "dual" },
			`spec.ipFamily: Unsupported value: "dual": supported values: "IPv4", "IPv6"`},
		{"endpoint that is no URL", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) { s.Endpoint = "ipam-api.vitistack.io" },
			"endpoint must be an http:// or https:// URL"},
		{"CA bundle without https", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) {
			s.Endpoint = "http://ipam.example"
			s.CABundleRef = &ipamv1alpha1.CABundleReference{Name: "ca"}
		}, "caBundleRef needs an https:// endpoint"},
		{"namespaced pool naming another namespace's secret", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) {
			s.SecretRef = &ipamv1alpha1.SecretReference{Name: "s", Namespace: "elsewhere"}
		}, "secretRef.namespace must be empty for a VitistackIPPool"},
		{"subnet of the other family", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) { s.Subnet = "2a05:1234::/64" },
			"subnet must be a CIDR of the pool's ipFamily"},
		{"subnet with host bits", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) { s.Subnet = "10.20.0.5/24" },
			"subnet must be a network in CIDR form, for example 10.20.0.0/24"},
		{"gateway outside the subnet", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) {
			s.Subnet, s.Gateway = "10.20.0.0/24", "10.21.0.1"
		}, "gateway must lie inside subnet"},
		{"excluded address outside the subnet", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) {
			s.Subnet, s.ExcludedAddresses = "10.20.0.0/24", []string{"10.20.0.5", "10.20.1.0-10.20.1.9"}
		}, "every excludedAddresses entry must be an address, a CIDR or a range first-last inside subnet"},
		{"excluded addresses without a subnet", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) { s.ExcludedAddresses = []string{"10.20.0.5"} },
			"excludedAddresses needs subnet"},
		{"prefix longer than the subnet's", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) {
			s.Subnet, s.Prefix = "10.20.0.0/24", ptr.To[int32](28)
		}, "prefix must not be longer than the subnet's prefix length"},
		{"excluded range written backwards", false, func(s *ipamv1alpha1.VitistackIPPoolSpec) {
			s.Subnet, s.ExcludedAddresses = "10.20.0.0/24", []string{"10.20.0.9-10.20.0.5"}
		}, "spec.excludedAddresses: Invalid value"},
		{"global pool without the secret's namespace", true, func(s *ipamv1alpha1.VitistackIPPoolSpec) {
			s.SecretRef = &ipamv1alpha1.SecretReference{Name: "s"}
		}, "secretRef.namespace is required for a GlobalVitistackIPPool"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			spec := valid()
			tc.mutate(&spec)
			var obj client.Object = &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("bad-%d", i)}, Spec: spec}
			if tc.global {
				obj = &ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bad-%s-%d", ns, i)}, Spec: spec}
			}
			err := env.Client.Create(ctx, obj)
			g.Expect(err).To(HaveOccurred())
			g.Expect(err.Error()).To(ContainSubstring(tc.want))
			// Nothing was stored: no controller ever sees the bad pool.
			g.Expect(apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj))).To(BeTrue(), "the refused pool was stored")
		})
	}

	t.Run("a full valid spec is accepted, with defaults", func(t *testing.T) {
		g := NewWithT(t)
		pool := &ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: "full-" + ns}, Spec: ipamv1alpha1.VitistackIPPoolSpec{
			Zone: "inet", IPFamily: ipamv1alpha1.IPv6, Prefix: ptr.To[int32](64), Gateway: "2a05:1234::1",
			SecretRef: &ipamv1alpha1.SecretReference{Name: "s", Namespace: ns}, RetentionPeriodDays: ptr.To[int32](30),
			DenyExternalCleanup: true, Endpoint: "https://ipam-api.vitistack.io/v2",
			CABundleRef: &ipamv1alpha1.CABundleReference{Name: "ca", Namespace: ns}, ClusterID: "cluster-a",
			Subnet: "2a05:1234::/64", ExcludedAddresses: []string{"2a05:1234::10", "2a05:1234::100/120", "2a05:1234::20-2a05:1234::2f"},
		}}
		g.Expect(env.Client.Create(ctx, pool)).To(Succeed())
		g.Expect(pool.Spec.SecretRef.Key).To(Equal("secret"))
		g.Expect(pool.Spec.CABundleRef.Kind).To(Equal("ConfigMap"))
		g.Expect(pool.Spec.CABundleRef.Key).To(Equal("ca.crt"))
	})
}

func TestPoolStatusAndWebhookProtectAddressesInUse(t *testing.T) {
	g := NewWithT(t)
	ns := namespace(t)
	pool := &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nodes"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4}}
	g.Expect(env.Client.Create(ctx, pool)).To(Succeed())

	// Ready once the IPAM-API accepts the zone and family.
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool)).To(Succeed())
		g.Expect(pool.Status.Conditions).To(ContainElement(And(
			HaveField("Type", "Ready"), HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "Ready"),
			HaveField("Message", ContainSubstring("accepts zone hnet-private, family ipv4")))))
		g.Expect(pool.Status.AddressesInUse).To(Equal(ptr.To[int32](0)))
		g.Expect(pool.Status.ObservedGeneration).To(Equal(pool.Generation))
	}, 20*time.Second, 50*time.Millisecond).Should(Succeed())
	// The probe left nothing behind in the IPAM-API.
	for _, r := range env.Sim.Registrations() {
		g.Expect(r.Address).NotTo(HavePrefix("192.0.2."))
	}

	claim := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "n1"},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{APIGroup: "ipam.vitistack.io", Kind: "VitistackIPPool", Name: "nodes"}}}
	g.Expect(env.Client.Create(ctx, claim)).To(Succeed())
	g.Eventually(func() *int32 {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool)
		return pool.Status.AddressesInUse
	}, 20*time.Second, 50*time.Millisecond).Should(Equal(ptr.To[int32](1)))

	// update changes the pool's spec as a user would, on the latest copy: the pool
	// controller writes the status (and so the resourceVersion) at any moment.
	update := func(mutate func(*ipamv1alpha1.VitistackIPPool)) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			latest := &ipamv1alpha1.VitistackIPPool{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pool), latest); err != nil {
				return err
			}
			mutate(latest)
			return env.Client.Update(ctx, latest)
		})
	}
	// Zone and family cannot change while the address is in use.
	err := update(func(p *ipamv1alpha1.VitistackIPPool) { p.Spec.Zone = "inet" })
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("spec.zone: Forbidden: cannot change while 1 IPAddresses (for example " + ns + "/n1) are allocated"))
	// So can't the subnet.
	err = update(func(p *ipamv1alpha1.VitistackIPPool) { p.Spec.Subnet = "10.99.0.0/24" })
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("spec.subnet: Forbidden: cannot change while 1 IPAddressClaims hold or are registering addresses of this pool"))
	// Other fields may change.
	g.Expect(update(func(p *ipamv1alpha1.VitistackIPPool) { p.Spec.RetentionPeriodDays = ptr.To[int32](3) })).To(Succeed())

	// The pool cannot be deleted while a claim uses it.
	err = env.Client.Delete(ctx, pool)
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("1 IPAddressClaims still use this pool (" + ns + "/n1): delete them first"))

	// ...except by clusterctl move, which deletes it after copying it.
	moving := &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "moving",
		Annotations: map[string]string{"clusterctl.cluster.x-k8s.io/delete-for-move": ""}},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4}}
	g.Expect(env.Client.Create(ctx, moving)).To(Succeed())
	g.Expect(env.Client.Create(ctx, &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m1"},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{APIGroup: "ipam.vitistack.io", Kind: "VitistackIPPool", Name: "moving"}}})).To(Succeed())
	g.Expect(env.Client.Delete(ctx, moving)).To(Succeed())

	// Once the claim is gone, the zone may change and the pool may go.
	g.Expect(env.Client.Delete(ctx, claim)).To(Succeed())
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(claim), claim)
	}, 20*time.Second, 50*time.Millisecond).ShouldNot(Succeed())
	g.Eventually(func() error {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool)).To(Succeed())
		pool.Spec.Zone = "inet"
		return env.Client.Update(ctx, pool)
	}, 20*time.Second, 50*time.Millisecond).Should(Succeed())
	g.Expect(env.Client.Delete(ctx, pool)).To(Succeed())
}

var _ = strings.Contains
