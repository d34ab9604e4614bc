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
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
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
	return chaos.Account(ctx, cp.Client, regs, nsUIDs, types.NamespacedName{})
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

// canariesFound lists the places where one of values shows, in any form redaction
// cuts (chaos.Find): every object of every resource the API server lists (found by
// discovery; all namespaces, managedFields included; Secrets without their data and
// the value fingerprints kept on them), the managers' logs (at the e2e log level, 2,
// which holds all that the default level 0 writes) and metrics, and the stand-in's log.
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
					delete(item.Object, "data")
					delete(item.Object, "stringData")
					unstructured.RemoveNestedField(item.Object, "metadata", "annotations", ipamv1alpha1.SecretFingerprintsAnnotation)
				}
				add(gvr.String(), item.Object)
			}
		}
	}
	newG(t).Expect(kinds).To(BeNumerically(">", 40), "discovery found too few resources to scan")
	for _, m := range managers {
		haystacks[m.Name+" log"] = m.Logs()
		if exited, _ := m.Exited(); !exited {
			if metrics, err := localcluster.Get(ctx, m.MetricsURL); err == nil {
				haystacks[m.Name+" metrics"] = metrics
			}
		}
	}
	haystacks["ipam-api-sim log"] = simOf(cp).Logs()
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
// control plane and the stand-in process, see what is planted there: an address the
// IPAM-API holds for the namespace under another cluster ID, a live Secret that keeps
// the secret-in-use finalizer with no record naming it, and a secret value base64'd
// into an object. Once the plants are gone, both find nothing. (test/chaos plants every
// class of the oracle in a fake cluster.)
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
	g.Expect(canariesFound(t, a, []*localcluster.Manager{aMgr}, []string{value})).To(BeEmpty())

	api, err := ipamapi.NewClient(ipamAPI.URL, ipamapi.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	req := ipamapi.Request{Secret: ipamapi.Secret(value), Zone: "inet", Family: ipamapi.FamilyIPv4,
		Identity: ipamapi.Identity{ServiceName: "planted", NamespaceID: uid, ClusterID: "another-cluster"}}
	held, err := api.Register(ctx, req)
	g.Expect(err).NotTo(HaveOccurred())
	spare := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "spare", Finalizers: []string{ipamv1alpha1.SecretInUseFinalizer}}}
	g.Expect(a.Client.Create(ctx, spare)).To(Succeed())
	planted := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "planted"},
		Data: map[string]string{"note": base64.StdEncoding.EncodeToString([]byte(value))}}
	g.Expect(a.Client.Create(ctx, planted)).To(Succeed())

	found, err := account(ctx, a, nsUIDs)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(found.Leaked).To(Equal([]string{held.Address + " held by planted/" + uid + "/another-cluster"}))
	// A protection no record needs, on a Secret the provider never listed: two defects.
	g.Expect(found.Protections).To(ConsistOf(
		"Secret "+ns+"/spare keeps the "+ipamv1alpha1.SecretInUseFinalizer+" finalizer, and no pool or record names it",
		"Secret "+ns+"/spare has the "+ipamv1alpha1.SecretInUseFinalizer+" finalizer, and the provider's list of protected Secrets "+
			"(ConfigMap vitistack-ipam-protected-secrets) does not name it: a new leader would not look at it again"))
	g.Expect(found.Entries()).To(HaveLen(3), "the oracle found more than was planted: %s", found)
	g.Expect(canariesFound(t, a, []*localcluster.Manager{aMgr}, []string{value})).To(ConsistOf(HavePrefix("/v1, Resource=configmaps: ")))

	req.Address = held.Address
	_, err = api.Release(ctx, req)
	g.Expect(err).NotTo(HaveOccurred())
	spare.Finalizers = nil
	g.Expect(a.Client.Update(ctx, spare)).To(Succeed())
	g.Expect(a.Client.Delete(ctx, planted)).To(Succeed())
	after, err := account(ctx, a, nsUIDs)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after.Zero()).To(BeTrue(), "after the plants are gone: %s", after)
	g.Expect(canariesFound(t, a, []*localcluster.Manager{aMgr}, []string{value})).To(BeEmpty())
}
