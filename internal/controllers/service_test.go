package controllers_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/testenv"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// servicePools makes sure the GlobalVitistackIPPools the Service tests use exist.
func servicePools(t *testing.T) {
	t.Helper()
	for name, spec := range map[string]ipamv1alpha1.VitistackIPPoolSpec{
		"svc-hnet-private-ipv4": routedPool("hnet-private", ipamv1alpha1.IPv4),
		"svc-inet-ipv4":         routedPool("inet", ipamv1alpha1.IPv4),
		"svc-inet-ipv6":         routedPool("inet", ipamv1alpha1.IPv6),
	} {
		pool := &ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
		if err := env.Client.Create(ctx, pool); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
}

func newService(t *testing.T, ns, name string, ann map[string]string, mutate ...func(*corev1.Service)) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, m := range mutate {
		m(svc)
	}
	NewWithT(t).Expect(env.Client.Create(ctx, svc)).To(Succeed())
	return svc
}

func dualStack(svc *corev1.Service) {
	svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
}

// published waits until MetalLB's annotation lists n addresses and returns the Service.
func published(t *testing.T, svc *corev1.Service, n int) *corev1.Service {
	t.Helper()
	got := &corev1.Service{}
	NewWithT(t).Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(svc), got)).To(Succeed())
		ips := got.Annotations["metallb.io/loadBalancerIPs"]
		g.Expect(ips).NotTo(BeEmpty(), "events: %v", eventMessages(t, svc))
		g.Expect(strings.Split(ips, ",")).To(HaveLen(n))
	}, eventually, poll).Should(Succeed())
	return got
}

// annotationOf returns a poller for one annotation of the Service as stored now.
func annotationOf(svc *corev1.Service, key string) func() string {
	return func() string {
		got := &corev1.Service{}
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(svc), got)
		return got.Annotations[key]
	}
}

func eventMessages(t *testing.T, obj client.Object) []string {
	var out []string
	for _, e := range eventsFor(t, obj) {
		out = append(out, e.Reason+": "+e.Message)
	}
	return out
}

func serviceClaims(t *testing.T, svc *corev1.Service) []ipamv1.IPAddressClaim {
	list := &ipamv1.IPAddressClaimList{}
	NewWithT(t).Expect(env.Client.List(ctx, list, client.InNamespace(svc.Namespace),
		client.MatchingLabels{"ipam.vitistack.io/service-name": svc.Name})).To(Succeed())
	return list.Items
}

func operatorIdentity(t *testing.T, svc *corev1.Service) sim.ServiceRef {
	ns := &corev1.Namespace{}
	NewWithT(t).Expect(env.Client.Get(ctx, client.ObjectKey{Name: svc.Namespace}, ns)).To(Succeed())
	return identity(t, ns, svc.Name)
}

func TestServiceGetsAnAddressAndReleasesIt(t *testing.T) {
	g := NewWithT(t)
	servicePools(t)
	ns := newNamespace(t)
	svc := newService(t, ns.Name, "web", nil)
	got := published(t, svc, 1)

	// The IPAM-operator's defaults, filled in by the controller.
	g.Expect(got.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/zone", "hnet-private"))
	g.Expect(got.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/ip-family", "ipv4"))
	g.Expect(got.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/retention-period-days", "0"))
	g.Expect(got.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/deny-external-cleanup", "false"))
	g.Expect(got.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/secret", "default"))
	g.Expect(got.Annotations["ipam.vitistack.io/allow-local-shared-ip"]).To(MatchRegexp(`^pre-shared-key-[A-Za-z0-9]{32}$`))
	g.Expect(got.Finalizers).To(ContainElement("ipam.vitistack.io/service"))

	// The address, for users and for MetalLB; status.loadBalancer is left to MetalLB.
	ip := got.Annotations["metallb.io/loadBalancerIPs"]
	g.Expect(got.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/addresses", ip))
	g.Expect(got.Annotations).To(HaveKeyWithValue("metallb.io/allow-shared-ip", got.Annotations["ipam.vitistack.io/allow-local-shared-ip"]))
	g.Expect(got.Status.LoadBalancer.Ingress).To(BeEmpty())

	// One claim, owned by the Service, registered under the IPAM-operator's identity.
	claims := serviceClaims(t, svc)
	g.Expect(claims).To(HaveLen(1))
	g.Expect(claims[0].Name).To(Equal("web-ipv4"))
	g.Expect(metav1.IsControlledBy(&claims[0], got)).To(BeTrue())
	regs := env.Sim.HeldBy(operatorIdentity(t, svc))
	g.Expect(regs).To(HaveLen(1))
	g.Expect(regs[0].Address).To(Equal(ip + "/32"))
	g.Expect(regs[0].Zone).To(Equal("hnet-private"))

	// Deleting the Service releases the address before the Service goes.
	deleteAndWait(t, got)
	g.Expect(serviceClaims(t, svc)).To(BeEmpty())
	holders := holdersOf(ip + "/32")
	g.Expect(holders).To(HaveLen(1))
	g.Expect(holders[0].ExpiresAt).NotTo(BeNil())
}

func TestServiceIPv6AndDualStack(t *testing.T) {
	g := NewWithT(t)
	servicePools(t)
	ns := newNamespace(t)

	v6 := newService(t, ns.Name, "v6", map[string]string{"ipam.vitistack.io/zone": "inet", "ipam.vitistack.io/ip-family": "ipv6"},
		func(s *corev1.Service) { s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol} })
	got := published(t, v6, 1)
	g.Expect(got.Annotations["metallb.io/loadBalancerIPs"]).To(HavePrefix("2a05:1234::"))

	dual := newService(t, ns.Name, "dual", map[string]string{"ipam.vitistack.io/zone": "inet", "ipam.vitistack.io/ip-family": "dual"}, dualStack)
	got = published(t, dual, 2)
	ips := strings.Split(got.Annotations["metallb.io/loadBalancerIPs"], ",")
	g.Expect(ips[0]).To(HavePrefix("83.118.16"))
	g.Expect(ips[1]).To(HavePrefix("2a05:1234::"))
	g.Expect(got.Annotations["ipam.vitistack.io/addresses"]).To(Equal(got.Annotations["metallb.io/loadBalancerIPs"]))
	g.Expect(serviceClaims(t, dual)).To(HaveLen(2))
	g.Expect(env.Sim.HeldBy(operatorIdentity(t, dual))).To(HaveLen(2), "one registration per family, one identity")

	// Dropping a family releases its address and keeps the other. The user changes
	// ipam.vitistack.io/ip-family and the Service's families in one patch (docs/services.md
	// adds MetalLB's annotation, for MetalLB, which this test does not run): the addresses
	// annotation the controller wrote still names the IPv6 address, and the controller
	// takes it out.
	before := got.DeepCopy()
	got.Annotations["ipam.vitistack.io/ip-family"] = "ipv4"
	got.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
	got.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	g.Expect(env.Client.Patch(ctx, got, client.MergeFrom(before))).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(dual), got)).To(Succeed())
		g.Expect(got.Annotations["metallb.io/loadBalancerIPs"]).To(Equal(ips[0]))
		g.Expect(got.Annotations["ipam.vitistack.io/addresses"]).To(Equal(ips[0]))
		g.Expect(serviceClaims(t, dual)).To(HaveLen(1))
	}, eventually, poll).Should(Succeed())
	g.Expect(holdersOf(ips[1] + "/128")[0].ExpiresAt).NotTo(BeNil())
	g.Expect(holdersOf(ips[0] + "/32")[0].ExpiresAt).To(BeNil())
}

func TestServicesShareAnAddressWithOneSecret(t *testing.T) {
	g := NewWithT(t)
	servicePools(t)
	ns := newNamespace(t)
	g.Expect(env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "shared"},
		Data: map[string][]byte{"secret": []byte("shared-secret-value-1")}})).To(Succeed())
	ann := map[string]string{"ipam.vitistack.io/secret": "shared", "ipam.vitistack.io/allow-local-shared-ip": "pre-shared-key-web"}
	first := published(t, newService(t, ns.Name, "http", ann), 1)
	ip := first.Annotations["metallb.io/loadBalancerIPs"]

	ann2 := map[string]string{"ipam.vitistack.io/secret": "shared", "ipam.vitistack.io/allow-local-shared-ip": "pre-shared-key-web",
		"ipam.vitistack.io/addresses": ip}
	// On another port: MetalLB shares an address only between Services whose ports do
	// not overlap (the webhook refuses one on the same port).
	second := published(t, newService(t, ns.Name, "https", ann2, func(s *corev1.Service) { s.Spec.Ports[0].Port = 443 }), 1)
	g.Expect(second.Annotations["metallb.io/loadBalancerIPs"]).To(Equal(ip))
	g.Expect(second.Annotations["metallb.io/allow-shared-ip"]).To(Equal("pre-shared-key-web"))
	g.Expect(holdersOf(ip + "/32")).To(HaveLen(2))

	// The address is freed only when both are gone.
	deleteAndWait(t, first)
	env.Sim.Sweep()
	g.Expect(holdersOf(ip+"/32")).To(HaveLen(1), "still held by the second Service")
	deleteAndWait(t, second)
	env.Sim.Sweep()
	_, held := env.Sim.Registration(ip + "/32")
	g.Expect(held).To(BeFalse())
}

func TestServiceSecretRotation(t *testing.T) {
	servicePools(t)
	ns := newNamespace(t)
	for name, v := range map[string]string{"old": "old-secret-value-1", "new": "new-secret-value-2", "newer": "newer-secret-value-3"} {
		NewWithT(t).Expect(env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name},
			Data: map[string][]byte{"secret": []byte(v)}})).To(Succeed())
	}
	setSecret := func(t *testing.T, svc *corev1.Service, name string) {
		patchAnnotations(t, svc, map[string]string{"ipam.vitistack.io/secret": name})
	}

	t.Run("accepted: one service holds the address", func(t *testing.T) {
		g := NewWithT(t)
		svc := published(t, newService(t, ns.Name, "solo", map[string]string{"ipam.vitistack.io/secret": "old"}), 1)
		ip := svc.Annotations["metallb.io/loadBalancerIPs"]
		setSecret(t, svc, "new")
		g.Eventually(func() string {
			r, _ := env.Sim.Registration(ip + "/32")
			return r.SecretFingerprint
		}, eventually, poll).Should(Equal(sim.Fingerprint("new-secret-value-2")))
		g.Eventually(func() map[string]string {
			a := &ipamv1.IPAddress{}
			_ = env.Client.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "solo-ipv4"}, a)
			return a.Annotations
		}, eventually, poll).Should(HaveKeyWithValue("ipam.vitistack.io/registered-secret-ref", ns.Name+"/new/secret"))
		g.Expect(published(t, svc, 1).Annotations["metallb.io/loadBalancerIPs"]).To(Equal(ip), "the address stays")
		sec := &corev1.Secret{}
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "new"}, sec)).To(Succeed())
		g.Expect(sec.Finalizers).To(ContainElement(ipamv1alpha1.SecretInUseFinalizer))
	})

	t.Run("refused: several services share the address", func(t *testing.T) {
		g := NewWithT(t)
		// Sharing needs the same share key on both Services (as MetalLB's allow-shared-ip does).
		const key = "ipam.vitistack.io/allow-local-shared-ip"
		a := published(t, newService(t, ns.Name, "a", map[string]string{"ipam.vitistack.io/secret": "old", key: "ab"}), 1)
		ip := a.Annotations["metallb.io/loadBalancerIPs"]
		published(t, newService(t, ns.Name, "b", map[string]string{"ipam.vitistack.io/secret": "old", "ipam.vitistack.io/addresses": ip, key: "ab"},
			func(s *corev1.Service) { s.Spec.Ports[0].Port = 443 }), 1)
		setSecret(t, a, "newer")
		hasEvent(t, a, corev1.EventTypeWarning, "RotationRefused", "multiple services registered. unable to change secret")
		r, _ := env.Sim.Registration(ip + "/32")
		g.Expect(r.SecretFingerprint).To(Equal(sim.Fingerprint("old-secret-value-1")), "the address keeps the old secret")
		g.Expect(r.Holders).To(HaveLen(2))
		g.Expect(published(t, a, 1).Annotations["metallb.io/loadBalancerIPs"]).To(Equal(ip), "and the Service keeps working")
		// The refused Secret keeps no in-use finalizer: it owns nothing.
		g.Eventually(func() []string {
			sec := &corev1.Secret{}
			_ = env.Client.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "newer"}, sec)
			return sec.Finalizers
		}, eventually, poll).Should(BeEmpty())
	})
}

func TestServiceTypeChangeReleasesAddress(t *testing.T) {
	g := NewWithT(t)
	servicePools(t)
	ns := newNamespace(t)
	svc := published(t, newService(t, ns.Name, "flip", nil), 1)
	ip := svc.Annotations["metallb.io/loadBalancerIPs"]

	before := svc.DeepCopy()
	svc.Spec.Type = corev1.ServiceTypeClusterIP
	g.Expect(env.Client.Patch(ctx, svc, client.MergeFrom(before))).To(Succeed())
	g.Eventually(func(g Gomega) {
		got := &corev1.Service{}
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(svc), got)).To(Succeed())
		g.Expect(got.Finalizers).NotTo(ContainElement("ipam.vitistack.io/service"))
		g.Expect(got.Annotations).NotTo(HaveKey("metallb.io/loadBalancerIPs"))
		g.Expect(serviceClaims(t, svc)).To(BeEmpty())
	}, eventually, poll).Should(Succeed())
	g.Expect(holdersOf(ip + "/32")[0].ExpiresAt).NotTo(BeNil())
}

// A new requested address is bound before the old one is let go.
func TestServiceRequestedAddressChangeIsMakeBeforeBreak(t *testing.T) {
	g := NewWithT(t)
	servicePools(t)
	ns := newNamespace(t)
	svc := published(t, newService(t, ns.Name, "move", nil), 1)
	old := svc.Annotations["metallb.io/loadBalancerIPs"]

	env.Sim.SetFaultRoutes(sim.RouteRegister)
	g.Expect(env.Sim.SetLatency(300*time.Millisecond, 0)).To(Succeed())
	t.Cleanup(env.Sim.ClearFaults)
	patchAnnotations(t, svc, map[string]string{"ipam.vitistack.io/addresses": "10.200.0.9"})
	// While the new address is registered, MetalLB keeps the old one.
	g.Consistently(annotationOf(svc, "metallb.io/loadBalancerIPs"), 200*time.Millisecond, 20*time.Millisecond).Should(Equal(old))
	g.Eventually(annotationOf(svc, "metallb.io/loadBalancerIPs"), eventually, poll).Should(Equal("10.200.0.9"))
	g.Eventually(func() []ipamv1.IPAddressClaim { return serviceClaims(t, svc) }, eventually, poll).Should(HaveLen(1))
	g.Eventually(func() *time.Time { return holdersOf(old + "/32")[0].ExpiresAt }, eventually, poll).ShouldNot(BeNil())
	g.Expect(holdersOf("10.200.0.9/32")).To(HaveLen(1))
}

// A Service the IPAM-operator managed (annotations filled, registration held under its
// identity and its default secret) is adopted with the same address.
func TestServiceFromTheIPAMOperatorIsAdopted(t *testing.T) {
	g := NewWithT(t)
	servicePools(t)
	// The operator's default secret, where it kept it.
	g.Expect(client.IgnoreAlreadyExists(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ipam-system"}}))).To(Succeed())
	g.Expect(env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ipam-system", Name: "default"},
		Data: map[string][]byte{"secret": []byte("OperatorDefaultSecret0123456789a")}})).To(Succeed())
	startManagerWith(t, func(o *manager.Options) { o.DefaultSecretNamespace = "" })

	ns := newNamespace(t)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "legacy"}}
	id := operatorIdentity(t, svc)
	// What the operator registered.
	res := registerDirect(t, `{"secret":"OperatorDefaultSecret0123456789a","zone":"inet","ip_family":"ipv4","service":{"service_name":"legacy","namespace_id":"`+
		id.NamespaceID+`","cluster_id":"`+id.ClusterID+`","retention_period_days":0,"deny_external_cleanup":false}}`)
	ip := strings.TrimSuffix(res, "/32")

	// The operator handed the address to MetalLB too. The watch starts at the version
	// created, so it sees every later one, however quick the provider is.
	legacy := newService(t, ns.Name, "legacy", map[string]string{
		"ipam.vitistack.io/addresses":             ip,
		"ipam.vitistack.io/allow-local-shared-ip": "pre-shared-key-sa4OuI3e0o",
		"ipam.vitistack.io/deny-external-cleanup": "false",
		"ipam.vitistack.io/ip-family":             "ipv4",
		"ipam.vitistack.io/retention-period-days": "0",
		"ipam.vitistack.io/secret":                "default",
		"ipam.vitistack.io/zone":                  "inet",
		"metallb.io/loadBalancerIPs":              ip,
		"metallb.io/allow-shared-ip":              "pre-shared-key-sa4OuI3e0o",
	})
	versions, err := testenv.WatchVersions(ctx, env.Config, &corev1.ServiceList{}, legacy)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) {
		g.Expect(serviceClaims(t, legacy)).To(ContainElement(HaveField("Status.AddressRef.Name", Not(BeEmpty()))))
		g.Expect(versions.Seen()).To(ContainElement(HaveField("Finalizers", ContainElement(ipamv1alpha1.ServiceFinalizer))))
	}, eventually, poll).Should(Succeed())
	// MetalLB never saw the Service without its address, or with another.
	for _, v := range versions.Stop() {
		g.Expect(v.Annotations).To(HaveKeyWithValue("metallb.io/loadBalancerIPs", ip), "version %s", v.ResourceVersion)
	}
	regs := env.Sim.HeldBy(id)
	g.Expect(regs).To(HaveLen(1), "no second address")
	g.Expect(regs[0].Holders).To(HaveLen(1), "the same holder, not a share")
}

// The IPAM-API is down while a Service is deleted: the Service waits, and its address
// is released once the IPAM-API is back.
// servicePoolOfItsOwn creates a GlobalVitistackIPPool of zone inet, IPv4, on an
// IPAM-API stand-in of its own, for Services that name it (ipam.vitistack.io/pool):
// other tests' Services must not pick it, so it goes when the test ends.
func servicePoolOfItsOwn(t *testing.T, name string) (*sim.Server, *ipamv1alpha1.GlobalVitistackIPPool) {
	t.Helper()
	api, url, stop := env.ExtraSim()
	t.Cleanup(stop)
	spec := routedPool("inet", ipamv1alpha1.IPv4)
	spec.Endpoint = url
	pool := &ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	NewWithT(t).Expect(env.Client.Create(ctx, pool)).To(Succeed())
	t.Cleanup(func() { deleteAndWait(t, pool) })
	return api, pool
}

func TestServiceDeletionWaitsForTheIPAMAPI(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	api, pool := servicePoolOfItsOwn(t, "down-"+ns.Name)
	svc := published(t, newService(t, ns.Name, "fragile", map[string]string{"ipam.vitistack.io/zone": "inet", "ipam.vitistack.io/pool": pool.Name}), 1)
	ip := svc.Annotations["metallb.io/loadBalancerIPs"]

	api.SetDown(true)
	g.Expect(env.Client.Delete(ctx, svc)).To(Succeed())
	g.Consistently(func() error {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(svc), &corev1.Service{})
	}, 2*time.Second, 100*time.Millisecond).Should(Succeed(), "the Service waits for the release")
	g.Expect(api.Holders(ip + "/32")[0].ExpiresAt).To(BeNil())
	hasEvent(t, svc, corev1.EventTypeWarning, "ReleaseFailed", "releasing the address failed")

	api.SetDown(false)
	deleteAndWait(t, svc)
	g.Expect(api.Holders(ip + "/32")[0].ExpiresAt).NotTo(BeNil())
}

// Deleting a namespace with a Service and its custom Secret: the Secret stays until
// the address is released, so nothing leaks and the namespace goes.
func TestNamespaceDeletionReleasesWithItsSecret(t *testing.T) {
	g := NewWithT(t)
	servicePools(t)
	ns := newNamespace(t)
	g.Expect(env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "mine"},
		Data: map[string][]byte{"secret": []byte("namespace-secret-val")}})).To(Succeed())
	svc := published(t, newService(t, ns.Name, "tenant", map[string]string{"ipam.vitistack.io/secret": "mine"}), 1)
	ip := svc.Annotations["metallb.io/loadBalancerIPs"]

	g.Expect(env.Client.Delete(ctx, ns)).To(Succeed())
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(ns), &corev1.Namespace{})
	}, time.Minute, 200*time.Millisecond).ShouldNot(Succeed(), "the namespace is deleted")
	g.Expect(holdersOf(ip + "/32")[0].ExpiresAt).NotTo(BeNil(), "its address was released")
}

// If the Service's finalizer is removed by hand, the garbage collector still deletes
// the claims it owns, and they release their addresses.
func TestOrphanedClaimsAreCollectedAndReleased(t *testing.T) {
	g := NewWithT(t)
	servicePools(t)
	ns := newNamespace(t)
	svc := published(t, newService(t, ns.Name, "forced", nil), 1)
	ip := svc.Annotations["metallb.io/loadBalancerIPs"]
	// Someone removes the finalizer while the provider is down (its Service webhook out
	// of the way too), and deletes the Service.
	g.Expect(env.StopManager()).To(Succeed())
	restarted := false
	t.Cleanup(func() { // the other tests need a manager, whatever happens here
		if !restarted {
			_ = env.StartManager(ctx, mgrOpts)
		}
	})
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: "service-validating-webhook-configuration"}, vwc)).To(Succeed())
	g.Expect(env.Client.Delete(ctx, vwc)).To(Succeed())
	// The API server drops the webhook a moment after its configuration is deleted.
	orig := svc.DeepCopy()
	g.Eventually(func() error {
		unfinalized := orig.DeepCopy()
		unfinalized.Finalizers = nil
		return env.Client.Patch(ctx, unfinalized, client.MergeFrom(orig))
	}, 10*time.Second, 100*time.Millisecond).Should(Succeed())
	g.Expect(env.Client.Delete(ctx, svc)).To(Succeed())
	vwc.ResourceVersion, vwc.UID = "", ""
	g.Expect(env.Client.Create(ctx, vwc)).To(Succeed())
	g.Expect(env.StartManager(ctx, mgrOpts)).To(Succeed())
	restarted = true

	g.Eventually(func() []ipamv1.IPAddressClaim { return serviceClaims(t, svc) }, time.Minute, 200*time.Millisecond).Should(BeEmpty())
	g.Expect(holdersOf(ip + "/32")[0].ExpiresAt).NotTo(BeNil())
}

// registerDirect registers in the stand-in as another client (the IPAM-operator) would,
// and returns the address.
func registerDirect(t *testing.T, body string) string {
	t.Helper()
	g := NewWithT(t)
	res, err := http.Post(env.SimURL+"/v2/address", "application/json", strings.NewReader(body))
	g.Expect(err).NotTo(HaveOccurred())
	defer res.Body.Close()
	var out struct{ Message, Address string }
	g.Expect(json.NewDecoder(res.Body).Decode(&out)).To(Succeed())
	g.Expect(res.StatusCode).To(Equal(200), out.Message)
	return out.Address
}

// A new retention on a bound Service is carried to its registration, with its address.
func TestServiceRetentionChangeReregisters(t *testing.T) {
	g := NewWithT(t)
	servicePools(t)
	ns := newNamespace(t)
	svc := published(t, newService(t, ns.Name, "keep", nil), 1)
	ip := svc.Annotations["metallb.io/loadBalancerIPs"]
	patchAnnotations(t, svc, map[string]string{"ipam.vitistack.io/retention-period-days": "5"})
	g.Eventually(func() int {
		h := holdersOf(ip + "/32")
		if len(h) != 1 {
			return -1
		}
		return h[0].RetentionPeriodDays
	}, eventually, poll).Should(Equal(5))
	g.Expect(env.Sim.HeldBy(operatorIdentity(t, svc))).To(HaveLen(1), "the same address")

	// The release then keeps the address for 5 days.
	deleteAndWait(t, svc)
	h := holdersOf(ip + "/32")
	g.Expect(h[0].ExpiresAt).NotTo(BeNil())
	g.Expect(h[0].ExpiresAt.Sub(env.Clock.Now()).Hours()).To(BeNumerically("~", 5*24, 1))
}

// A new zone moves the Service to an address of that zone (make before break), even
// with the old address still in its addresses annotation.
func TestServiceZoneChangeMovesTheAddress(t *testing.T) {
	g := NewWithT(t)
	servicePools(t)
	ns := newNamespace(t)
	svc := published(t, newService(t, ns.Name, "zoned", nil), 1)
	old := svc.Annotations["metallb.io/loadBalancerIPs"]
	g.Expect(old).To(HavePrefix("10."))
	patchAnnotations(t, svc, map[string]string{"ipam.vitistack.io/zone": "inet"})
	g.Eventually(func() string {
		got := &corev1.Service{}
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(svc), got)
		return got.Annotations["metallb.io/loadBalancerIPs"] + " " + got.Annotations["ipam.vitistack.io/addresses"]
	}, eventually, poll).Should(MatchRegexp(`^83\.118\.\S+ 83\.118\.`))
	g.Eventually(func() []ipamv1.IPAddressClaim { return serviceClaims(t, svc) }, eventually, poll).Should(HaveLen(1))
	g.Eventually(func() *time.Time { return holdersOf(old + "/32")[0].ExpiresAt }, eventually, poll).ShouldNot(BeNil())
}

// A Service moves to another pool of the same zone and family (the pool annotation):
// its new claim has the same IPAM-API identity as the old one, takes the registration
// over and binds the same address, and the old claim goes without releasing it. The
// published address never changes and never goes empty.
func TestServiceMovesToAnotherPoolOfTheSameZone(t *testing.T) {
	g := NewWithT(t)
	servicePools(t)
	second := &ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: "svc-hnet-private-ipv4-second"},
		Spec: routedPool("hnet-private", ipamv1alpha1.IPv4)}
	if err := env.Client.Create(ctx, second); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t)
	svc := published(t, newService(t, ns.Name, "mover", nil), 1)
	old := svc.Annotations["metallb.io/loadBalancerIPs"]

	patchAnnotations(t, svc, map[string]string{"ipam.vitistack.io/pool": second.Name})
	g.Eventually(func(g Gomega) {
		claims := serviceClaims(t, svc)
		g.Expect(claims).To(HaveLen(1))
		g.Expect(claims[0].Spec.PoolRef.Name).To(Equal(second.Name))
		g.Expect(claims[0].Status.AddressRef.Name).NotTo(BeEmpty())
	}, eventually, poll).Should(Succeed(), "events: %v", eventMessages(t, svc))
	g.Expect(annotationOf(svc, "metallb.io/loadBalancerIPs")()).To(Equal(old))
	holders := holdersOf(old + "/32")
	g.Expect(holders).To(HaveLen(1))
	g.Expect(holders[0].ExpiresAt).To(BeNil(), "the Service's address was released in the move")
}

// An address asked for while the first claim is still pending is not stuck behind it.
func TestServiceAddressChangeWhileFirstClaimPending(t *testing.T) {
	g := NewWithT(t)
	servicePools(t)
	ns := newNamespace(t)
	env.Sim.SetFaultRoutes(sim.RouteRegister)
	g.Expect(env.Sim.SetLatency(400*time.Millisecond, 0)).To(Succeed())
	t.Cleanup(env.Sim.ClearFaults)
	svc := newService(t, ns.Name, "quick", nil)
	g.Eventually(func() []ipamv1.IPAddressClaim { return serviceClaims(t, svc) }, eventually, poll).Should(HaveLen(1))
	patchAnnotations(t, svc, map[string]string{"ipam.vitistack.io/addresses": "10.201.0.7"})
	g.Eventually(annotationOf(svc, "metallb.io/loadBalancerIPs"), 30*time.Second, poll).Should(Equal("10.201.0.7"))
	g.Eventually(func() []ipamv1.IPAddressClaim { return serviceClaims(t, svc) }, eventually, poll).Should(HaveLen(1))
}

// MetalLB announcing an address it picked itself (a pool with autoAssign on) for a
// Service whose claim cannot bind yet is named on the Service, with MetalLB's pool; the
// Service still gets the registered address once the IPAM-API answers.
func TestServiceSaysMetalLBAssignedAnAddressItself(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	api, pool := servicePoolOfItsOwn(t, "eager-"+ns.Name)
	api.SetDown(true)
	svc := newService(t, ns.Name, "eager", map[string]string{"ipam.vitistack.io/zone": "inet", "ipam.vitistack.io/pool": pool.Name})

	// What MetalLB's controller writes when its pool assigns by itself.
	g.Eventually(func() error {
		got := &corev1.Service{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(svc), got); err != nil {
			return err
		}
		got.Annotations["metallb.io/ip-allocated-from-pool"] = "default-pool"
		if err := env.Client.Update(ctx, got); err != nil {
			return err
		}
		got.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.10"}}
		return env.Client.Status().Update(ctx, got)
	}, eventually, poll).Should(Succeed())
	hasEvent(t, svc, corev1.EventTypeWarning, "MetalLBAssigned",
		`MetalLB announces 192.0.2.10, which this provider has not handed it: MetalLB's IPAddressPool "default-pool" assigns addresses itself`)

	api.SetDown(false)
	got := published(t, svc, 1)
	g.Expect(got.Annotations["metallb.io/loadBalancerIPs"]).NotTo(Equal("192.0.2.10"))
	deleteAndWait(t, got)
}
