package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/test/docs"
)

// The names of what TestRunbookCommands creates for the runbooks to find.
const (
	runbookPool      = "e2e-runbook" // a GlobalVitistackIPPool, and a VitistackIPPool of the same name
	runbookGlobal    = "runbook-global"
	runbookLocal     = "runbook-local"
	runbookWaiting   = "runbook-waiting"
	runbookReleasing = "runbook-releasing"
)

// Every command of the runbooks in docs/metrics.md (each line of its ```sh blocks, as
// docs.RunbookCommands reads them: strict, so that none is skipped) runs with kubectl
// (bin/ has it at the control plane's version) against the suite's control plane, where
// the provider's manager runs and the runbooks' situations are staged: a pool of each
// kind, each with a bound claim; a claim that waits (its pool does not exist:
// PoolNotReady); a deleted claim whose release fails (ReleaseFailed, with its event),
// the IPAM-API answering releases with 503. Each command exits 0, prints something, and
// names one of those objects; each column of a custom-columns listing has a value
// somewhere. The placeholders are filled from this table; an unknown one fails the test:
//
//	<pool>            the pools' name, e2e-runbook (the alert's pool label)
//	<pool_namespace>  the VitistackIPPool's namespace (the alert's pool_namespace label)
//	<namespace>       the claims' namespace
//	<claim>           the waiting claim, runbook-waiting
func TestRunbookCommands(t *testing.T) {
	onA.enter(t)
	g := newG(t)
	ctx := context.Background()
	page, err := os.ReadFile(filepath.Join("..", "..", "docs", "metrics.md"))
	g.Expect(err).NotTo(HaveOccurred())
	cmds, problems := docs.RunbookCommands(string(page))
	g.Expect(problems).To(BeEmpty())
	g.Expect(len(cmds)).To(BeNumerically(">=", 10), "the runbooks' commands")

	ns := newNamespace(t, a, "runbook")
	newGlobalPool(t, a, runbookPool, "inet", ipamv1alpha1.IPv4)
	local := &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: runbookPool},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4}}
	g.Expect(a.Client.Create(ctx, local)).To(Succeed())
	t.Cleanup(func() { _ = a.Client.Delete(ctx, local) })
	bound := []*ipamv1.IPAddressClaim{
		newClaim(t, a, ns, runbookGlobal, global, runbookPool, nil),
		newClaim(t, a, ns, runbookLocal, ipamv1alpha1.VitistackIPPoolKind, runbookPool, nil),
		newClaim(t, a, ns, runbookReleasing, global, runbookPool, nil),
	}
	waiting := newClaim(t, a, ns, runbookWaiting, global, runbookPool+"-missing", nil)
	var addr *ipamv1.IPAddress
	for _, c := range bound {
		addr = boundAddress(t, a, c)
	}
	readyReason(t, a, waiting, metav1.ConditionFalse, ipamv1.IPAddressClaimReadyPoolNotReadyReason)
	// The IPAM-API fails every release: the deleted claim stays, with ReleaseFailed.
	g.Expect(ipamAPI.SetFaults(ctx, sim.Faults{ErrorRate: 1, ErrorStatus: 503, Routes: []sim.Route{sim.RouteRelease}})).To(Succeed())
	t.Cleanup(func() { _ = ipamAPI.SetFaults(ctx, sim.Faults{}) })
	releasing := bound[2] // addr is its address
	g.Expect(a.Client.Delete(ctx, releasing)).To(Succeed())
	readyReason(t, a, releasing, metav1.ConditionFalse, ipamv1alpha1.ClaimReadyReleaseFailedReason)
	g.Eventually(func() []corev1.Event { return eventsOf(t, a, releasing) }).Should(
		ContainElement(HaveField("Reason", ipamv1alpha1.ClaimReadyReleaseFailedReason)))

	values := map[string]string{"pool": runbookPool, "pool_namespace": ns, "namespace": ns, "claim": runbookWaiting}
	staged := []string{runbookPool, runbookGlobal, runbookLocal, runbookWaiting, runbookReleasing}
	run := func(args []string) (string, string, error) {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, paths.Kubectl, args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+a.Kubeconfig)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	start := time.Now()
	for _, c := range cmds {
		args, err := c.Args(values)
		if err != nil {
			t.Errorf("%s: %v (fill its placeholders in this test's table)", c, err)
			continue
		}
		stdout, stderr, err := run(args[1:])
		switch {
		case err != nil:
			t.Errorf("%s: %v\n%s%s", c, err, stdout, stderr)
		case strings.TrimSpace(stdout) == "":
			t.Errorf("%s: printed nothing, although the cluster has what it looks for\n%s", c, stderr)
		case !containsAny(stdout, staged):
			t.Errorf("%s: names none of %v, which the cluster has:\n%s", c, staged, stdout)
		default:
			for _, col := range emptyColumns(args, stdout) {
				t.Errorf("%s: the column %s is <none> in every row:\n%s", c, col, stdout)
			}
		}
	}
	// As the page says: a bare ipaddresses is Kubernetes' own IPAddress, none of the provider's.
	stdout, stderr, err := run([]string{"get", "ipaddresses", "-A", "-l", ipamv1alpha1.PoolNameLabel + "=" + runbookPool})
	g.Expect(err).NotTo(HaveOccurred(), stderr)
	g.Expect(stdout).NotTo(ContainSubstring(runbookGlobal), "a bare ipaddresses lists the provider's IPAddresses")
	t.Logf("ran the runbooks' %d commands in %s", len(cmds), time.Since(start).Round(time.Millisecond))

	// The IPAM-API recovers: the deleted claim is released, as the runbook promises.
	g.Expect(ipamAPI.SetFaults(ctx, sim.Faults{})).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(a.Client.Get(ctx, client.ObjectKeyFromObject(releasing), &ipamv1.IPAddressClaim{}))
	}).WithTimeout(2*timeout).Should(BeTrue(), "the deleted claim was not released once the IPAM-API recovered")
	g.Expect(activeHolders(t, a, addr.Spec.Address)).To(BeEmpty())
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// emptyColumns is the headings of a custom-columns listing (out, as kubectl printed it
// for args) whose every row is <none>: a column whose path names nothing.
func emptyColumns(args []string, out string) []string {
	var spec string
	for i, a := range args {
		if s, ok := strings.CutPrefix(a, "custom-columns="); ok && i > 0 && (args[i-1] == "-o" || args[i-1] == "--output") {
			spec = s
		} else if s, ok := strings.CutPrefix(a, "--output=custom-columns="); ok {
			spec = s
		} else if s, ok := strings.CutPrefix(a, "-o=custom-columns="); ok {
			spec = s
		}
	}
	if spec == "" {
		return nil
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	headings := strings.Fields(lines[0])
	seen := make([]bool, len(headings))
	for _, l := range lines[1:] {
		for i, cell := range strings.Fields(l) {
			if i < len(seen) && cell != "<none>" {
				seen[i] = true
			}
		}
	}
	var empty []string
	for i, h := range headings {
		if !seen[i] {
			empty = append(empty, h)
		}
	}
	return empty
}
