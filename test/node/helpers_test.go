package node

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certutil "k8s.io/client-go/util/cert"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

const (
	chart = "../../charts/cluster-api-ipam-provider-vitistack"
	// ns and release are the chart's release: every test installs its own, and
	// uninstalls it (the CRDs and the default secret's namespace stay, as Helm keeps
	// them, for the next).
	ns, release    = "ipam-helm", "ipam"
	webhookService = "capi-ipam-vitistack-webhook-service"
)

// helm runs the pinned Helm against the node's control plane.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := cp.Helm(args...)
	if err != nil {
		// helm --wait says only that the Deployment is not ready; its Pods say why.
		pods := &corev1.PodList{}
		_ = cp.Client.List(context.Background(), pods, client.InNamespace(ns), client.MatchingLabels{"control-plane": "controller-manager"})
		t.Fatalf("helm %s: %v\n%s\nthe manager's Pods:\n%s", strings.Join(args, " "), err, out, strings.Join(exits(pods.Items), "\n"))
	}
	return out
}

// exits is what each of the Pods' containers said as it last exited (its termination
// message: the last lines of its log), and why one waits (CrashLoopBackOff, ImagePullBackOff).
func exits(pods []corev1.Pod) []string {
	var said []string
	for _, p := range pods {
		for _, c := range p.Status.ContainerStatuses {
			if w := c.State.Waiting; w != nil {
				said = append(said, fmt.Sprintf("%s: waiting: %s %s", p.Name, w.Reason, w.Message))
			}
			for _, st := range []corev1.ContainerState{c.State, c.LastTerminationState} {
				if st.Terminated != nil {
					said = append(said, fmt.Sprintf("%s: exited %d: %s", p.Name, st.Terminated.ExitCode, st.Terminated.Message))
				}
			}
		}
	}
	return said
}

// shortQuarantine is a chart value for tests where a new leader releases a claim it did
// not see live: it waits out --ipam-api-quarantine first, which must be longer than
// --ipam-api-timeout (the stand-in answers at once).
const shortQuarantine = "extraArgs={--ipam-api-timeout=2s,--ipam-api-quarantine=5s}"

// installChart starts an IPAM-API stand-in on the node's address and installs the
// chart against it (helmInstall).
func installChart(t *testing.T, sets ...string) *localcluster.Sim {
	t.Helper()
	api := startSim(t)
	helmInstall(t, api, sets...)
	return api
}

// startSim starts an IPAM-API stand-in on the node's address, where Pods reach it, with
// args; it stops when the test ends.
func startSim(t *testing.T, args ...string) *localcluster.Sim {
	t.Helper()
	api, err := localcluster.StartSimOn(testDir(t), localcluster.NodeIP, paths, nil, args...)
	newG(t).Expect(err).NotTo(HaveOccurred())
	t.Cleanup(api.Stop)
	return api
}

// helmInstall installs the chart in the workload flavour against the IPAM-API api, with
// the webhook's certificate from a Secret of the user's (webhookCert) unless sets has
// withCertManager, and waits until the Deployment is available. It is uninstalled when the test ends,
// unless the test did so.
func helmInstall(t *testing.T, api *localcluster.Sim, sets ...string) {
	t.Helper()
	if capiCoreCRDs && !slices.Contains(sets, "cluster=management") {
		t.Fatal("the workload flavour installed after Cluster API core's CRDs replaced its own: run the tests that install it before those in with_capi_test.go")
	}
	// The image make image wrote and the node imported (IMG).
	i := strings.LastIndex(paths.Image, ":")
	repository, tag := paths.Image[:i], paths.Image[i+1:]
	args := []string{"install", release, chart, "--namespace", ns, "--wait", "--timeout", "3m",
		"--set", "ipamAPI.url=" + api.URL, "--set", "image.repository=" + repository, "--set", "image.tag=" + tag}
	ensureNamespace(t, ns)
	if !slices.Contains(sets, withCertManager) {
		args = append(args, "--set", "webhook.certManager.enabled=false", "--set", "webhook.existingCertSecret=webhook-cert",
			"--set", "webhook.caBundle="+webhookCert(t))
	}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	helm(t, args...)
	t.Cleanup(func() {
		if out, err := cp.Helm("status", release, "--namespace", ns); err == nil || !strings.Contains(out, "not found") {
			helm(t, "uninstall", release, "--namespace", ns, "--wait")
		}
	})
}

// webhookCert makes the Secret webhook-cert in the release's namespace, a certificate
// for the webhook Service signed by a CA of the test's, unless it exists, and returns
// the CA as the chart's webhook.caBundle wants it (base64 PEM).
func webhookCert(t *testing.T) string {
	t.Helper()
	g := newG(t)
	ctx := context.Background()
	ensureNamespace(t, ns)
	secret := &corev1.Secret{}
	err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "webhook-cert"}, secret)
	if apierrors.IsNotFound(err) {
		dns := []string{webhookService + "." + ns + ".svc", webhookService + "." + ns + ".svc.cluster.local"}
		crt, key, err := certutil.GenerateSelfSignedCertKey(dns[0], nil, dns)
		g.Expect(err).NotTo(HaveOccurred())
		secret = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "webhook-cert"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key}}
		g.Expect(cp.Client.Create(ctx, secret)).To(Succeed())
	} else {
		g.Expect(err).NotTo(HaveOccurred())
	}
	// tls.crt is the certificate, then the CA that signed it.
	_, ca := pem.Decode(secret.Data[corev1.TLSCertKey])
	g.Expect(ca).NotTo(BeEmpty())
	return base64.StdEncoding.EncodeToString(ca)
}

// ensureNamespace creates the namespace name unless it exists.
func ensureNamespace(t *testing.T, name string) {
	t.Helper()
	err := cp.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	newG(t).Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
}

// newPool creates a GlobalVitistackIPPool of the zone hnet-private, IPv4; it is deleted
// when the test ends.
func newPool(t *testing.T, name string) {
	t.Helper()
	pool := &ipamv1alpha1.GlobalVitistackIPPool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4},
	}
	newG(t).Expect(cp.Client.Create(context.Background(), pool)).To(Succeed())
	t.Cleanup(func() { deleteAndWait(t, pool) })
}

// bind creates a claim from the GlobalVitistackIPPool pool and returns its IPAddress
// once the claim is bound.
func bind(t *testing.T, name, pool string) (*ipamv1.IPAddressClaim, *ipamv1.IPAddress) {
	t.Helper()
	g := newG(t)
	ctx := context.Background()
	claim := &ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{
			APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: ipamv1alpha1.GlobalVitistackIPPoolKind, Name: pool}},
	}
	g.Expect(cp.Client.Create(ctx, claim)).To(Succeed())
	t.Cleanup(func() { deleteAndWait(t, claim) })
	address := &ipamv1.IPAddress{}
	g.Eventually(func(g Gomega) {
		c := &ipamv1.IPAddressClaim{}
		g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), c)).To(Succeed())
		g.Expect(c.Status.AddressRef.Name).NotTo(BeEmpty(), "claim %s is not bound; conditions: %v", name, c.Status.Conditions)
		g.Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: c.Status.AddressRef.Name}, address)).To(Succeed())
	}).Should(Succeed())
	return claim, address
}

// deleteAndWait deletes obj and waits until it is gone.
func deleteAndWait(t *testing.T, obj client.Object) {
	t.Helper()
	g := newG(t)
	ctx := context.Background()
	g.Expect(client.IgnoreNotFound(cp.Client.Delete(ctx, obj))).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj))
	}).Should(BeTrue(), "%T %s is gone", obj, obj.GetName())
}

// liveHolders are the holders of address in the stand-in that have not released it.
func liveHolders(t *testing.T, api *localcluster.Sim, address string) []sim.Holder {
	t.Helper()
	regs, err := api.Registrations(context.Background())
	newG(t).Expect(err).NotTo(HaveOccurred())
	var live []sim.Holder
	for _, r := range regs {
		if strings.SplitN(r.Address, "/", 2)[0] != address {
			continue
		}
		for _, h := range r.Holders {
			if h.ExpiresAt == nil {
				live = append(live, h)
			}
		}
	}
	return live
}

// processOf is the manager process on the machine whose command line holds arg.
func processOf(t *testing.T, arg string) int {
	t.Helper()
	for _, pid := range localcluster.ProcessesWith(arg) {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err == nil && strings.HasPrefix(string(b), "/manager\x00") {
			return pid
		}
	}
	t.Fatalf("no /manager process with %s", arg)
	return 0
}

// registrations counts the registrations the IPAM-API stand-in api answered.
func registrations(t *testing.T, api *localcluster.Sim) int {
	t.Helper()
	stats, err := api.Stats(context.Background())
	newG(t).Expect(err).NotTo(HaveOccurred())
	return stats.Count(sim.RouteRegister, 201) + stats.Count(sim.RouteRegister, 200)
}

// allManagerPods are the manager's Pods, those being deleted among them.
func allManagerPods(t *testing.T) []corev1.Pod {
	t.Helper()
	pods := &corev1.PodList{}
	newG(t).Expect(cp.Client.List(context.Background(), pods, client.InNamespace(ns),
		client.MatchingLabels{"control-plane": "controller-manager"})).To(Succeed())
	return pods.Items
}

// firstLines is the first n lines of b.
func firstLines(b []byte, n int) string {
	lines := strings.SplitN(string(b), "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
