package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

const (
	timeout  = 60 * time.Second
	interval = 200 * time.Millisecond
)

// newG returns a Gomega for t with the suite's waiting times.
func newG(t *testing.T) *WithT {
	g := NewWithT(t)
	g.SetDefaultEventuallyTimeout(timeout)
	g.SetDefaultEventuallyPollingInterval(interval)
	g.SetDefaultConsistentlyDuration(3 * time.Second)
	g.SetDefaultConsistentlyPollingInterval(interval)
	return g
}

// newControlPlane starts a control plane of the test's own, stopped after it, whose
// provider talks to api (nil: a stand-in of its own, stopped after the test too).
func newControlPlane(t *testing.T, name string, api *localcluster.Sim) *localcluster.ControlPlane {
	t.Helper()
	g := newG(t)
	if api == nil {
		dir := filepath.Join(workDir, name+"-ipam-api")
		g.Expect(os.MkdirAll(dir, 0o700)).To(Succeed())
		var err error
		api, err = localcluster.StartSim(dir, paths, nil)
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(api.Stop)
	}
	cp, err := localcluster.StartControlPlane(workDir, name, paths)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(cp.Stop)
	stands.Store(cp, api)
	t.Cleanup(func() { stands.Delete(cp) })
	return cp
}

// stands holds the IPAM-API stand-in of each control plane: ipamAPI for a.
var stands sync.Map

// simOf is the IPAM-API stand-in the provider on cp talks to.
func simOf(cp *localcluster.ControlPlane) *localcluster.Sim {
	api, _ := stands.Load(cp)
	return api.(*localcluster.Sim)
}

// The suite's tests run in two lanes at once, one test at a time in each: the tests on
// the suite's control plane a and its stand-in (onA), and those that start a control
// plane and a stand-in of their own (onOwn). Each test enters its lane first. The tests
// spend most of their time waiting for processes: one at a time, they kept the two
// cores less than half busy.
var onA, onOwn lane

type lane struct{ mu sync.Mutex }

// enter runs the rest of t in the lane, after the suite's tests that enter no lane.
func (l *lane) enter(t *testing.T) {
	t.Parallel()
	l.mu.Lock()
	t.Cleanup(l.mu.Unlock)
}

// newNamespace creates a namespace with a unique name on cp, deleted (with whatever
// claims are left in it) after the test.
func newNamespace(t *testing.T, cp *localcluster.ControlPlane, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	newG(t).Expect(cp.Client.Create(context.Background(), ns)).To(Succeed())
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), ns) })
	return ns.Name
}

// newSecret creates an IPAM-API secret in ns, labelled for clusterctl move.
func newSecret(t *testing.T, cp *localcluster.ControlPlane, ns, name, value string) {
	t.Helper()
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"clusterctl.cluster.x-k8s.io/move": ""}},
		StringData: map[string]string{"secret": value},
	}
	newG(t).Expect(cp.Client.Create(context.Background(), s)).To(Succeed())
}

// newGlobalPool creates a GlobalVitistackIPPool for zone and family, deleted after the test.
func newGlobalPool(t *testing.T, cp *localcluster.ControlPlane, name, zone string, family ipamv1alpha1.IPFamily) {
	t.Helper()
	pool := &ipamv1alpha1.GlobalVitistackIPPool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       ipamv1alpha1.VitistackIPPoolSpec{Zone: zone, IPFamily: family},
	}
	newG(t).Expect(cp.Client.Create(context.Background(), pool)).To(Succeed())
	t.Cleanup(func() {
		_ = cp.Client.Delete(context.Background(), pool)
	})
}

// newClaim creates a claim from pool (kind GlobalVitistackIPPool or VitistackIPPool); a
// non-empty cluster links it to that Cluster (spec.clusterName and an owner reference).
func newClaim(t *testing.T, cp *localcluster.ControlPlane, ns, name, kind, pool string, cluster *clusterv1.Cluster) *ipamv1.IPAddressClaim {
	t.Helper()
	claim := &ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{
			APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: kind, Name: pool,
		}},
	}
	if cluster != nil {
		claim.Spec.ClusterName = cluster.Name
		claim.Labels = map[string]string{clusterv1.ClusterNameLabel: cluster.Name}
		claim.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: cluster.Name, UID: cluster.UID,
		}}
	}
	newG(t).Expect(cp.Client.Create(context.Background(), claim)).To(Succeed())
	return claim
}

// newCluster creates a Cluster that looks provisioned (what clusterctl move checks),
// paused or not; no Cluster API controller runs here, so its status is written by hand.
func newCluster(t *testing.T, cp *localcluster.ControlPlane, ns, name string, paused bool) *clusterv1.Cluster {
	t.Helper()
	g := newG(t)
	ctx := context.Background()
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: clusterv1.ClusterSpec{ClusterNetwork: clusterv1.ClusterNetwork{Pods: clusterv1.NetworkRanges{CIDRBlocks: []string{"192.168.0.0/16"}}}}}
	if paused {
		cluster.Spec.Paused = ptr.To(true)
	}
	g.Expect(cp.Client.Create(ctx, cluster)).To(Succeed())
	cluster.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
	cluster.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	meta.SetStatusCondition(&cluster.Status.Conditions, metav1.Condition{
		Type: clusterv1.ClusterControlPlaneInitializedCondition, Status: metav1.ConditionTrue, Reason: "Initialized",
	})
	g.Expect(cp.Client.Status().Update(ctx, cluster)).To(Succeed())
	return cluster
}

// setPaused sets the Cluster's spec.paused.
func setPaused(t *testing.T, cp *localcluster.ControlPlane, cluster *clusterv1.Cluster, paused bool) {
	t.Helper()
	ctx := context.Background()
	newG(t).Eventually(func(g Gomega) {
		c := &clusterv1.Cluster{}
		g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(cluster), c)).To(Succeed())
		c.Spec.Paused = ptr.To(paused)
		g.Expect(cp.Client.Update(ctx, c)).To(Succeed())
	}).Should(Succeed())
}

// boundAddress waits for the claim's IPAddress and returns it.
func boundAddress(t *testing.T, cp *localcluster.ControlPlane, claim *ipamv1.IPAddressClaim) *ipamv1.IPAddress {
	t.Helper()
	ctx := context.Background()
	addr := &ipamv1.IPAddress{}
	newG(t).Eventually(func(g Gomega) {
		c := &ipamv1.IPAddressClaim{}
		g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), c)).To(Succeed())
		g.Expect(c.Status.AddressRef.Name).NotTo(BeEmpty(), "claim %s/%s is not bound; conditions: %v", c.Namespace, c.Name, c.Status.Conditions)
		g.Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Status.AddressRef.Name}, addr)).To(Succeed())
	}).WithTimeout(2 * timeout).Should(Succeed())
	return addr
}

// readyReason waits for the claim's Ready condition to have status and reason.
func readyReason(t *testing.T, cp *localcluster.ControlPlane, claim *ipamv1.IPAddressClaim, status metav1.ConditionStatus, reason string) metav1.Condition {
	t.Helper()
	var cond metav1.Condition
	newG(t).Eventually(func(g Gomega) {
		c := &ipamv1.IPAddressClaim{}
		g.Expect(cp.Client.Get(context.Background(), client.ObjectKeyFromObject(claim), c)).To(Succeed())
		got := meta.FindStatusCondition(c.Status.Conditions, ipamv1.IPAddressClaimReadyCondition)
		g.Expect(got).NotTo(BeNil())
		g.Expect(got.Status).To(Equal(status), "message: %s", got.Message)
		g.Expect(got.Reason).To(Equal(reason), "message: %s", got.Message)
		cond = *got
	}).Should(Succeed())
	return cond
}

// eventsOf returns the events recorded for an object.
func eventsOf(t *testing.T, cp *localcluster.ControlPlane, obj client.Object) []corev1.Event {
	t.Helper()
	list := &corev1.EventList{}
	newG(t).Expect(cp.Client.List(context.Background(), list, client.InNamespace(obj.GetNamespace()),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.name", obj.GetName())})).To(Succeed())
	return list.Items
}

// registrationOf returns the record cp's stand-in keeps of an address ("10.1.2.3" or a CIDR).
func registrationOf(t *testing.T, cp *localcluster.ControlPlane, address string) (sim.Registration, bool) {
	t.Helper()
	regs, err := simOf(cp).Registrations(context.Background())
	newG(t).Expect(err).NotTo(HaveOccurred())
	for _, r := range regs {
		if strings.SplitN(r.Address, "/", 2)[0] == strings.SplitN(address, "/", 2)[0] {
			return r, true
		}
	}
	return sim.Registration{}, false
}

// activeHolders returns the holders of address that are not released (no expiry set).
// An address the stand-in has no record of must be one its cleanup worker freed (it
// frees an address once its last holder's expiry passes); one it never registered fails
// the test, so that "released" cannot pass on a lookup that missed.
func activeHolders(t *testing.T, cp *localcluster.ControlPlane, address string) []sim.Holder {
	t.Helper()
	reg, ok := registrationOf(t, cp, address)
	if !ok {
		stats, err := simOf(cp).Stats(context.Background())
		newG(t).Expect(err).NotTo(HaveOccurred())
		newG(t).Expect(stats.Freed).To(HaveKey(strings.SplitN(address, "/", 2)[0]+"/"+hostBits(address)),
			"the IPAM-API stand-in never registered %s", address)
		return nil
	}
	var out []sim.Holder
	for _, h := range reg.Holders {
		if h.ExpiresAt == nil {
			out = append(out, h)
		}
	}
	return out
}

// deleteAndWait deletes obj on cp and waits until it is gone.
func deleteAndWait(t *testing.T, cp *localcluster.ControlPlane, obj client.Object) {
	t.Helper()
	ctx := context.Background()
	newG(t).Expect(cp.Client.Delete(ctx, obj)).To(Succeed())
	newG(t).Eventually(func() bool {
		return apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj))
	}).WithTimeout(2*timeout).Should(BeTrue(), "%T %s is not gone", obj, obj.GetName())
}

// uidOf returns the UID of a Namespace.
func uidOf(t *testing.T, cp *localcluster.ControlPlane, namespace string) string {
	t.Helper()
	ns := &corev1.Namespace{}
	newG(t).Expect(cp.Client.Get(context.Background(), client.ObjectKey{Name: namespace}, ns)).To(Succeed())
	return string(ns.UID)
}

// logsOf returns what p has logged so far; a log that cannot be read fails the test.
func logsOf(t *testing.T, p interface{ Logs() (string, error) }) string {
	t.Helper()
	l, err := p.Logs()
	newG(t).Expect(err).NotTo(HaveOccurred())
	return l
}

// hostBits is the prefix length of a single address of address's family: 32 or 128.
func hostBits(address string) string {
	if strings.Contains(address, ":") {
		return "128"
	}
	return "32"
}
