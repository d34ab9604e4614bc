package controllers_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/testenv"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

var (
	env     *testenv.Env
	ctx     = context.Background()
	mgrOpts = testenv.DefaultOptions()
)

func TestMain(m *testing.M) {
	var err error
	env, err = testenv.Start(ctx, mgrOpts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the test environment:", err)
		os.Exit(1)
	}
	if err := env.StartControllerManager(); err != nil {
		fmt.Fprintln(os.Stderr, "starting kube-controller-manager:", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the test environment:", err)
	}
	os.Exit(code)
}

const (
	eventually = 20 * time.Second
	poll       = 50 * time.Millisecond
)

// startManagerWith runs the manager with the suite's options changed by change for the
// rest of the test, and with the suite's own after it. It returns the options.
func startManagerWith(t *testing.T, change func(*manager.Options)) manager.Options {
	t.Helper()
	g := NewWithT(t)
	opts := mgrOpts
	change(&opts)
	g.Expect(env.StopManager()).To(Succeed())
	g.Expect(env.StartManager(ctx, opts)).To(Succeed())
	t.Cleanup(func() {
		g.Expect(env.StopManager()).To(Succeed())
		g.Expect(env.StartManager(ctx, mgrOpts)).To(Succeed())
	})
	return opts
}

// newNamespace creates a namespace for one test.
func newNamespace(t *testing.T) *corev1.Namespace {
	t.Helper()
	g := NewWithT(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"}}
	g.Expect(env.Client.Create(ctx, ns)).To(Succeed())
	return ns
}

// newPool creates a namespaced pool.
func newPool(t *testing.T, ns, name string, spec ipamv1alpha1.VitistackIPPoolSpec) *ipamv1alpha1.VitistackIPPool {
	t.Helper()
	pool := &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
	NewWithT(t).Expect(env.Client.Create(ctx, pool)).To(Succeed())
	return pool
}

// newClaim creates a claim for a namespaced pool.
func newClaim(t *testing.T, ns, name, pool string, annotations map[string]string) *ipamv1.IPAddressClaim {
	t.Helper()
	return createClaim(t, ns, name, ipamv1alpha1.VitistackIPPoolKind, pool, annotations)
}

func createClaim(t *testing.T, ns, name, kind, pool string, annotations map[string]string) *ipamv1.IPAddressClaim {
	t.Helper()
	claim := &ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{
			APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: kind, Name: pool,
		}},
	}
	NewWithT(t).Expect(env.Client.Create(ctx, claim)).To(Succeed())
	return claim
}

// managerLines is what the manager logged about an object (the last 40 lines), for a
// failure message.
func managerLines(name string) string {
	var out []string
	for _, l := range strings.Split(env.Logs.String(), "\n") {
		if strings.Contains(l, `"`+name+`"`) || strings.Contains(l, "/"+name+`"`) {
			out = append(out, l)
		}
	}
	if len(out) > 40 {
		out = out[len(out)-40:]
	}
	return strings.Join(out, "\n")
}

// boundAddress waits for the claim to be bound and returns its IPAddress.
func boundAddress(t *testing.T, claim *ipamv1.IPAddressClaim) *ipamv1.IPAddress {
	t.Helper()
	g := NewWithT(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the manager's log about %s:\n%s", claim.Name, managerLines(claim.Name))
		}
	})
	addr := &ipamv1.IPAddress{}
	g.Eventually(func(g Gomega) {
		c := &ipamv1.IPAddressClaim{}
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(claim), c)).To(Succeed())
		g.Expect(c.Status.AddressRef.Name).NotTo(BeEmpty(), "claim %s/%s is not bound; conditions: %v; annotations: %v",
			claim.Namespace, claim.Name, c.Status.Conditions, c.Annotations)
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Status.AddressRef.Name}, addr)).To(Succeed())
	}, eventually, poll).Should(Succeed())
	return addr
}

// readyCondition waits until the claim's Ready condition has the given reason.
func readyCondition(t *testing.T, claim *ipamv1.IPAddressClaim, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	var cond *metav1.Condition
	NewWithT(t).Eventually(func(g Gomega) {
		c := &ipamv1.IPAddressClaim{}
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(claim), c)).To(Succeed())
		cond = meta.FindStatusCondition(c.Status.Conditions, ipamv1.IPAddressClaimReadyCondition)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Reason).To(Equal(reason), "message: %s", cond.Message)
		g.Expect(cond.Status).To(Equal(status))
	}, eventually, poll).Should(Succeed())
	return cond
}

// eventsFor lists the events recorded for an object.
func eventsFor(t *testing.T, obj client.Object) []corev1.Event {
	t.Helper()
	list := &corev1.EventList{}
	NewWithT(t).Expect(env.Client.List(ctx, list, client.InNamespace(obj.GetNamespace()))).To(Succeed())
	var out []corev1.Event
	for _, e := range list.Items {
		if e.InvolvedObject.UID == obj.GetUID() || (e.InvolvedObject.Name == obj.GetName() && e.InvolvedObject.Kind != "") {
			out = append(out, e)
		}
	}
	return out
}

// hasEvent waits for an event of the given type and reason whose message contains text.
func hasEvent(t *testing.T, obj client.Object, typ, reason, text string) {
	t.Helper()
	NewWithT(t).Eventually(func() []string {
		var got []string
		for _, e := range eventsFor(t, obj) {
			got = append(got, e.Type+"/"+e.Reason+": "+e.Message)
			if e.Type == typ && e.Reason == reason && strings.Contains(e.Message, text) {
				return nil
			}
		}
		if got == nil {
			got = []string{"(no events)"}
		}
		return got
	}, eventually, poll).Should(BeNil())
}

// holdersOf returns the stand-in's holders of an address ("" when nobody holds it).
func holdersOf(address string) []sim.Holder {
	return env.Sim.Holders(address)
}

func uidOf(t *testing.T, name string) string {
	t.Helper()
	ns := &corev1.Namespace{}
	NewWithT(t).Expect(env.Client.Get(ctx, client.ObjectKey{Name: name}, ns)).To(Succeed())
	return string(ns.UID)
}

// deleteAndWait deletes obj and waits until it is gone.
//
// A pool's delete is refused (403) while the webhook's cache still lists a claim of it
// that was deleted a moment ago, or while its subnet check's address is being released;
// the refusal says to try again, so the delete is tried again until it is accepted.
func deleteAndWait(t *testing.T, obj client.Object) {
	t.Helper()
	NewWithT(t).Eventually(func() error {
		return client.IgnoreNotFound(env.Client.Delete(ctx, obj))
	}, eventually, poll).Should(Succeed(), "deleting %s", obj.GetName())
	waitGone(t, obj)
}

// waitGone waits until obj is no longer there.
func waitGone(t *testing.T, obj client.Object) {
	t.Helper()
	NewWithT(t).Eventually(func() bool {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		return err != nil && client.IgnoreNotFound(err) == nil
	}, eventually, poll).Should(BeTrue(), func() string {
		return fmt.Sprintf("%s was not deleted: finalizers %v; the manager's log about it:\n%s", obj.GetName(), obj.GetFinalizers(), managerLines(obj.GetName()))
	})
}

// identity is the IPAM-API identity a claim named serviceName in ns registers under
// by default (the namespace's UID, the kube-system UID as cluster_id).
func identity(t *testing.T, ns *corev1.Namespace, serviceName string) sim.ServiceRef {
	t.Helper()
	return sim.ServiceRef{ServiceName: serviceName, NamespaceID: string(ns.UID), ClusterID: uidOf(t, "kube-system")}
}

// boundRoutedClaim is a claim named name of a new namespace's routed IPv4 pool in zone
// inet, and its IPAddress once bound.
func boundRoutedClaim(t *testing.T, name string) (*corev1.Namespace, *ipamv1.IPAddressClaim, *ipamv1.IPAddress) {
	t.Helper()
	ns := newNamespace(t)
	pool := newPool(t, ns.Name, "pool", routedPool("inet", ipamv1alpha1.IPv4))
	claim := newClaim(t, ns.Name, name, pool.Name, nil)
	return ns, claim, boundAddress(t, claim)
}

func routedPool(zone string, family ipamv1alpha1.IPFamily) ipamv1alpha1.VitistackIPPoolSpec {
	return ipamv1alpha1.VitistackIPPoolSpec{Zone: zone, IPFamily: family}
}

// withOverrides lets the pool's claims choose their IPAM-API identity.
func withOverrides(spec ipamv1alpha1.VitistackIPPoolSpec) ipamv1alpha1.VitistackIPPoolSpec {
	spec.AllowIdentityOverrides = true
	return spec
}

var _ = ptr.To[int32]
