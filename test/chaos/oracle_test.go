package chaos_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/controllers/secret"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/test/chaos"
)

const (
	secretValue = "owner-secret-value-1"
	nsUID       = "uid-apps"
)

// planted is a cluster in a fake client and an IPAM-API stand-in in process, bound
// cleanly: claim c1 in namespace apps holds 83.118.168.10 under Secret owner.
type planted struct {
	t   *testing.T
	ctx context.Context
	c   client.Client
	sim *sim.Server
	api ipamapi.Client
}

func newPlanted(t *testing.T) *planted {
	t.Helper()
	p := &planted{t: t, ctx: context.Background(), sim: sim.New(sim.Config{})}
	srv := httptest.NewServer(p.sim)
	t.Cleanup(srv.Close)
	var err error
	p.api, err = ipamapi.NewClient(srv.URL, ipamapi.Options{})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	p.c = fake.NewClientBuilder().WithScheme(manager.NewScheme()).
		WithStatusSubresource(&ipamv1.IPAddressClaim{}).Build()
	p.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps", UID: nsUID}})
	p.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "owner",
		Finalizers:  []string{ipamv1alpha1.SecretInUseFinalizer},
		Annotations: fingerprints("secret")},
		Data: map[string][]byte{"secret": []byte(secretValue)}})
	p.create(ledger("apps/owner"))
	p.bind("c1", "83.118.168.10", "")
	return p
}

// ledger is the provider's list of protected Secrets, naming secrets.
func ledger(secrets ...string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "provider", Name: secret.LedgerName},
		Data: map[string]string{"secrets": strings.Join(secrets, "\n")}}
}

func fingerprints(keys ...string) map[string]string {
	fp := map[string]string{}
	for _, k := range keys {
		fp[k] = record.Fingerprint([]byte(secretValue))
	}
	ann := map[string]string{}
	record.SetFingerprints(ann, fp)
	return ann
}

func (p *planted) create(obj client.Object) {
	p.t.Helper()
	NewWithT(p.t).Expect(p.c.Create(p.ctx, obj)).To(Succeed())
}

func (p *planted) registration(name, address, cluster string) *record.Registration {
	return &record.Registration{Endpoint: "http://ipam", Zone: "inet", Family: ipamapi.FamilyIPv4, Address: address + "/32",
		Identity: ipamapi.Identity{ServiceName: name, NamespaceID: nsUID, ClusterID: cluster},
		Secret:   record.ObjectRef{Namespace: "apps", Name: "owner", Key: "secret"}, Phase: record.PhaseRegistered}
}

// register has the IPAM-API hold address for the identity name under cluster.
func (p *planted) register(name, address, cluster string) {
	p.t.Helper()
	_, err := p.api.Register(p.ctx, p.registration(name, address, cluster).Request(secretValue))
	NewWithT(p.t).Expect(err).NotTo(HaveOccurred())
}

// bind makes claim name bound to an IPAddress of address, registered, as the provider
// leaves it; share is its allow-local-shared-ip key.
func (p *planted) bind(name, address, share string) {
	p.t.Helper()
	p.bindAs(p.registration(name, address, "cluster-a"), share)
}

// bindAs binds the claim the registration names (its service name) to its address.
func (p *planted) bindAs(rec *record.Registration, share string) {
	p.t.Helper()
	_, err := p.api.Register(p.ctx, rec.Request(secretValue))
	NewWithT(p.t).Expect(err).NotTo(HaveOccurred())
	name := rec.Identity.ServiceName
	ann := map[string]string{}
	if share != "" {
		ann[ipamv1alpha1.AllowLocalSharedIPAnnotation] = share
	}
	claim := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name, Annotations: ann,
		Finalizers: []string{"ipam.cluster.x-k8s.io/ReleaseAddress"}}}
	rec.SetOn(claim)
	p.create(claim)
	claim.Status.AddressRef.Name = name
	NewWithT(p.t).Expect(p.c.Status().Update(p.ctx, claim)).To(Succeed())
	addr := &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name, Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec: ipamv1.IPAddressSpec{Address: strings.TrimSuffix(rec.Address, "/32"), ClaimRef: ipamv1.IPAddressClaimReference{Name: name}}}
	if share != "" {
		addr.Annotations[ipamv1alpha1.AllowLocalSharedIPAnnotation] = share
	}
	rec.WriteTo(addr.Labels, addr.Annotations)
	p.create(addr)
}

func (p *planted) account() chaos.Accounts {
	p.t.Helper()
	a, err := chaos.Account(p.ctx, p.c, p.sim.Registrations(), map[string]bool{nsUID: true}, types.NamespacedName{Namespace: "provider", Name: "default"})
	NewWithT(p.t).Expect(err).NotTo(HaveOccurred())
	return a
}

func (p *planted) update(obj client.Object, change func()) {
	p.t.Helper()
	NewWithT(p.t).Expect(p.c.Get(p.ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
	change()
	NewWithT(p.t).Expect(p.c.Update(p.ctx, obj)).To(Succeed())
}

func ipAddress(name string) *ipamv1.IPAddress {
	return &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name}}
}

// Each defect the oracle claims to find, planted in a cleanly bound cluster, is
// reported in its class, and in no other.
func TestOracleReportsEachPlantedDefect(t *testing.T) {
	owner := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "owner"}}
	cases := []struct {
		name  string
		plant func(p *planted)
		want  chaos.Accounts
	}{{
		name:  "nothing planted",
		plant: func(*planted) {},
	}, {
		name:  "a second address held for a bound claim's identity",
		plant: func(p *planted) { p.register("c1", "83.118.168.11", "cluster-a") },
		want:  chaos.Accounts{Leaked: []string{"83.118.168.11/32 held by c1/uid-apps/cluster-a"}},
	}, {
		name:  "an address held for the namespace under another cluster ID",
		plant: func(p *planted) { p.register("c1", "83.118.168.12", "cluster-b") },
		want:  chaos.Accounts{Leaked: []string{"83.118.168.12/32 held by c1/uid-apps/cluster-b"}},
	}, {
		name: "a claim gone while its IPAddress and its registration stay",
		plant: func(p *planted) {
			claim := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "c1"}}
			p.update(claim, func() { claim.Finalizers = nil })
			NewWithT(p.t).Expect(p.c.Delete(p.ctx, claim)).To(Succeed())
		},
		want: chaos.Accounts{Leaked: []string{"83.118.168.10/32 held by c1/uid-apps/cluster-a"},
			Orphaned: []string{"IPAddress apps/c1: its claim apps/c1 is gone or not bound to it"}},
	}, {
		name: "an unbound claim's record without an address accounts for one address, not two",
		plant: func(p *planted) {
			rec := p.registration("c2", "", "cluster-a")
			rec.Address, rec.Phase = "", record.PhasePending
			claim := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "c2"}}
			rec.SetOn(claim)
			p.create(claim)
			p.register("c2", "83.118.168.20", "cluster-a")
			p.register("c2", "83.118.168.21", "cluster-a")
		},
		want: chaos.Accounts{Leaked: []string{"83.118.168.2?/32 held by c2/uid-apps/cluster-a"}},
	}, {
		name: "a bound claim whose identity's namespace ID is overridden to one out of scope",
		plant: func(p *planted) {
			rec := p.registration("c2", "83.118.168.30", "cluster-a")
			rec.Identity.NamespaceID = "uid-elsewhere"
			p.bindAs(rec, "")
		},
	}, {
		name: "one address bound by two claims",
		plant: func(p *planted) {
			p.bind("c2", "83.118.168.10", "")
		},
		want: chaos.Accounts{Duplicated: []string{"http://ipam|inet|83.118.168.10/32 bound by 2 IPAddresses"}},
	}, {
		name: "one address bound by two claims that declare one share key",
		plant: func(p *planted) {
			a := ipAddress("c1")
			p.update(a, func() { a.Annotations[ipamv1alpha1.AllowLocalSharedIPAnnotation] = "web" })
			p.bind("c2", "83.118.168.10", "web")
		},
	}, {
		name: "an IPAddress whose registration the IPAM-API released",
		plant: func(p *planted) {
			_, err := p.api.Release(p.ctx, p.registration("c1", "83.118.168.10", "cluster-a").Request(secretValue))
			NewWithT(p.t).Expect(err).NotTo(HaveOccurred())
		},
		want: chaos.Accounts{Orphaned: []string{"IPAddress apps/c1 records 83.118.168.10/32, which the IPAM-API does not hold for c1/uid-apps/cluster-a"}},
	}, {
		name: "an IPAddress without a record",
		plant: func(p *planted) {
			a := ipAddress("c1")
			p.update(a, func() { delete(a.Annotations, ipamv1alpha1.RegisteredAddressAnnotation) })
		},
		want: chaos.Accounts{Orphaned: []string{"IPAddress apps/c1 has no record (<nil>)"}},
	}, {
		name: "an IPAddress whose address is not its record's",
		plant: func(p *planted) {
			a := ipAddress("c1")
			p.update(a, func() { a.Spec.Address = "83.118.168.99" })
		},
		want: chaos.Accounts{Mismatched: []string{`IPAddress apps/c1 has address "83.118.168.99", its record 83.118.168.10/32`}},
	}, {
		name: "a deleted claim that stays",
		plant: func(p *planted) {
			NewWithT(p.t).Expect(p.c.Delete(p.ctx, &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "c1"}})).To(Succeed())
		},
		want: chaos.Accounts{Stuck: []string{"IPAddressClaim apps/c1 (finalizers [ipam.cluster.x-k8s.io/ReleaseAddress])"}},
	}, {
		name: "a deleted Secret that stays",
		plant: func(p *planted) {
			NewWithT(p.t).Expect(p.c.Delete(p.ctx, owner.DeepCopy())).To(Succeed())
		},
		want: chaos.Accounts{Stuck: []string{"Secret apps/owner (finalizers [ipam.vitistack.io/secret-in-use])"}},
	}, {
		name: "a live Secret that keeps the finalizer no record needs",
		plant: func(p *planted) {
			p.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "spare", Finalizers: []string{ipamv1alpha1.SecretInUseFinalizer}}})
			l := ledger()
			p.update(l, func() { l.Data["secrets"] = "apps/owner\napps/spare" })
		},
		want: chaos.Accounts{Protections: []string{"Secret apps/spare keeps the ipam.vitistack.io/secret-in-use finalizer, and no pool or record names it"}},
	}, {
		name: "a pool's Secret, protected before any record names it, is no defect",
		plant: func(p *planted) {
			p.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "spare",
				Finalizers: []string{ipamv1alpha1.SecretInUseFinalizer}, Annotations: fingerprints("secret")},
				Data: map[string][]byte{"secret": []byte(secretValue)}})
			p.create(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "spare"},
				Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", SecretRef: &ipamv1alpha1.SecretReference{Name: "spare"}}})
			l := ledger()
			p.update(l, func() { l.Data["secrets"] = "apps/owner\napps/spare" })
		},
	}, {
		name: "a pool's Secret without protection",
		plant: func(p *planted) {
			p.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "spare"},
				Data: map[string][]byte{"secret": []byte(secretValue)}})
			p.create(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "spare"},
				Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", SecretRef: &ipamv1alpha1.SecretReference{Name: "spare"}}})
		},
		want: chaos.Accounts{Protections: []string{
			`Secret apps/spare: pools or records name its key "secret", which has no fingerprint`,
			"Secret apps/spare: pools or records name its keys [secret], but it has no ipam.vitistack.io/secret-in-use finalizer"}},
	}, {
		name: "a live Secret that keeps a fingerprint no record needs",
		plant: func(p *planted) {
			p.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "spare", Annotations: fingerprints("secret")}})
		},
		want: chaos.Accounts{Protections: []string{`Secret apps/spare keeps the fingerprint of key "secret", and no pool or record names it`}},
	}, {
		name: "a protected Secret the provider's list of protected Secrets does not name",
		plant: func(p *planted) {
			l := ledger()
			p.update(l, func() { l.Data["secrets"] = "apps/other" })
		},
		want: chaos.Accounts{Protections: []string{"Secret apps/owner has the ipam.vitistack.io/secret-in-use finalizer, and the provider's " +
			"list of protected Secrets (ConfigMap vitistack-ipam-protected-secrets) does not name it: a new leader would not look at it again"}},
	}, {
		name: "a Secret records name, without its finalizer or its fingerprint",
		plant: func(p *planted) {
			s := owner.DeepCopy()
			p.update(s, func() { s.Finalizers, s.Annotations = nil, nil })
		},
		want: chaos.Accounts{Protections: []string{
			`Secret apps/owner: pools or records name its key "secret", which has no fingerprint`,
			"Secret apps/owner: pools or records name its keys [secret], but it has no ipam.vitistack.io/secret-in-use finalizer"}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			p := newPlanted(t)
			g.Expect(p.account().Zero()).To(BeTrue(), "the clean cluster: %s", p.account())
			tc.plant(p)
			got := p.account()
			// A wildcard "?" in a wanted entry stands for one character the test does
			// not pin (which of two addresses the pending record accounts for).
			for _, pair := range [][2][]string{{got.Leaked, tc.want.Leaked}, {got.Duplicated, tc.want.Duplicated},
				{got.Orphaned, tc.want.Orphaned}, {got.Mismatched, tc.want.Mismatched}, {got.Stuck, tc.want.Stuck},
				{got.Protections, tc.want.Protections}} {
				g.Expect(pair[0]).To(HaveLen(len(pair[1])), "found %s", got)
				for i, w := range pair[1] {
					g.Expect(matches(pair[0][i], w)).To(BeTrue(), "found %q, want %q", pair[0][i], w)
				}
			}
			g.Expect(got.Zero()).To(Equal(tc.want.Zero()))
		})
	}
}

// matches compares s with want, where "?" in want stands for any one character.
func matches(s, want string) bool {
	if len(s) != len(want) {
		return false
	}
	for i := range want {
		if want[i] != '?' && want[i] != s[i] {
			return false
		}
	}
	return true
}

// The canary scan finds a secret value in every form redaction cuts, in the forms its
// own needles add (base64 inside a longer blob, upper-case hex, percent-encoding, Go's
// quoting), and its fingerprint, and says where; a text without them is clean.
func TestFindSeesEveryFormOfAValue(t *testing.T) {
	g := NewWithT(t)
	value := "canary-plant-0123abcd/+&<\"é"
	event := func(form string) map[string]string {
		return map[string]string{"clean": "nothing here", "event": `{"message":"refused: ` + form + `"}`}
	}
	for _, form := range append(chaos.Needles(value), ipamapi.ValueForms(value)...) {
		found := chaos.Find(event(form), value)
		g.Expect(found).NotTo(BeEmpty(), "form %q", form)
		g.Expect(found).To(HaveEach(HavePrefix("event: ")), "form %q", form)
	}
	for _, blob := range []string{"user:" + value, "ab" + value + "cd", "x" + value} {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding} {
			g.Expect(chaos.Find(event(enc.EncodeToString([]byte(blob))), value)).NotTo(BeEmpty(), "%q in base64", blob)
		}
	}
	g.Expect(chaos.Needles(value)).To(ContainElements(value, hex.EncodeToString([]byte(value)), strings.ToUpper(hex.EncodeToString([]byte(value))),
		url.QueryEscape(value), strconv.QuoteToASCII(value)[1:len(strconv.QuoteToASCII(value))-1],
		strings.TrimPrefix(record.Fingerprint([]byte(value)), "sha256:")))
	g.Expect(chaos.Find(map[string]string{"log": "[redacted] and " + types.NamespacedName{Name: "x"}.String()}, value)).To(BeEmpty())
}

// The redactor, tried against the scan's needles (built without its list): every form
// of a value the scan looks for, in a message, is cut; only the fingerprint, which is
// not the value, is left to the scan.
func TestRedactCutsEveryFormTheScanLooksFor(t *testing.T) {
	g := NewWithT(t)
	for _, value := range []string{"canary-plant-0123abcd/+&<\"é", "owner-secret-value-1", "8charsXY"} {
		fingerprint := strings.TrimPrefix(record.Fingerprint([]byte(value)), "sha256:")
		for _, form := range chaos.Needles(value) {
			if form == fingerprint {
				continue
			}
			cut := ipamapi.Redact("admission webhook denied: "+form+" (end)", value)
			g.Expect(chaos.Find(map[string]string{"message": cut}, value)).To(BeEmpty(), "the form %q of %q, redacted: %s", form, value, cut)
		}
		for _, blob := range []string{"user:" + value, "ab" + value + "cd"} {
			cut := ipamapi.Redact("data: "+base64.StdEncoding.EncodeToString([]byte(blob)), value)
			g.Expect(chaos.Find(map[string]string{"message": cut}, value)).To(BeEmpty(), "%q in base64, redacted: %s", blob, cut)
		}
	}
}

// Strays sees a holder under the cluster's ID whose namespace ID is known nowhere (the
// namespace's name for its UID, say), and none of those the cluster knows: a
// Namespace's UID, a pool's (a subnet check's), one an identity override names.
func TestStraysSeesAnIdentityKnownNowhere(t *testing.T) {
	g := NewWithT(t)
	p := newPlanted(t) // c1 holds 83.118.168.10 for apps (uid-apps) under cluster-a
	p.create(&ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: "nodes", UID: "uid-pool"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4}})
	strays := func() []string {
		s, err := chaos.Strays(p.ctx, p.c, p.sim.Registrations(), "cluster-a")
		g.Expect(err).NotTo(HaveOccurred())
		return s
	}
	g.Expect(strays()).To(BeEmpty())

	rec := p.registration("probe", "83.118.168.40", "cluster-a")
	rec.Identity.NamespaceID = "uid-pool"
	_, err := p.api.Register(p.ctx, rec.Request(secretValue))
	g.Expect(err).NotTo(HaveOccurred())
	overridden := p.registration("c3", "83.118.168.41", "cluster-a")
	overridden.Identity.NamespaceID = "uid-of-the-operator"
	p.bindAs(overridden, "")
	p.register("c1", "83.118.168.42", "cluster-b") // another cluster's: not this one's to judge
	g.Expect(strays()).To(BeEmpty())

	wrong := p.registration("c4", "83.118.168.43", "cluster-a")
	wrong.Identity.NamespaceID = "apps" // the name, not the UID
	_, err = p.api.Register(p.ctx, wrong.Request(secretValue))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(strays()).To(Equal([]string{"83.118.168.43/32 held by c4/apps/cluster-a, under a namespace ID known nowhere in the cluster"}))
}
