package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/test/chaos"
)

// accounts is what the accounting oracle finds at a quiet moment, for the identities of
// some namespaces (their UIDs: a namespace may be gone by then): every entry names the
// object or the registration.
type accounts struct {
	// Leaked: held live by the IPAM-API, recorded by no IPAddress and no claim.
	Leaked []string
	// Duplicated: one address bound by two IPAddresses that do not both declare a share.
	Duplicated []string
	// Orphaned: recorded by an IPAddress, not held live by the IPAM-API.
	Orphaned []string
	// Stuck: deleted objects (claims, IPAddresses, Services, Secrets, namespaces) that
	// are still there.
	Stuck []string
}

func (a accounts) zero() bool {
	return len(a.Leaked)+len(a.Duplicated)+len(a.Orphaned)+len(a.Stuck) == 0
}

func (a accounts) String() string {
	return fmt.Sprintf("leaked %v, duplicated %v, orphaned %v, stuck %v", a.Leaked, a.Duplicated, a.Orphaned, a.Stuck)
}

// account compares what the stand-in holds (its debug API) with what the cluster
// records, for the holders whose namespace_id is one of nsUIDs.
func account(ctx context.Context, cp *localcluster.ControlPlane, nsUIDs map[string]bool) (accounts, error) {
	var out accounts
	regs, err := ipamAPI.Registrations(ctx)
	if err != nil {
		return out, err
	}
	type holding struct{ address, service, ns, cluster string }
	live := map[holding]bool{}
	for _, r := range regs {
		for _, h := range r.Holders {
			if h.ExpiresAt == nil && nsUIDs[h.NamespaceID] {
				live[holding{r.Address, h.ServiceName, h.NamespaceID, h.ClusterID}] = true
			}
		}
	}
	// The scenario's namespaces that still exist, by name (read once).
	nss := &corev1.NamespaceList{}
	if err := cp.Client.List(ctx, nss); err != nil {
		return out, err
	}
	ours := map[string]corev1.Namespace{}
	for _, ns := range nss.Items {
		if nsUIDs[string(ns.UID)] {
			ours[ns.Name] = ns
		}
	}
	addrs := &ipamv1.IPAddressList{}
	if err := cp.Client.List(ctx, addrs); err != nil {
		return out, err
	}
	recorded := map[holding]bool{}
	byHost := map[string][]ipamv1.IPAddress{}
	for _, a := range addrs.Items {
		rec, err := record.OnAddress(a.Labels, a.Annotations)
		if err != nil || rec == nil || !nsUIDs[rec.Identity.NamespaceID] {
			continue
		}
		h := holding{rec.Address, rec.Identity.ServiceName, rec.Identity.NamespaceID, rec.Identity.ClusterID}
		recorded[h] = true
		if !live[h] {
			out.Orphaned = append(out.Orphaned, fmt.Sprintf("IPAddress %s/%s (%s)", a.Namespace, a.Name, rec.Address))
		}
		if !a.DeletionTimestamp.IsZero() {
			out.Stuck = append(out.Stuck, fmt.Sprintf("IPAddress %s/%s", a.Namespace, a.Name))
		}
		byHost[rec.HostKey()] = append(byHost[rec.HostKey()], a)
	}
	for host, list := range byHost {
		if len(list) < 2 {
			continue
		}
		share := list[0].Annotations[ipamv1alpha1.AllowLocalSharedIPAnnotation]
		for _, a := range list[1:] {
			if share == "" || a.Annotations[ipamv1alpha1.AllowLocalSharedIPAnnotation] != share {
				out.Duplicated = append(out.Duplicated, fmt.Sprintf("%s bound by %d IPAddresses", host, len(list)))
				break
			}
		}
	}
	// An unbound claim's pending record (written before each request) accounts for one
	// address of its identity: the IPAM-API may have answered a request whose answer
	// was lost. (A bound claim keeps its record too; its IPAddress accounts for it.)
	claims := &ipamv1.IPAddressClaimList{}
	if err := cp.Client.List(ctx, claims); err != nil {
		return out, err
	}
	pending := map[holding]bool{}
	for _, c := range claims.Items {
		rec, err := record.OnClaim(c.Annotations)
		if err == nil && rec != nil && nsUIDs[rec.Identity.NamespaceID] && c.Status.AddressRef.Name == "" {
			pending[holding{"", rec.Identity.ServiceName, rec.Identity.NamespaceID, rec.Identity.ClusterID}] = true
			if rec.Address != "" {
				recorded[holding{rec.Address, rec.Identity.ServiceName, rec.Identity.NamespaceID, rec.Identity.ClusterID}] = true
			}
		}
		if _, scoped := ours[c.Namespace]; scoped && !c.DeletionTimestamp.IsZero() {
			out.Stuck = append(out.Stuck, fmt.Sprintf("IPAddressClaim %s/%s (finalizers %v)", c.Namespace, c.Name, c.Finalizers))
		}
	}
	for h := range live {
		if recorded[h] {
			continue
		}
		id := holding{"", h.service, h.ns, h.cluster}
		if pending[id] {
			delete(pending, id) // one address per pending record
			continue
		}
		out.Leaked = append(out.Leaked, fmt.Sprintf("%s held by %s/%s/%s", h.address, h.service, h.ns, h.cluster))
	}
	// Services, Secrets and namespaces deleted but still there.
	for name, ns := range ours {
		if !ns.DeletionTimestamp.IsZero() {
			out.Stuck = append(out.Stuck, "Namespace "+name)
		}
		for _, list := range []client.ObjectList{&corev1.ServiceList{}, &corev1.SecretList{}} {
			if err := cp.Client.List(ctx, list, client.InNamespace(name)); err != nil {
				return out, err
			}
			if err := meta.EachListItem(list, func(o runtime.Object) error {
				obj := o.(client.Object)
				if !obj.GetDeletionTimestamp().IsZero() {
					out.Stuck = append(out.Stuck, fmt.Sprintf("%T %s/%s (finalizers %v)", obj, obj.GetNamespace(), obj.GetName(), obj.GetFinalizers()))
				}
				return nil
			}); err != nil {
				return out, err
			}
		}
	}
	for _, l := range [][]string{out.Leaked, out.Duplicated, out.Orphaned, out.Stuck} {
		sort.Strings(l)
	}
	return out, nil
}

// settledAccounts waits (up to the timeout) for the oracle to find nothing wrong and
// returns what it found last: a quiet moment may take a while after faults.
func settledAccounts(t *testing.T, cp *localcluster.ControlPlane, nsUIDs map[string]bool) accounts {
	t.Helper()
	var last accounts
	newG(t).Eventually(func(g Gomega) {
		var err error
		last, err = account(context.Background(), cp, nsUIDs)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(last.zero()).To(BeTrue(), "the accounting oracle: %s", last)
	}).WithTimeout(3 * timeout).WithPolling(time.Second).Should(Succeed())
	return last
}

// canary returns a secret value that is easy to find anywhere it should not be.
func canary(name string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "canary-" + name + "-" + hex.EncodeToString(b)
}

// canariesFound counts the places where one of values shows: every object of every
// resource the API server lists (found by discovery; all namespaces, managedFields
// included; Secrets without their data), the managers' logs and metrics, and the
// stand-in's log.
func canariesFound(t *testing.T, cp *localcluster.ControlPlane, managers []*localcluster.Manager, values []string) []string {
	t.Helper()
	ctx := context.Background()
	var haystacks []string
	add := func(what string, v any) {
		b, err := json.Marshal(v)
		newG(t).Expect(err).NotTo(HaveOccurred())
		haystacks = append(haystacks, what+": "+string(b))
	}
	// Every resource the API server lists, in every namespace (Secrets without their
	// data: the value belongs there).
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
				}
				add(gvr.String(), item.Object)
			}
		}
	}
	newG(t).Expect(kinds).To(BeNumerically(">", 40), "discovery found too few resources to scan")
	for _, m := range managers {
		haystacks = append(haystacks, m.Name+" log: "+m.Logs())
		if exited, _ := m.Exited(); !exited {
			if metrics, err := localcluster.Get(ctx, m.MetricsURL); err == nil {
				haystacks = append(haystacks, m.Name+" metrics: "+metrics)
			}
		}
	}
	haystacks = append(haystacks, "ipam-api-sim log: "+ipamAPI.Logs())
	var found []string
	for _, h := range haystacks {
		for _, v := range values {
			if i := strings.Index(h, v); i >= 0 {
				found = append(found, fmt.Sprintf("%.80s…", h[max(0, i-60):]))
			}
		}
	}
	return found
}

// recordChaos keeps a scenario's row for the summary table.
func recordChaos(t *testing.T, r chaos.Row) {
	t.Helper()
	newG(t).Expect(chaos.Record(r)).To(Succeed())
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
