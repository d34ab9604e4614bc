package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	gomegatypes "github.com/onsi/gomega/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/test/chaos"
)

// account is the accounting oracle (chaos.Account) on cp and the stand-in, for the
// identities and objects of the namespaces whose UIDs are in nsUIDs.
func account(ctx context.Context, cp *localcluster.ControlPlane, nsUIDs map[string]bool) (chaos.Accounts, error) {
	regs, err := simOf(cp).Registrations(ctx)
	if err != nil {
		return chaos.Accounts{}, err
	}
	// The scopes here are the tests' own namespaces: the default Secret is in none.
	accounts, err := chaos.Account(ctx, cp.Client, regs, nsUIDs, types.NamespacedName{})
	if err != nil {
		return accounts, err
	}
	// And beyond them: whatever the provider holds under this cluster's ID (the UID of
	// its kube-system Namespace, --cluster-id's default) for no Namespace of it.
	kubeSystem := &corev1.Namespace{}
	if err := cp.Client.Get(ctx, types.NamespacedName{Name: "kube-system"}, kubeSystem); err != nil {
		return accounts, err
	}
	strays, err := chaos.Strays(ctx, cp.Client, regs, string(kubeSystem.UID))
	accounts.Leaked = append(accounts.Leaked, strays...)
	return accounts, err
}

// settledAccounts waits (up to the timeout) for the oracle to find nothing wrong and
// returns what it found last: a quiet moment may take a while after faults.
func settledAccounts(t *testing.T, cp *localcluster.ControlPlane, nsUIDs map[string]bool) chaos.Accounts {
	t.Helper()
	var last chaos.Accounts
	newG(t).Eventually(func(g Gomega) {
		var err error
		last, err = account(context.Background(), cp, nsUIDs)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(last.Zero()).To(BeTrue(), "the accounting oracle: %s", last)
	}).WithTimeout(3 * timeout).WithPolling(time.Second).Should(Succeed())
	return last
}

// canary returns a secret value that is easy to find anywhere it should not be.
func canary(name string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "canary-" + name + "-" + hex.EncodeToString(b)
}

// canariesFound lists the places where one of values shows, in any form the scan's
// needles have (chaos.Find): every object of every resource the API server lists (found
// by discovery; all namespaces, managedFields included; of a Secret, all but a data key
// that holds exactly one of the values, which is where the value lives, and the value
// fingerprints kept on it), the managers' logs (at the e2e log level, 2, which holds all
// that the default level 0 writes) and metrics, and the stand-in's log.
func canariesFound(t *testing.T, cp *localcluster.ControlPlane, managers []*localcluster.Manager, values []string) []string {
	t.Helper()
	ctx := context.Background()
	haystacks := map[string]string{}
	add := func(what string, v any) {
		b, err := json.Marshal(v)
		newG(t).Expect(err).NotTo(HaveOccurred())
		haystacks[what] += string(b) + "\n"
	}
	cfg := rest.CopyConfig(cp.Config)
	cfg.WarningHandler = rest.NoWarnings{} // deprecated kinds are listed too
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	newG(t).Expect(err).NotTo(HaveOccurred())
	dyn, err := dynamic.NewForConfig(cfg)
	newG(t).Expect(err).NotTo(HaveOccurred())
	lists, err := disco.ServerPreferredResources()
	newG(t).Expect(err).NotTo(HaveOccurred())
	kinds := 0
	for _, rl := range discovery.FilteredBy(discovery.SupportsAllVerbs{Verbs: []string{"list"}}, lists) {
		gv, err := schema.ParseGroupVersion(rl.GroupVersion)
		newG(t).Expect(err).NotTo(HaveOccurred())
		for _, res := range rl.APIResources {
			gvr := gv.WithResource(res.Name)
			items, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
			newG(t).Expect(err).NotTo(HaveOccurred(), "listing %s", gvr)
			kinds++
			for _, item := range items.Items {
				if gvr.Group == "" && res.Name == "secrets" {
					data, _, _ := unstructured.NestedStringMap(item.Object, "data")
					for k, v := range data {
						if b, err := base64.StdEncoding.DecodeString(v); err == nil && slices.Contains(values, string(b)) {
							delete(data, k) // the value's own home
						}
					}
					_ = unstructured.SetNestedStringMap(item.Object, data, "data")
					unstructured.RemoveNestedField(item.Object, "metadata", "annotations", ipamv1alpha1.SecretFingerprintsAnnotation)
				}
				add(gvr.String(), item.Object)
			}
		}
	}
	newG(t).Expect(kinds).To(BeNumerically(">", 40), "discovery found too few resources to scan")
	for _, m := range managers {
		haystacks[m.Name+" log"] = logsOf(t, m)
		if exited, _ := m.Exited(); !exited {
			metrics, err := localcluster.Get(ctx, m.MetricsURL)
			if exited, _ := m.Exited(); !exited { // not killed meanwhile: its metrics must be read
				newG(t).Expect(err).NotTo(HaveOccurred(), "scraping %s's metrics for the canary scan", m.Name)
			}
			haystacks[m.Name+" metrics"] = metrics
		}
	}
	haystacks["ipam-api-sim log"] = logsOf(t, simOf(cp))
	return chaos.Find(haystacks, values...)
}

// writeChaosSummary prints the scenarios' table (with CHAOS_ROWS, every suite's rows)
// and, when E2E_CHAOS_SUMMARY names a file, writes it there (make test-chaos:
// out/chaos/summary.md).
func writeChaosSummary() {
	rows, err := chaos.Rows()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: reading the chaos rows:", err)
		return
	}
	if len(rows) == 0 {
		return
	}
	table := chaos.Table(rows, time.Now())
	fmt.Print("\n" + table)
	if f := os.Getenv("E2E_CHAOS_SUMMARY"); f != "" {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err == nil {
			_ = os.WriteFile(f, []byte(table), 0o644)
		}
	}
}

// The accounting oracle and the canary scan, as the chaos scenarios run them on this
// control plane and the stand-in process, see what is planted there. The oracle, a
// defect of each of its six classes: an address the IPAM-API holds for the namespace
// under another cluster ID, and one under this cluster's ID for the namespace's name
// instead of its UID (leaked, the second outside the scenario's scope); two IPAddresses recording it (duplicated), whose
// claims are gone (orphaned), one with another address than its record's (mismatched);
// a deleted Secret held back by a finalizer (stuck); a live Secret that keeps the
// secret-in-use finalizer with no record naming it (protections, twice). The scan, a
// secret value in each kind of place and in a form of its own: base64 in a ConfigMap,
// inside a longer blob in another Secret, upper-case hex in an event, base64 at an
// offset in a manager's log line, and hex in a metric's label (a pool named so; its
// value is a shorter one, as a pool's name has at most 63 characters). Once
// the plants are gone, both find nothing, but in the manager's log, which keeps the
// planted line and the pool's name wherever the manager logged it. (test/chaos
// plants every class of the oracle in a fake cluster, and every form of the scan.)
func TestOracleAndCanaryScanSeePlantedDefects(t *testing.T) {
	onA.enter(t)
	g := newG(t)
	ctx := context.Background()
	ns := newNamespace(t, a, "planted")
	value := canary("planted")
	newSecret(t, a, ns, "owner", value)
	uid := uidOf(t, a, ns)
	nsUIDs := map[string]bool{uid: true}
	clean, err := account(ctx, a, nsUIDs)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(clean.Zero()).To(BeTrue(), "before planting: %s", clean)
	// A pool's name, at most 63 characters, holds the hex of a shorter value.
	short := canary("p")[:20]
	scan := func() []string { return canariesFound(t, a, []*localcluster.Manager{aMgr}, []string{value, short}) }
	g.Expect(scan()).To(BeEmpty())

	// The oracle's plants.
	api, err := ipamapi.NewClient(ipamAPI.URL, ipamapi.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	req := ipamapi.Request{Secret: ipamapi.Secret(value), Zone: "inet", Family: ipamapi.FamilyIPv4,
		Identity: ipamapi.Identity{ServiceName: "planted", NamespaceID: uid, ClusterID: "another-cluster"}}
	held, err := api.Register(ctx, req)
	g.Expect(err).NotTo(HaveOccurred())
	// An identity bug's shape: under this cluster's ID, the namespace's name for its UID.
	kubeSystem := &corev1.Namespace{}
	g.Expect(a.Client.Get(ctx, client.ObjectKey{Name: "kube-system"}, kubeSystem)).To(Succeed())
	strayReq := req
	strayReq.Identity = ipamapi.Identity{ServiceName: "planted", NamespaceID: ns, ClusterID: string(kubeSystem.UID)}
	stray, err := api.Register(ctx, strayReq)
	g.Expect(err).NotTo(HaveOccurred())
	spare := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "spare", Finalizers: []string{ipamv1alpha1.SecretInUseFinalizer}}}
	g.Expect(a.Client.Create(ctx, spare)).To(Succeed())
	heldBack := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "held-back", Finalizers: []string{"e2e.vitistack.io/hold"}}}
	g.Expect(a.Client.Create(ctx, heldBack)).To(Succeed())
	g.Expect(a.Client.Delete(ctx, heldBack)).To(Succeed())
	rec := &record.Registration{Endpoint: ipamAPI.URL, Zone: "inet", Family: ipamapi.FamilyIPv4, Address: held.Address,
		Identity: req.Identity, Secret: record.ObjectRef{Namespace: ns, Name: "owner", Key: "secret"}, Phase: record.PhaseRegistered}
	var planted []client.Object
	for name, address := range map[string]string{"dup-a": strings.TrimSuffix(held.Address, "/32"), "dup-b": "10.250.250.250"} {
		addr := &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}, Annotations: map[string]string{}},
			Spec: ipamv1.IPAddressSpec{Address: address, Prefix: ptr.To[int32](32),
				PoolRef:  ipamv1.IPPoolReference{APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: global, Name: "e2e-planted"},
				ClaimRef: ipamv1.IPAddressClaimReference{Name: name}}}
		rec.WriteTo(addr.Labels, addr.Annotations)
		g.Expect(a.Client.Create(ctx, addr)).To(Succeed())
		planted = append(planted, addr)
	}

	// The scan's plants.
	blob := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "planted"},
		Data: map[string]string{"note": base64.StdEncoding.EncodeToString([]byte(value))}}
	copied := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "copied"},
		Data: map[string][]byte{"config": []byte("user:" + value + "\n")}}
	event := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "planted.1"},
		InvolvedObject: corev1.ObjectReference{Kind: "Secret", Namespace: ns, Name: "owner", APIVersion: "v1"},
		Reason:         "Planted", Type: corev1.EventTypeWarning, Message: "refused: " + strings.ToUpper(hex.EncodeToString([]byte(value)))}
	pool := &ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: hex.EncodeToString([]byte(short))},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4}}
	for _, obj := range []client.Object{blob, copied, event, pool} {
		g.Expect(a.Client.Create(ctx, obj)).To(Succeed())
		planted = append(planted, obj)
	}
	log, err := os.OpenFile(aMgr.LogFile, os.O_WRONLY|os.O_APPEND, 0)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = fmt.Fprintf(log, "I1202 00:00:00.000000       1 planted.go:1] \"Planted\" blob=%q\n", base64.StdEncoding.EncodeToString([]byte("x"+value)))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(log.Close()).To(Succeed())

	found, err := account(ctx, a, nsUIDs)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(found.Leaked).To(ConsistOf(held.Address+" held by planted/"+uid+"/another-cluster",
		stray.Address+" held by planted/"+ns+"/"+string(kubeSystem.UID)+", under a namespace ID known nowhere in the cluster"))
	g.Expect(found.Duplicated).To(ConsistOf(HaveSuffix("|inet|" + held.Address + " bound by 2 IPAddresses")))
	g.Expect(found.Orphaned).To(ConsistOf(
		"IPAddress "+ns+"/dup-a: its claim "+ns+"/dup-a is gone or not bound to it",
		"IPAddress "+ns+"/dup-b: its claim "+ns+"/dup-b is gone or not bound to it"))
	g.Expect(found.Mismatched).To(ConsistOf(fmt.Sprintf("IPAddress %s/dup-b has address %q, its record %s", ns, "10.250.250.250", held.Address)))
	g.Expect(found.Stuck).To(ConsistOf("Secret " + ns + "/held-back (finalizers [e2e.vitistack.io/hold])"))
	// A protection no record needs, on a Secret the provider never listed: two defects.
	g.Expect(found.Protections).To(ConsistOf(
		"Secret "+ns+"/spare keeps the "+ipamv1alpha1.SecretInUseFinalizer+" finalizer, and no pool or record names it",
		"Secret "+ns+"/spare has the "+ipamv1alpha1.SecretInUseFinalizer+" finalizer, and the provider's list of protected Secrets "+
			"(ConfigMap vitistack-ipam-protected-secrets) does not name it: a new leader would not look at it again"))
	g.Expect(found.Entries()).To(HaveLen(9), "the oracle found more than was planted: %s", found)
	places := []string{"/v1, Resource=configmaps: ", "/v1, Resource=secrets: ", "/v1, Resource=events: ",
		"ipam.vitistack.io/v1alpha1, Resource=globalvitistackippools: ", aMgr.Name + " log: ", aMgr.Name + " metrics: "}
	var each []gomegatypes.GomegaMatcher
	for _, p := range places {
		each = append(each, ContainElement(HavePrefix(p)))
	}
	g.Eventually(scan).Should(And(each...), "the scan does not see every plant") // the pool's metric comes with the next reconcile
	g.Expect(scan()).To(HaveEach(Or(HavePrefix("events.k8s.io/v1, Resource=events: "), WithTransform(func(f string) bool {
		return slices.ContainsFunc(places, func(p string) bool { return strings.HasPrefix(f, p) })
	}, BeTrue()))), "the scan found a secret value where none was planted")

	req.Address, strayReq.Address = held.Address, stray.Address
	for _, r := range []ipamapi.Request{req, strayReq} {
		_, err = api.Release(ctx, r)
		g.Expect(err).NotTo(HaveOccurred())
	}
	spare.Finalizers = nil
	g.Expect(a.Client.Update(ctx, spare)).To(Succeed())
	g.Expect(a.Client.Get(ctx, client.ObjectKeyFromObject(heldBack), heldBack)).To(Succeed())
	heldBack.Finalizers = nil
	g.Expect(a.Client.Update(ctx, heldBack)).To(Succeed())
	for _, obj := range planted {
		deleteAndWait(t, a, obj)
	}
	// The planted IPAddresses' records named the owner Secret: the protector lets it go.
	settledAccounts(t, a, nsUIDs)
	// A log keeps what it was written: the planted line, and the pool's name wherever
	// the manager logged it (at --v=5, as a chaos scenario's leader runs, each reconcile).
	g.Eventually(scan).Should(And(HaveEach(HavePrefix(aMgr.Name+" log: ")), ContainElement(ContainSubstring("planted.go:1"))),
		"after the plants are gone, but the manager's log")
}
