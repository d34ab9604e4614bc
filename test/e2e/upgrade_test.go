package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/testenv"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// protectAddressFinalizer is the finalizer v0.1 put on the IPAddresses it created
// (ipamutil's ProtectAddressFinalizer).
const protectAddressFinalizer = "ipam.cluster.x-k8s.io/ProtectAddress"

// previousRelease returns the previous release's version and folder (make
// previous-release: its manager, components and metadata.yaml).
func previousRelease(t *testing.T) (version, dir string) {
	t.Helper()
	if paths.Previous == "" {
		t.Fatal("E2E_PREVIOUS_RELEASE is not set: run through 'make test' or 'make test-e2e', which build bin/previous")
	}
	if _, err := os.Stat(filepath.Join(paths.Previous, "manager")); err != nil {
		t.Fatalf("the previous release is not built (%v): run 'make previous-release'", err)
	}
	return filepath.Base(paths.Previous), paths.Previous
}

// upgradeClaim is a claim made under the previous release and what it was bound to.
type upgradeClaim struct {
	claim    *ipamv1.IPAddressClaim
	address  *ipamv1.IPAddress
	register sim.Registration
}

// A management cluster on the previous release (v0.1.0, installed with clusterctl init,
// its own manager binary running), with routed and subnet-mode claims of namespaced
// pools owned by a user's Secret, a claim of a global pool owned by the default secret,
// and a claim whose secret was rotated, is upgraded with `clusterctl upgrade apply` to
// the build under test. Every claim keeps its address and its IPAddress, the new
// manager sends the IPAM-API nothing for them, takes over the Secrets the old one
// protected (fingerprinting their values on first contact) and the IPAddresses' old
// finalizer; claims deleted afterwards release their addresses, and the accounting
// oracle finds nothing leaked or held twice.
func TestClusterctlUpgradeFromThePreviousRelease(t *testing.T) {
	onOwn.enter(t)
	g := newG(t)
	ctx := context.Background()
	previous, previousDir := previousRelease(t)
	w := newControlPlane(t, "upgrade", nil)
	_, err := w.UseUpgradeRepository()
	g.Expect(err).NotTo(HaveOccurred())
	_, err = w.InitVersion(ctx, providerVars(simOf(w)), previous)
	g.Expect(err).NotTo(HaveOccurred())
	old := startManagerOf(t, w, filepath.Join(previousDir, "manager"))

	// Under the previous release: pools, Secrets, claims, a rotation.
	ns := newNamespace(t, w, "upgrade")
	owner, rotatedTo := canary("upgrade-owner"), canary("upgrade-rotated")
	newSecret(t, w, ns, "owner", owner)
	newSecret(t, w, ns, "owner-2", rotatedTo)
	ref := &ipamv1alpha1.SecretReference{Name: "owner"}
	g.Expect(w.Client.Create(ctx, &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "routed"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4, SecretRef: ref}})).To(Succeed())
	g.Expect(w.Client.Create(ctx, &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "subnet"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4, SecretRef: ref,
			Subnet: "10.64.0.0/22", Gateway: "10.64.0.1"}})).To(Succeed())
	newGlobalPool(t, w, "upgrade-inet-ipv6", "inet", ipamv1alpha1.IPv6)
	claims := map[string]*upgradeClaim{}
	for name, pool := range map[string]struct{ kind, name string }{
		"routed-0": {ipamv1alpha1.VitistackIPPoolKind, "routed"},
		"routed-1": {ipamv1alpha1.VitistackIPPoolKind, "routed"},
		"subnet-0": {ipamv1alpha1.VitistackIPPoolKind, "subnet"},
		"subnet-1": {ipamv1alpha1.VitistackIPPoolKind, "subnet"},
		"global-0": {ipamv1alpha1.GlobalVitistackIPPoolKind, "upgrade-inet-ipv6"},
		"rotated":  {ipamv1alpha1.VitistackIPPoolKind, "routed"},
	} {
		claims[name] = &upgradeClaim{claim: newClaim(t, w, ns, name, pool.kind, pool.name, nil)}
	}
	for _, c := range claims {
		c.address = boundAddress(t, w, c.claim)
		g.Expect(c.address.Finalizers).To(ContainElement(protectAddressFinalizer), "v0.1 protects its IPAddresses")
	}
	rotated := claims["rotated"].claim
	g.Eventually(func(g Gomega) {
		c := &ipamv1.IPAddressClaim{}
		g.Expect(w.Client.Get(ctx, client.ObjectKeyFromObject(rotated), c)).To(Succeed())
		c.Annotations = map[string]string{ipamv1alpha1.SecretAnnotation: "owner-2"}
		g.Expect(w.Client.Update(ctx, c)).To(Succeed())
	}).Should(Succeed())
	g.Eventually(func(g Gomega) {
		c := &ipamv1.IPAddressClaim{}
		g.Expect(w.Client.Get(ctx, client.ObjectKeyFromObject(rotated), c)).To(Succeed())
		g.Expect(meta.IsStatusConditionTrue(c.Status.Conditions, ipamv1alpha1.ClaimSecretRotatedCondition)).To(BeTrue(), "conditions: %v", c.Status.Conditions)
	}).Should(Succeed())
	for name, c := range claims {
		reg, ok := registrationOf(t, w, c.address.Spec.Address)
		g.Expect(ok).To(BeTrue(), "%s's address %s is registered", name, c.address.Spec.Address)
		g.Expect(activeHolders(t, w, c.address.Spec.Address)).To(HaveLen(1))
		c.register = reg
	}
	g.Expect(claims["rotated"].register.SecretFingerprint).NotTo(Equal(claims["routed-0"].register.SecretFingerprint),
		"the rotated claim's address is held under the new Secret")

	// The upgrade, as docs/operations.md says: clusterctl upgrade apply with the same
	// variables as init; the old manager stops (clusterctl deletes its Deployment) and
	// the new one starts from the new Deployment.
	old.Stop()
	mgr, before := switchRelease(t, w, paths.Version, paths.Manager)
	keptAsTheyWere(t, w, mgr, before, claims)
	g.Eventually(func(g Gomega) {
		for _, s := range []client.ObjectKey{{Namespace: ns, Name: "owner"}, {Namespace: ns, Name: "owner-2"}} {
			secret := &corev1.Secret{}
			g.Expect(w.Client.Get(ctx, s, secret)).To(Succeed())
			g.Expect(secret.Finalizers).To(ContainElement(ipamv1alpha1.SecretInUseFinalizer), "Secret %s is still protected", s.Name)
			g.Expect(secret.Annotations).To(HaveKey(ipamv1alpha1.SecretFingerprintsAnnotation), "Secret %s is fingerprinted on first contact", s.Name)
		}
	}).Should(Succeed())
	for _, op := range []string{"register", "release", "rotate"} {
		g.Expect(metricSum(t, mgr, "vitistack_ipam_api_requests_total", map[string]string{"operation": op})).To(BeZero(),
			"the upgraded manager sent a %s for a claim the previous release bound", op)
	}
	// Deleted after the upgrade, claims release their addresses and their IPAddresses
	// go, the previous release's finalizer with them; a new claim binds.
	deleteReleased(t, w, claims, "routed-0", "subnet-0", "rotated")
	g.Eventually(func(g Gomega) {
		secret := &corev1.Secret{}
		g.Expect(w.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "owner-2"}, secret)).To(Succeed())
		g.Expect(secret.Finalizers).To(BeEmpty())
		g.Expect(secret.Annotations).NotTo(HaveKey(ipamv1alpha1.SecretFingerprintsAnnotation))
	}).Should(Succeed(), "owner-2, whose last claim is gone, is let go")
	made := newClaim(t, w, ns, "made-by-new", ipamv1alpha1.VitistackIPPoolKind, "subnet", nil)
	claims["made-by-new"] = &upgradeClaim{claim: made, address: boundAddress(t, w, made)}
	claims["made-by-new"].register, _ = registrationOf(t, w, claims["made-by-new"].address.Spec.Address)
	g.Expect(rbacRefusal.FindString(logsOf(t, mgr))).To(BeEmpty(), "the upgraded manager was refused a request by RBAC; see %s", mgr.LogFile)

	// The downgrade back to the previous release works the same way: its manager takes
	// the claims over (those it bound and the one made since) without a request, and
	// releases them when they are deleted.
	mgr.Stop()
	upgraded := mgr
	mgr, before = switchRelease(t, w, previous, filepath.Join(previousDir, "manager"))
	keptAsTheyWere(t, w, mgr, before, claims)
	deleteReleased(t, w, claims, "routed-1", "subnet-1", "global-0", "made-by-new")
	g.Expect(rbacRefusal.FindString(logsOf(t, mgr))).To(BeEmpty(), "the downgraded manager was refused a request by RBAC; see %s", mgr.LogFile)
	// The previous release knows nothing of value fingerprints: it takes its finalizer
	// off a Secret it no longer needs and leaves the annotation, which docs/operations.md
	// tells the user to remove after a downgrade.
	secret := &corev1.Secret{}
	g.Eventually(func(g Gomega) {
		g.Expect(w.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "owner"}, secret)).To(Succeed())
		g.Expect(secret.Finalizers).To(BeEmpty())
	}).Should(Succeed(), "the previous release lets owner go")
	g.Expect(secret.Annotations).To(HaveKey(ipamv1alpha1.SecretFingerprintsAnnotation))
	patch := client.MergeFrom(secret.DeepCopy())
	delete(secret.Annotations, ipamv1alpha1.SecretFingerprintsAnnotation)
	g.Expect(w.Client.Patch(ctx, secret, patch)).To(Succeed())
	// Nor does it protect the Secrets of pools (the oracle's promise is this release's):
	// with the pools gone, no pool names owner.
	for _, name := range []string{"routed", "subnet"} {
		deleteAndWait(t, w, &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	}
	settledAccounts(t, w, map[string]bool{uidOf(t, w, ns): true})
	g.Expect(canariesFound(t, w, []*localcluster.Manager{upgraded}, []string{owner, rotatedTo})).To(BeEmpty(),
		"a secret value outside its Secret")
}

// switchRelease runs `clusterctl upgrade apply` to version (later or earlier) with the
// variables of init (providerVars) and starts the manager binary from the new Deployment; the manager running
// before must be stopped first. It returns the new manager and the stand-in's request
// counts from before the switch.
func switchRelease(t *testing.T, w *localcluster.ControlPlane, version, binary string) (*localcluster.Manager, sim.Stats) {
	t.Helper()
	g := newG(t)
	ctx := context.Background()
	before, err := simOf(w).Stats(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	out, err := w.Clusterctl(ctx, providerVars(simOf(w)), "upgrade", "apply", "--ipam", manager.ProviderNamespace+"/vitistack:"+version, "--kubeconfig", w.Kubeconfig)
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("clusterctl upgrade apply to %s:\n%s", version, out)
	dep := &appsv1.Deployment{}
	g.Expect(w.Client.Get(ctx, client.ObjectKey{Namespace: manager.ProviderNamespace, Name: localcluster.DeploymentName}, dep)).To(Succeed())
	g.Expect(dep.Spec.Template.Spec.Containers[0].Image).To(HaveSuffix(":"+version), "the Deployment runs %s", version)
	return startManagerOf(t, w, binary), before
}

// startManagerOf runs the manager binary on w as the installed Deployment runs it
// (StartManager); it is stopped at the end of the test, if not before.
func startManagerOf(t *testing.T, w *localcluster.ControlPlane, binary string) *localcluster.Manager {
	t.Helper()
	w.ManagerBinary = binary
	// At --v=5 controller-runtime logs each reconcile's end with its object (keptAsTheyWere).
	mgr, err := w.StartManager(context.Background(), nil, "--v=5")
	newG(t).Expect(err).NotTo(HaveOccurred())
	t.Cleanup(mgr.Stop)
	return mgr
}

// keptAsTheyWere waits until mgr has reconciled every claim (its log at --v=5 says so,
// claim by claim), then checks that each keeps
// its IPAddress (the same object) and its address, says Ready, and that the IPAM-API
// holds it exactly as before: nothing registered, released or rotated since the
// stand-in counted before.
func keptAsTheyWere(t *testing.T, w *localcluster.ControlPlane, mgr *localcluster.Manager, before sim.Stats, claims map[string]*upgradeClaim) {
	t.Helper()
	g := newG(t)
	ctx := context.Background()
	for name, c := range claims {
		done := regexp.MustCompile(`"Reconcile successful".*IPAddressClaim="` + regexp.QuoteMeta(c.claim.Namespace+"/"+c.claim.Name) + `"`)
		g.Eventually(func() bool { return done.MatchString(logsOf(t, mgr)) }).Should(BeTrue(), "%s was not reconciled by the new manager", name)
	}
	for name, c := range claims {
		addr := &ipamv1.IPAddress{}
		g.Expect(w.Client.Get(ctx, client.ObjectKeyFromObject(c.address), addr)).To(Succeed())
		g.Expect(addr.UID).To(Equal(c.address.UID), "%s's IPAddress was not made again", name)
		g.Expect(addr.Spec.Address).To(Equal(c.address.Spec.Address), "%s keeps its address", name)
		readyReason(t, w, c.claim, metav1.ConditionTrue, ipamv1alpha1.ClaimReadyAllocatedReason)
		reg, ok := registrationOf(t, w, c.address.Spec.Address)
		g.Expect(ok).To(BeTrue())
		g.Expect(reg).To(Equal(c.register), "%s's registration is as it was", name)
	}
	// (The pools' readiness probes, DELETEs of an identity that holds nothing, go on.)
	after, err := simOf(w).Stats(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	for _, route := range []sim.Route{sim.RouteRegister, sim.RouteLegacyRegister} {
		g.Expect(after.Total(route)).To(Equal(before.Total(route)), "%s sent for claims that were bound", route)
	}
}

// deleteReleased deletes the named claims and checks that each one's IPAddress goes
// (whatever finalizer a release put on it) and that its address is released.
func deleteReleased(t *testing.T, w *localcluster.ControlPlane, claims map[string]*upgradeClaim, names ...string) {
	t.Helper()
	g := newG(t)
	for _, name := range names {
		c := claims[name]
		deleteAndWait(t, w, c.claim)
		g.Eventually(func() []string {
			addr := &ipamv1.IPAddress{}
			if err := w.Client.Get(context.Background(), client.ObjectKeyFromObject(c.address), addr); err != nil {
				return nil
			}
			return append([]string{"still there"}, addr.Finalizers...)
		}).Should(BeNil(), "%s's IPAddress is gone", name)
		g.Expect(activeHolders(t, w, c.address.Spec.Address)).To(BeEmpty(), "deleting %s released %s", name, c.address.Spec.Address)
		delete(claims, name)
	}
}

// A workload cluster runs the previous release's workload install (applied from its
// ipam-components-workload.yaml with kubectl, as its docs said), with MetalLB announcing what it
// handed out: a Service under the default secret, one under a Secret of its own that
// was rotated, and a claim. `helm upgrade --install --take-ownership` replaces it with
// the chart of the build under test, as a team moving to Argo CD does. Every address
// stays where it was (in every version of the Services, MetalLB's annotation and the
// ingress), nothing is sent to the IPAM-API for them, the new manager runs with the
// chart's RBAC without a refusal, and what is deleted afterwards is released.
func TestChartUpgradesThePreviousReleasesServicesFlavour(t *testing.T) {
	onOwn.enter(t)
	g := newG(t)
	ctx := context.Background()
	_, previousDir := previousRelease(t)
	w := newControlPlane(t, "upgrade-chart", nil)
	installCertManagerCRDs(t, w)
	flavour, err := w.GenerateYAML(ctx, providerVars(simOf(w)), filepath.Join(previousDir, "ipam-components-workload.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	// As its README said: `clusterctl generate yaml ... | kubectl apply -f -`.
	g.Eventually(func() error { // until the CRDs just created are served
		cmd := exec.Command(paths.Kubectl, "apply", "-f", "-", "--kubeconfig", w.Kubeconfig)
		cmd.Stdin = strings.NewReader(flavour)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("kubectl apply: %w\n%s", err, out)
		}
		return nil
	}).Should(Succeed())
	old := startManagerOf(t, w, filepath.Join(previousDir, "manager"))
	metallb, err := w.StartMetalLB(ctx, localcluster.StandInPools())
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(metallb.Stop)

	// Under the previous release.
	g.Expect(w.Client.Create(ctx, &ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: "hnet-private-ipv4"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4}})).To(Succeed())
	g.Expect(w.Client.Create(ctx, &ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: "inet-ipv4"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4}})).To(Succeed())
	ns := newNamespace(t, w, "apps")
	owner, rotatedTo := canary("chart-owner"), canary("chart-rotated")
	newSecret(t, w, ns, "owner", owner)
	newSecret(t, w, ns, "owner-2", rotatedTo)
	service := func(name string, annotations map[string]string) *corev1.Service {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
		}
		g.Expect(w.Client.Create(ctx, s)).To(Succeed())
		return s
	}
	web := service("web", nil)
	api := service("api", map[string]string{ipamv1alpha1.ZoneAnnotation: "inet", ipamv1alpha1.SecretAnnotation: "owner"})
	announced := map[string]string{}
	for _, s := range []*corev1.Service{web, api} {
		g.Eventually(func(g Gomega) {
			got := &corev1.Service{}
			g.Expect(w.Client.Get(ctx, client.ObjectKeyFromObject(s), got)).To(Succeed())
			announced[s.Name] = got.Annotations["metallb.io/loadBalancerIPs"]
			g.Expect(announced[s.Name]).NotTo(BeEmpty())
			g.Expect(got.Status.LoadBalancer.Ingress).To(ConsistOf(HaveField("IP", announced[s.Name])), "MetalLB announces it")
		}).Should(Succeed())
	}
	update(t, w, api, func(s *corev1.Service) { s.Annotations[ipamv1alpha1.SecretAnnotation] = "owner-2" })
	g.Eventually(func(g Gomega) {
		list := &ipamv1.IPAddressClaimList{}
		g.Expect(w.Client.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{ipamv1alpha1.ServiceNameLabel: "api"})).To(Succeed())
		g.Expect(list.Items).To(HaveLen(1))
		g.Expect(meta.IsStatusConditionTrue(list.Items[0].Status.Conditions, ipamv1alpha1.ClaimSecretRotatedCondition)).To(BeTrue(),
			"conditions: %v", list.Items[0].Status.Conditions)
	}).Should(Succeed())
	vip := newClaim(t, w, ns, "vip", ipamv1alpha1.GlobalVitistackIPPoolKind, "hnet-private-ipv4", nil)
	boundAddress(t, w, vip)
	claims := map[string]*upgradeClaim{}
	list := &ipamv1.IPAddressClaimList{}
	g.Expect(w.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	g.Expect(list.Items).To(HaveLen(3), "a claim for each Service, and vip")
	for i := range list.Items {
		c := &list.Items[i]
		addr := boundAddress(t, w, c)
		reg, ok := registrationOf(t, w, addr.Spec.Address)
		g.Expect(ok).To(BeTrue())
		claims[c.Name] = &upgradeClaim{claim: c, address: addr, register: reg}
	}
	for _, s := range []*corev1.Service{web, api} {
		g.Expect(w.Client.Get(ctx, client.ObjectKeyFromObject(s), s)).To(Succeed())
	}
	webVersions, err := testenv.WatchVersions(ctx, w.Config, &corev1.ServiceList{}, web)
	g.Expect(err).NotTo(HaveOccurred())
	apiVersions, err := testenv.WatchVersions(ctx, w.Config, &corev1.ServiceList{}, api)
	g.Expect(err).NotTo(HaveOccurred())

	// The chart takes the release over. (The local rig routes the webhooks to the
	// manager process; Helm writes them as the chart has them.)
	old.Stop()
	before, err := simOf(w).Stats(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w.UnrouteWebhooks(ctx)).To(Succeed())
	chart := filepath.Join("..", "..", "charts", "cluster-api-ipam-provider-vitistack")
	helmRun(t, w, "upgrade", "ipam", chart, "--install", "--take-ownership", "--force-conflicts", "--namespace", manager.ProviderNamespace,
		"--set", "ipamAPI.url="+simOf(w).URL, "--set", "logLevel=2")
	mgr := startManagerOf(t, w, paths.Manager)
	keptAsTheyWere(t, w, mgr, before, claims)
	for _, svc := range []*corev1.Service{web, api} {
		done := regexp.MustCompile(`"Reconcile successful".*Service="` + regexp.QuoteMeta(svc.Namespace+"/"+svc.Name) + `"`)
		g.Eventually(func() bool { return done.MatchString(logsOf(t, mgr)) }).Should(BeTrue(), "the new manager did not reconcile Service %s", svc.Name)
	}
	for _, op := range []string{"register", "release", "rotate"} {
		g.Expect(metricSum(t, mgr, "vitistack_ipam_api_requests_total", map[string]string{"operation": op})).To(BeZero(),
			"the new manager sent a %s for what the previous release had handed out", op)
	}
	for name, versions := range map[string]*testenv.Versions[*corev1.Service]{"web": webVersions, "api": apiVersions} {
		for _, v := range versions.Stop() {
			g.Expect(v.Annotations).To(HaveKeyWithValue("metallb.io/loadBalancerIPs", announced[name]),
				"version %s of Service %s would have had MetalLB announce another address, or none", v.ResourceVersion, name)
			g.Expect(v.Status.LoadBalancer.Ingress).To(ConsistOf(HaveField("IP", announced[name])),
				"version %s of Service %s: MetalLB announced another address, or none", v.ResourceVersion, name)
		}
	}
	g.Expect(helmRun(t, w, "status", "ipam", "--namespace", manager.ProviderNamespace)).To(ContainSubstring("STATUS: deployed"))

	// Deleted afterwards, the Services and the claim release their addresses.
	deleteAndWait(t, w, web)
	deleteAndWait(t, w, api)
	deleteAndWait(t, w, vip)
	for name, c := range claims {
		g.Expect(activeHolders(t, w, c.address.Spec.Address)).To(BeEmpty(), "%s's address %s is released", name, c.address.Spec.Address)
	}
	settledAccounts(t, w, map[string]bool{uidOf(t, w, ns): true})
	g.Expect(canariesFound(t, w, []*localcluster.Manager{mgr}, []string{owner, rotatedTo})).To(BeEmpty(),
		"a secret value outside its Secret")
	g.Expect(rbacRefusal.FindString(logsOf(t, mgr))).To(BeEmpty(), "the new manager was refused a request by RBAC; see %s", mgr.LogFile)
}
