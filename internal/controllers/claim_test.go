package controllers_test

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

func TestClaimGetsAddressWithMetadata(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	spec := routedPool("inet", ipamv1alpha1.IPv4)
	spec.Prefix = ptr.To[int32](24)
	spec.Gateway = "83.118.168.1"
	pool := newPool(t, ns.Name, "inet-v4", spec)
	claim := newClaim(t, ns.Name, "node-1", pool.Name, nil)

	addr := boundAddress(t, claim)
	ip := netip.MustParseAddr(addr.Spec.Address)
	g.Expect(netip.MustParsePrefix("83.118.168.0/22").Contains(ip)).To(BeTrue(), "address %s is not in zone inet", ip)
	g.Expect(addr.Spec.Prefix).To(Equal(ptr.To[int32](24)))
	g.Expect(addr.Spec.Gateway).To(Equal("83.118.168.1"))
	g.Expect(addr.Spec.PoolRef).To(Equal(ipamv1.IPPoolReference{APIGroup: "ipam.vitistack.io", Kind: "VitistackIPPool", Name: "inet-v4"}))
	g.Expect(addr.Spec.ClaimRef.Name).To(Equal("node-1"))

	g.Expect(addr.Labels).To(HaveKeyWithValue("ipam.vitistack.io/zone", "inet"))
	g.Expect(addr.Labels).To(HaveKeyWithValue("ipam.vitistack.io/ip-family", "ipv4"))
	g.Expect(addr.Labels).To(HaveKeyWithValue("ipam.vitistack.io/pool-name", "inet-v4"))
	kubeSystem := uidOf(t, "kube-system")
	g.Expect(addr.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/registered-service-name", "node-1"))
	g.Expect(addr.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/registered-namespace-id", string(ns.UID)))
	g.Expect(addr.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/registered-cluster-id", kubeSystem))
	g.Expect(addr.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/registered-secret-ref", "capi-ipam-vitistack-system/default/secret"))
	g.Expect(addr.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/registered-retention-period-days", "0"))
	g.Expect(addr.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/registered-deny-external-cleanup", "false"))
	g.Expect(addr.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/registered-address", ip.String()+"/32"))
	g.Expect(addr.Finalizers).To(ConsistOf("ipam.cluster.x-k8s.io/ProtectAddress"), "ipamutil's loop protects the IPAddress until its claim goes")

	// Owner references: the claim controls the address; the pool owns it too.
	var kinds []string
	for _, o := range addr.OwnerReferences {
		kinds = append(kinds, o.Kind+"/"+o.Name+"/"+boolStr(ptr.Deref(o.Controller, false)))
	}
	g.Expect(kinds).To(ConsistOf("IPAddressClaim/node-1/true", "VitistackIPPool/inet-v4/false"))

	// The claim is Ready. Its own record is the pending one written before the request
	// (the IPAddress records the registration: a claim is bound with four writes), and
	// a first binding sends no event (the write-budget test counts none).
	cond := readyCondition(t, claim, metav1.ConditionTrue, "Allocated")
	g.Expect(cond.Message).To(ContainSubstring(ip.String()))
	c := &ipamv1.IPAddressClaim{}
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(claim), c)).To(Succeed())
	g.Expect(c.Annotations[ipamv1alpha1.RegistrationAnnotation]).To(And(
		ContainSubstring(`"serviceName":"node-1"`), ContainSubstring(`"zone":"inet"`), ContainSubstring(`"phase":"Pending"`), Not(ContainSubstring(`"registered"`))))

	// The stand-in holds exactly this registration.
	holders := holdersOf(ip.String() + "/32")
	g.Expect(holders).To(HaveLen(1))
	g.Expect(holders[0].ServiceRef).To(Equal(sim.ServiceRef{ServiceName: "node-1", NamespaceID: string(ns.UID), ClusterID: kubeSystem}))
	g.Expect(holders[0].ExpiresAt).To(BeNil())

	// The default secret was created: Opaque, key "secret", 32 characters.
	sec := &corev1.Secret{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: "capi-ipam-vitistack-system", Name: "default"}, sec)).To(Succeed())
	g.Expect(sec.Type).To(Equal(corev1.SecretTypeOpaque))
	g.Expect(sec.Data["secret"]).To(HaveLen(32))
	reg, ok := env.Sim.Registration(ip.String() + "/32")
	g.Expect(ok).To(BeTrue())
	g.Expect(reg.SecretFingerprint).To(Equal(sim.Fingerprint(string(sec.Data["secret"]))))
}

func boolStr(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

func TestClaimAnnotationsOverrideIdentitySecretAndRetention(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	secretValue := "my-own-secret-value-1234"
	g.Expect(env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "anycast"},
		Data:       map[string][]byte{"secret": []byte(secretValue)},
	})).To(Succeed())
	pool := newPool(t, ns.Name, "inet-v6", withOverrides(routedPool("inet", ipamv1alpha1.IPv6)))
	claim := newClaim(t, ns.Name, "lb-1", pool.Name, map[string]string{
		"ipam.vitistack.io/secret":                "anycast",
		"ipam.vitistack.io/retention-period-days": "7",
		"ipam.vitistack.io/deny-external-cleanup": "true",
		"ipam.vitistack.io/service-name":          "ingress",
		"ipam.vitistack.io/namespace-id":          "ns-id-1",
		"ipam.vitistack.io/cluster-id":            "cluster-a",
	})
	addr := boundAddress(t, claim)
	ip := netip.MustParseAddr(addr.Spec.Address)
	g.Expect(ip.Is6()).To(BeTrue())
	g.Expect(netip.MustParsePrefix("2a05:1234::/64").Contains(ip)).To(BeTrue())
	g.Expect(addr.Spec.Prefix).To(Equal(ptr.To[int32](128)))
	g.Expect(addr.Labels).To(HaveKeyWithValue("ipam.vitistack.io/ip-family", "ipv6"))
	g.Expect(addr.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/registered-secret-ref", ns.Name+"/anycast/secret"))
	g.Expect(addr.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/registered-retention-period-days", "7"))
	g.Expect(addr.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/registered-deny-external-cleanup", "true"))

	reg, ok := env.Sim.Registration(ip.String() + "/128")
	g.Expect(ok).To(BeTrue())
	g.Expect(reg.SecretFingerprint).To(Equal(sim.Fingerprint(secretValue)))
	g.Expect(reg.Holders).To(HaveLen(1))
	g.Expect(reg.Holders[0].ServiceRef).To(Equal(sim.ServiceRef{ServiceName: "ingress", NamespaceID: "ns-id-1", ClusterID: "cluster-a"}))
	g.Expect(reg.Holders[0].RetentionPeriodDays).To(Equal(7))
	g.Expect(reg.Holders[0].DenyExternalCleanup).To(BeTrue())

	// The Secret that owns the address is kept until the address is released.
	sec := &corev1.Secret{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "anycast"}, sec)).To(Succeed())
	g.Expect(sec.Finalizers).To(ContainElement(ipamv1alpha1.SecretInUseFinalizer))

	// Deleting the claim releases with the recorded retention: the holder expires in 7 days.
	deleteAndWait(t, claim)
	g.Eventually(func() []string {
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "anycast"}, sec)).To(Succeed())
		return sec.Finalizers
	}, eventually, poll).ShouldNot(ContainElement(ipamv1alpha1.SecretInUseFinalizer), "no claim needs the Secret any more")
	holders := holdersOf(ip.String() + "/128")
	g.Expect(holders).To(HaveLen(1))
	g.Expect(holders[0].ExpiresAt).NotTo(BeNil())
	g.Expect(holders[0].ExpiresAt.Sub(env.Clock.Now()).Hours()).To(BeNumerically("~", 7*24, 1))
}

// A Secret whose finalizer someone stripped while records name it gets it back when
// the next claim under it comes, before that claim registers anything: the claim
// finds the Secret not protected and another claim's record naming it, waits without
// writing, and asks the Secret controller to look at the Secret (no record of its own
// would ask, and Secrets are not watched).
func TestAStrippedSecretFinalizerComesBackForTheNextClaim(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	g.Expect(env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "owner"},
		Data: map[string][]byte{"secret": []byte("the-owner-secret-value")}})).To(Succeed())
	spec := routedPool("inet", ipamv1alpha1.IPv4)
	spec.SecretRef = &ipamv1alpha1.SecretReference{Name: "owner"}
	pool := newPool(t, ns.Name, "owned", spec)
	boundAddress(t, newClaim(t, ns.Name, "first", pool.Name, nil))

	sec := &corev1.Secret{}
	key := client.ObjectKey{Namespace: ns.Name, Name: "owner"}
	g.Expect(env.Client.Get(ctx, key, sec)).To(Succeed())
	g.Expect(sec.Finalizers).To(ContainElement(ipamv1alpha1.SecretInUseFinalizer))
	patch := client.MergeFrom(sec.DeepCopy())
	sec.Finalizers = nil
	g.Expect(env.Client.Patch(ctx, sec, patch)).To(Succeed())

	second := newClaim(t, ns.Name, "second", pool.Name, nil)
	boundAddress(t, second)
	g.Expect(env.Client.Get(ctx, key, sec)).To(Succeed())
	g.Expect(sec.Finalizers).To(ContainElement(ipamv1alpha1.SecretInUseFinalizer), "the Secret is protected again")
}

// TestAPoolsSecretIsProtectedWhileThePoolNamesIt: the Secret a pool names is protected
// (finalizer and fingerprint) from the moment the pool exists, before any claim, so
// its first claims register at once; once no address is registered under it, the pool
// alone does not hold its delete (Secrets are not watched: the protector sees the
// delete when it looks again, every --secret-recheck-interval).
func TestAPoolsSecretIsProtectedWhileThePoolNamesIt(t *testing.T) {
	g := NewWithT(t)
	startManagerWith(t, func(o *manager.Options) { o.SecretRecheckInterval = time.Second })
	ns := newNamespace(t)
	const value = "the-pools-secret-value"
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "owner"}, Data: map[string][]byte{"secret": []byte(value)}}
	g.Expect(env.Client.Create(ctx, sec)).To(Succeed())
	spec := routedPool("inet", ipamv1alpha1.IPv4)
	spec.SecretRef = &ipamv1alpha1.SecretReference{Name: "owner"}
	pool := newPool(t, ns.Name, "owned", spec)
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(sec), sec)).To(Succeed())
		g.Expect(sec.Finalizers).To(ContainElement(ipamv1alpha1.SecretInUseFinalizer))
		g.Expect(record.Fingerprints(sec.Annotations)).To(HaveKeyWithValue("secret", record.Fingerprint([]byte(value))))
	}, eventually, poll).Should(Succeed(), "the pool's Secret is protected before its first claim")

	claim := newClaim(t, ns.Name, "first", pool.Name, nil)
	addr := boundAddress(t, claim)
	deleteAndWait(t, claim)
	g.Expect(holdersOf(addr.Spec.Address+"/32")).To(ConsistOf(HaveField("ExpiresAt", Not(BeNil()))), "released")

	// Nothing is registered under it any more: deleting it is not held by the pool, and
	// the pool's next claim says the Secret is missing.
	deleteAndWait(t, sec)
	late := newClaim(t, ns.Name, "late", pool.Name, nil)
	cond := readyCondition(t, late, metav1.ConditionFalse, ipamv1alpha1.ClaimReadySecretNotFoundReason)
	g.Expect(cond.Message).To(ContainSubstring("Secret " + ns.Name + "/owner"))
	deleteAndWait(t, late)
	deleteAndWait(t, pool)
}

func TestClaimRequestedAddress(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pool := newPool(t, ns.Name, "private", routedPool("hnet-private", ipamv1alpha1.IPv4))
	claim := newClaim(t, ns.Name, "fixed", pool.Name, map[string]string{"ipam.vitistack.io/addresses": "172.16.44.5"})
	addr := boundAddress(t, claim)
	g.Expect(addr.Spec.Address).To(Equal("172.16.44.5"))
	g.Expect(holdersOf("172.16.44.5/32")).To(HaveLen(1))

	// An address of the wrong family is refused with a message naming the annotation.
	bad := newClaim(t, ns.Name, "wrong-family", pool.Name, map[string]string{"ipam.vitistack.io/addresses": "2a05:1234::9"})
	cond := readyCondition(t, bad, metav1.ConditionFalse, "InvalidAnnotation")
	g.Expect(cond.Message).To(ContainSubstring("annotation ipam.vitistack.io/addresses"))
	g.Expect(cond.Message).To(ContainSubstring("has no ipv4 address"))
	hasEvent(t, bad, corev1.EventTypeWarning, "InvalidAnnotation", "ipam.vitistack.io/addresses")

	// Fixing the annotation binds it.
	patchAnnotations(t, bad, map[string]string{"ipam.vitistack.io/addresses": "10.44.0.7/32"})
	g.Expect(boundAddress(t, bad).Spec.Address).To(Equal("10.44.0.7"))
}

func patchAnnotations(t *testing.T, obj client.Object, ann map[string]string) {
	t.Helper()
	g := NewWithT(t)
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	a := obj.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	for k, v := range ann {
		a[k] = v
	}
	obj.SetAnnotations(a)
	g.Expect(env.Client.Patch(ctx, obj, patch)).To(Succeed())
}

func TestDeletingClaimReleasesAddress(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pool := newPool(t, ns.Name, "pool", routedPool("hnet-public", ipamv1alpha1.IPv4))
	claim := newClaim(t, ns.Name, "gone-soon", pool.Name, nil)
	addr := boundAddress(t, claim)
	cidr := addr.Spec.Address + "/32"
	g.Expect(holdersOf(cidr)).To(HaveLen(1))

	deleteAndWait(t, claim)
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(addr), &ipamv1.IPAddress{})
	}, eventually, poll).ShouldNot(Succeed(), "the IPAddress must go with its claim")

	holders := holdersOf(cidr)
	g.Expect(holders).To(HaveLen(1))
	g.Expect(holders[0].ExpiresAt).NotTo(BeNil(), "the release must set the holder's expiry")
	g.Expect(holders[0].ExpiresAt.After(env.Clock.Now())).To(BeFalse(), "retention 0 expires at once")

	env.Sim.Sweep()
	_, held := env.Sim.Registration(cidr)
	g.Expect(held).To(BeFalse(), "after the sweep the address is free in the IPAM-API")
}

// runOctet gives each run of a test addresses of its own.
var runOctet atomic.Int32

func TestClaimConditionsForUserFixableFailures(t *testing.T) {
	ns := newNamespace(t)

	t.Run("pool not found, then created", func(t *testing.T) {
		g := NewWithT(t)
		claim := newClaim(t, ns.Name, "early", "late-pool", nil)
		cond := readyCondition(t, claim, metav1.ConditionFalse, "PoolNotReady")
		g.Expect(cond.Message).To(ContainSubstring(`VitistackIPPool "late-pool" not found`))
		newPool(t, ns.Name, "late-pool", routedPool("inet", ipamv1alpha1.IPv4))
		boundAddress(t, claim)
	})

	t.Run("exhausted zone, then freed", func(t *testing.T) {
		g := NewWithT(t)
		pool := newPool(t, ns.Name, "full", routedPool("hnet-public", ipamv1alpha1.IPv4))
		env.Sim.SetExhausted("hnet-public", "ipv4", true)
		claim := newClaim(t, ns.Name, "waits", pool.Name, nil)
		cond := readyCondition(t, claim, metav1.ConditionFalse, "PoolExhausted")
		g.Expect(cond.Message).To(ContainSubstring("zone hnet-public has no free ipv4 address left"))
		hasEvent(t, claim, corev1.EventTypeWarning, "PoolExhausted", "hnet-public")
		env.Sim.SetExhausted("hnet-public", "ipv4", false)
		addr := boundAddress(t, claim)
		readyCondition(t, claim, metav1.ConditionTrue, "Allocated")
		// A claim that recovers says so in an events.k8s.io/v1 event that names what the
		// controller was doing (a first binding sends none).
		hasEvent(t, claim, corev1.EventTypeNormal, "Allocated", addr.Spec.Address)
		evs := &eventsv1.EventList{}
		g.Expect(env.Client.List(ctx, evs, client.InNamespace(ns.Name))).To(Succeed())
		g.Expect(evs.Items).To(ContainElement(And(
			HaveField("Regarding.UID", claim.UID), HaveField("Reason", "Allocated"),
			HaveField("Action", "Allocate"), HaveField("ReportingController", "vitistack-ipam"))))
	})

	t.Run("address held under another secret", func(t *testing.T) {
		g := NewWithT(t)
		// Addresses of this run only (go test -count=N runs it again on one stand-in).
		held, free := fmt.Sprintf("10.99.%d.1", runOctet.Add(1)), fmt.Sprintf("10.99.%d.2", runOctet.Load())
		// Held by someone outside the cluster, under a secret this cluster does not know.
		registerDirect(t, `{"secret":"another-owners-secret","zone":"hnet-private","ip_family":"ipv4","address":"`+held+`/32",`+
			`"service":{"service_name":"elsewhere","namespace_id":"x","cluster_id":"y"}}`)
		pool := newPool(t, ns.Name, "shared", routedPool("hnet-private", ipamv1alpha1.IPv4))
		thief := newClaim(t, ns.Name, "thief", pool.Name, map[string]string{"ipam.vitistack.io/addresses": held})
		cond := readyCondition(t, thief, metav1.ConditionFalse, "AddressTaken")
		g.Expect(cond.Message).To(ContainSubstring("address " + held + "/32 is held under another secret"))
		hasEvent(t, thief, corev1.EventTypeWarning, "AddressTaken", held)
		g.Expect(holdersOf(held+"/32")).To(HaveLen(1), "the owner keeps it alone")
		// Asking for another address, as the message says, works.
		patchAnnotations(t, thief, map[string]string{"ipam.vitistack.io/addresses": free})
		g.Expect(boundAddress(t, thief).Spec.Address).To(Equal(free))
	})

	t.Run("missing secret", func(t *testing.T) {
		g := NewWithT(t)
		pool := newPool(t, ns.Name, "needs-secret", routedPool("inet", ipamv1alpha1.IPv4))
		claim := newClaim(t, ns.Name, "no-secret", pool.Name, map[string]string{"ipam.vitistack.io/secret": "nope"})
		cond := readyCondition(t, claim, metav1.ConditionFalse, "SecretNotFound")
		g.Expect(cond.Message).To(ContainSubstring("Secret " + ns.Name + "/nope with key secret not found"))
		g.Expect(cond.Message).To(ContainSubstring("create it"))
		hasEvent(t, claim, corev1.EventTypeWarning, "SecretNotFound", "nope")
		// Nothing was sent, so following the message works: another secret is used.
		g.Expect(env.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "found"}, Data: map[string][]byte{"secret": []byte("found-secret-value")},
		})).To(Succeed())
		patchAnnotations(t, claim, map[string]string{"ipam.vitistack.io/secret": "found"})
		addr := boundAddress(t, claim)
		g.Expect(addr.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/registered-secret-ref", ns.Name+"/found/secret"))
	})

	t.Run("unknown zone", func(t *testing.T) {
		g := NewWithT(t)
		pool := newPool(t, ns.Name, "nowhere", routedPool("nowhere", ipamv1alpha1.IPv4))
		claim := newClaim(t, ns.Name, "lost", pool.Name, nil)
		cond := readyCondition(t, claim, metav1.ConditionFalse, "PoolNotReady")
		g.Expect(cond.Message).To(ContainSubstring("invalid zone 'nowhere'"))
		g.Expect(cond.Message).To(ContainSubstring("fix the pool"))
		// The pool says so too.
		poolReady(t, pool, metav1.ConditionFalse, "ZoneRejected", "invalid zone 'nowhere'")
		// Nothing is held, so the claim can be deleted at once.
		deleteAndWait(t, claim)
	})

	t.Run("family the zone does not have", func(t *testing.T) {
		pool := newPool(t, ns.Name, "private-v6", routedPool("hnet-private", ipamv1alpha1.IPv6))
		claim := newClaim(t, ns.Name, "v6", pool.Name, nil)
		cond := readyCondition(t, claim, metav1.ConditionFalse, "PoolNotReady")
		NewWithT(t).Expect(cond.Message).To(ContainSubstring("no prefixes found for zone hnet-private with IP family ipv6"))
	})

	t.Run("unreachable IPAM-API", func(t *testing.T) {
		g := NewWithT(t)
		spec := routedPool("inet", ipamv1alpha1.IPv4)
		spec.Endpoint = "http://127.0.0.1:1"
		pool := newPool(t, ns.Name, "unreachable", spec)
		claim := newClaim(t, ns.Name, "stranded", pool.Name, nil)
		cond := readyCondition(t, claim, metav1.ConditionFalse, "IPAMAPIUnreachable")
		g.Expect(cond.Message).To(ContainSubstring("the IPAM-API at http://127.0.0.1:1 could not be reached"))
		hasEvent(t, claim, corev1.EventTypeWarning, "IPAMAPIUnreachable", "127.0.0.1:1")
		poolReady(t, pool, metav1.ConditionFalse, "IPAMAPIUnreachable", "127.0.0.1:1")
	})

	t.Run("endpoint that is not the IPAM-API", func(t *testing.T) {
		g := NewWithT(t)
		spec := routedPool("inet", ipamv1alpha1.IPv4)
		spec.Endpoint = env.SimURL + "/wrong/path"
		pool := newPool(t, ns.Name, "html", spec)
		claim := newClaim(t, ns.Name, "html", pool.Name, nil)
		cond := readyCondition(t, claim, metav1.ConditionFalse, "PoolNotReady")
		g.Expect(cond.Message).To(ContainSubstring("is not answering as the IPAM-API"))
		g.Expect(cond.Message).To(ContainSubstring("text/html"))
	})
}

func poolReady(t *testing.T, pool client.Object, status metav1.ConditionStatus, reason, text string) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool)).To(Succeed())
		p := pool.(ipamv1alpha1.Pool)
		var c *metav1.Condition
		for i := range p.PoolStatus().Conditions {
			if p.PoolStatus().Conditions[i].Type == "Ready" {
				c = &p.PoolStatus().Conditions[i]
			}
		}
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(reason), c.Message)
		g.Expect(c.Status).To(Equal(status))
		g.Expect(c.Message).To(ContainSubstring(text))
	}, eventually, poll).Should(Succeed())
}

var _ = strings.Contains

// An address bound to one claim is not handed to another unless both declare the same
// share key; with it, both bind and both say so.
func TestRequestedAddressIsSharedOnlyByConsent(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pool := newPool(t, ns.Name, "pool", routedPool("hnet-private", ipamv1alpha1.IPv4))
	const share = "ipam.vitistack.io/allow-local-shared-ip"
	first := newClaim(t, ns.Name, "first", pool.Name, map[string]string{"ipam.vitistack.io/addresses": "10.98.0.7", share: "k1"})
	g.Expect(boundAddress(t, first).Spec.Address).To(Equal("10.98.0.7"))

	second := newClaim(t, ns.Name, "second", pool.Name, map[string]string{"ipam.vitistack.io/addresses": "10.98.0.7"})
	cond := readyCondition(t, second, metav1.ConditionFalse, "AddressInUse")
	g.Expect(cond.Message).To(ContainSubstring("IPAddressClaim " + ns.Name + "/first"))
	hasEvent(t, second, corev1.EventTypeWarning, "AddressInUse", ns.Name+"/first")
	g.Expect(holdersOf("10.98.0.7/32")).To(HaveLen(1), "nothing was sent for the refused claim")

	patchAnnotations(t, second, map[string]string{share: "k2"})
	readyCondition(t, second, metav1.ConditionFalse, "AddressInUse")

	patchAnnotations(t, second, map[string]string{share: "k1"})
	g.Expect(boundAddress(t, second).Spec.Address).To(Equal("10.98.0.7"))
	g.Expect(holdersOf("10.98.0.7/32")).To(HaveLen(2))
	for _, c := range []*ipamv1.IPAddressClaim{first, second} {
		g.Eventually(func(g Gomega) {
			got := &ipamv1.IPAddressClaim{}
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(c), got)).To(Succeed())
			shared := meta.FindStatusCondition(got.Status.Conditions, "AddressShared")
			g.Expect(shared).NotTo(BeNil())
			g.Expect(shared.Status).To(Equal(metav1.ConditionTrue))
		}, eventually, poll).Should(Succeed(), "claim %s shows the share", c.Name)
	}
}

// Identity overrides are a privilege of the pool: refused, naming the fix, until the
// pool allows them.
func TestIdentityOverrideNeedsThePoolsConsent(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pool := newPool(t, ns.Name, "strict", routedPool("hnet-private", ipamv1alpha1.IPv4))
	claim := newClaim(t, ns.Name, "impostor", pool.Name, map[string]string{"ipam.vitistack.io/cluster-id": "another-tenants-cluster"})
	cond := readyCondition(t, claim, metav1.ConditionFalse, "IdentityOverrideNotAllowed")
	g.Expect(cond.Message).To(ContainSubstring("spec.allowIdentityOverrides"))
	hasEvent(t, claim, corev1.EventTypeWarning, "IdentityOverrideNotAllowed", "ipam.vitistack.io/cluster-id")
	g.Expect(env.Sim.HeldBy(sim.ServiceRef{ServiceName: "impostor", NamespaceID: uidOf(t, ns.Name), ClusterID: "another-tenants-cluster"})).To(BeEmpty())

	// A patch, not an update: the pool controller writes the pool's status meanwhile.
	patch := client.MergeFrom(pool.DeepCopy())
	pool.Spec.AllowIdentityOverrides = true
	g.Expect(env.Client.Patch(ctx, pool, patch)).To(Succeed())
	boundAddress(t, claim)
	g.Expect(env.Sim.HeldBy(sim.ServiceRef{ServiceName: "impostor", NamespaceID: uidOf(t, ns.Name), ClusterID: "another-tenants-cluster"})).To(HaveLen(1))
}

// A claim changed while its pending record was out is bound with the record as it was
// sent (the IPAM-API answers the same registration); the change then reaches the
// registration without any further event.
func TestChangeWhilePendingReachesTheRegistration(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	api, pool := poolOnOwnSim(t, ns.Name)
	api.SetFaultRoutes(sim.RouteRegister)
	g.Expect(api.SetFaults(sim.Faults{ErrorRate: 1, ErrorStatus: http.StatusServiceUnavailable})).To(Succeed())
	t.Cleanup(api.ClearFaults)
	const retention = "ipam.vitistack.io/retention-period-days"
	claim := newClaim(t, ns.Name, "late", pool.Name, map[string]string{retention: "3"})
	g.Eventually(func() string { return recordOf(t, claim) }, eventually, poll).Should(ContainSubstring(`"attempt"`),
		"a request was sent under the pending record")

	patchAnnotations(t, claim, map[string]string{retention: "9"})
	api.ClearFaults()
	addr := boundAddress(t, claim)
	g.Eventually(func(g Gomega) {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(addr), addr)).To(Succeed())
		g.Expect(addr.Annotations).To(HaveKeyWithValue("ipam.vitistack.io/registered-retention-period-days", "9"))
		held := api.HeldBy(identity(t, ns, "late"))
		g.Expect(held).To(HaveLen(1))
		g.Expect(held[0].Holders).To(HaveLen(1))
		g.Expect(held[0].Holders[0].RetentionPeriodDays).To(Equal(9))
	}, eventually, poll).Should(Succeed())
}

// A claim whose pool is another provider's kind or API group is none of this
// provider's business (the Cluster API contract): it gets no finalizer, no condition
// and no event, here or from anyone else on this control plane. The troubleshooting
// table in the README says so ("my claim does nothing").
func TestAClaimOfAnotherProvidersPoolIsLeftAlone(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	foreign := map[string]ipamv1.IPPoolReference{
		"in-cluster": {APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool", Name: "nodes"},
		"other-kind": {APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: "VitistackIPRange", Name: "nodes"},
	}
	var claims []*ipamv1.IPAddressClaim
	for name, ref := range foreign {
		c := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name}, Spec: ipamv1.IPAddressClaimSpec{PoolRef: ref}}
		g.Expect(env.Client.Create(ctx, c)).To(Succeed())
		claims = append(claims, c)
	}
	// A claim of this provider made after them is bound: the manager has seen theirs.
	pool := newPool(t, ns.Name, "inet-v4", routedPool("inet", ipamv1alpha1.IPv4))
	boundAddress(t, newClaim(t, ns.Name, "ours", pool.Name, nil))
	for _, c := range claims {
		got := &ipamv1.IPAddressClaim{}
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(c), got)).To(Succeed())
		g.Expect(got.Finalizers).To(BeEmpty(), "claim %s", c.Name)
		g.Expect(got.Status.Conditions).To(BeEmpty(), "claim %s", c.Name)
		g.Expect(got.Annotations).To(BeEmpty(), "claim %s", c.Name)
		g.Expect(eventsFor(t, got)).To(BeEmpty(), "claim %s", c.Name)
	}
}

// An IPAM-API that answers with a huge error body (the client reads up to 1 MiB) does
// not stop the provider from saying so: the API server refuses a condition message over
// 32,768 characters, so the pool's and the claim's messages are cut to a few KiB, and
// both show the failure.
func TestAHugeErrorBodyStillShowsAsACondition(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	api, url, stop := env.ExtraSim()
	t.Cleanup(stop)
	g.Expect(api.SetErrorRate(1, 503, `{"message":"`+strings.Repeat("overloaded ", 5000)+`"}`)).To(Succeed())
	spec := routedPool("inet", ipamv1alpha1.IPv4)
	spec.Endpoint = url
	pool := newPool(t, ns.Name, "huge", spec)
	claim := newClaim(t, ns.Name, "huge", pool.Name, nil)
	for _, obj := range []client.Object{pool, claim} {
		g.Eventually(func(g Gomega) {
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
			var conds []metav1.Condition
			switch o := obj.(type) {
			case *ipamv1alpha1.VitistackIPPool:
				conds = o.Status.Conditions
			case *ipamv1.IPAddressClaim:
				conds = o.Status.Conditions
			}
			c := meta.FindStatusCondition(conds, "Ready")
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Message).To(ContainSubstring("overloaded overloaded"))
			g.Expect(c.Message).To(HaveSuffix("…"))
			g.Expect(len(c.Message)).To(BeNumerically("<=", 4096))
		}, eventually, poll).Should(Succeed(), "%T %s", obj, obj.GetName())
	}
}

// A Secret's value changed in place while claims are bound under it: the bound claims
// say so (Ready=False SecretValueChanged and a Warning, the address still theirs) as
// soon as the Secret protector looks at it again, and go back to Allocated once the
// value is restored; their release then goes through.
func TestABoundClaimSaysWhenItsSecretValueChanges(t *testing.T) {
	g := NewWithT(t)
	startManagerWith(t, func(o *manager.Options) { o.SecretRecheckInterval = time.Second })

	ns := newNamespace(t)
	const value = "the-value-it-was-registered-under"
	g.Expect(env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "owner"},
		Data: map[string][]byte{"secret": []byte(value)}})).To(Succeed())
	spec := routedPool("inet", ipamv1alpha1.IPv4)
	spec.SecretRef = &ipamv1alpha1.SecretReference{Name: "owner"}
	pool := newPool(t, ns.Name, "owned", spec)
	claim := newClaim(t, ns.Name, "node", pool.Name, nil)
	addr := boundAddress(t, claim)
	setValue := func(v string) {
		sec := &corev1.Secret{}
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "owner"}, sec)).To(Succeed())
		patch := client.MergeFrom(sec.DeepCopy())
		sec.Data["secret"] = []byte(v)
		g.Expect(env.Client.Patch(ctx, sec, patch)).To(Succeed())
	}

	setValue("someone-typed-a-new-value")
	cond := readyCondition(t, claim, metav1.ConditionFalse, ipamv1alpha1.ClaimReadySecretValueChangedReason)
	g.Expect(cond.Message).To(And(ContainSubstring(ns.Name+"/owner key secret changed"), ContainSubstring(addr.Spec.Address),
		ContainSubstring("stays bound"), ContainSubstring("restored")))
	hasEvent(t, claim, corev1.EventTypeWarning, ipamv1alpha1.ClaimReadySecretValueChangedReason, "stays bound")
	c := &ipamv1.IPAddressClaim{}
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(claim), c)).To(Succeed())
	g.Expect(c.Status.AddressRef.Name).To(Equal(addr.Name), "the address is still the claim's")
	g.Expect(holdersOf(addr.Spec.Address + "/32")).To(ConsistOf(HaveField("ExpiresAt", BeNil())))

	setValue(value)
	readyCondition(t, claim, metav1.ConditionTrue, ipamv1alpha1.ClaimReadyAllocatedReason)
	hasEvent(t, claim, corev1.EventTypeNormal, ipamv1alpha1.ClaimReadyAllocatedReason, addr.Spec.Address)
	deleteAndWait(t, claim)
	g.Expect(holdersOf(addr.Spec.Address+"/32")).To(ConsistOf(HaveField("ExpiresAt", Not(BeNil()))), "released")
}
