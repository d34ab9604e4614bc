package simulation

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/webhooks"
)

// The simulated cluster: namespaces of claims (apps) and Services (web), the default
// Secret's namespace, four global pools (two of one zone and family, for moves), and in
// apps a subnet-mode pool with a CA bundle and a routed pool under the team's Secret.
const (
	nsApps    = "apps"
	nsWeb     = "web"
	nsDefault = "ipam-system"
)

// movePools are the pools of one zone and family a Service moves between.
var movePools = []string{"inet-a", "inet-b", "inet-c"}

var globalPools = []struct {
	name, zone string
	family     ipamv1alpha1.IPFamily
}{
	{"inet-a", "inet", ipamv1alpha1.IPv4},
	{"inet-b", "inet", ipamv1alpha1.IPv4},
	{"inet-c", "inet", ipamv1alpha1.IPv4},
	{"inet-v6", "inet", ipamv1alpha1.IPv6},
	{"private", "hnet-private", ipamv1alpha1.IPv4},
}

// caPEM is a CA bundle: the simulated IPAM-API has no TLS, but a pool that names a
// bundle cannot build its client without reading it.
const caPEM = "-----BEGIN CERTIFICATE-----\nMIIBfzCCASWgAwIBAgIUSimulationOnlyNotARealCertificate0wCgYIKoZIzj0E\n-----END CERTIFICATE-----\n"

func (w *world) setUp() {
	for _, ns := range []string{nsApps, nsWeb, nsDefault} {
		w.mustCreate(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	w.mustCreate(secretOf(nsApps, "team", "team-value-0123456789"))
	w.mustCreate(secretOf(nsWeb, "svc", "svc-value-0123456789"))
	w.mustCreate(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: nsApps, Name: "ipam-ca"}, Data: map[string]string{"ca.crt": caPEM}})
	for _, p := range globalPools {
		w.mustCreate(&ipamv1alpha1.GlobalVitistackIPPool{ObjectMeta: metav1.ObjectMeta{Name: p.name},
			Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: p.zone, IPFamily: p.family}})
	}
	w.mustCreate(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: nsApps, Name: "nodes"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4, Subnet: "10.9.0.0/29", Gateway: "10.9.0.1",
			SecretRef:   &ipamv1alpha1.SecretReference{Name: "team"},
			CABundleRef: &ipamv1alpha1.CABundleReference{Kind: "ConfigMap", Name: "ipam-ca", Key: "ca.crt"}}})
	w.mustCreate(&ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: nsApps, Name: "routed"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "inet", IPFamily: ipamv1alpha1.IPv4, SecretRef: &ipamv1alpha1.SecretReference{Name: "team"}}})
}

func secretOf(ns, name, value string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{"secret": []byte(value)}}
}

func (w *world) mustCreate(obj client.Object) {
	if err := w.cluster.create(obj); err != nil {
		panic(err)
	}
}

// userAction is something a user does; it returns what it did ("" if it did nothing).
type userAction struct {
	name   string
	weight int
	do     func(w *world) string
}

func userActions() []userAction {
	return []userAction{
		{"create a claim", 6, (*world).createClaim},
		{"delete a claim", 4, (*world).deleteClaim},
		{"change a claim's retention", 1, (*world).changeRetention},
		{"point a claim at another Secret", 1, (*world).changeClaimSecret},
		{"roll back a rotation that does not end", 2, (*world).abandonRotation},
		{"create a Service", 4, (*world).createService},
		{"delete a Service", 2, (*world).deleteService},
		{"move a Service to another pool", 3, (*world).moveService},
		{"move a Service whose address does not come", 6, (*world).moveWaitingService},
		{"move a Service again before its move ends", 4, (*world).moveMovingService},
		{"re-create a deleted Secret", 1, (*world).recreateSecret},
		{"delete a Secret", 1, (*world).deleteSecret},
		{"delete and re-create a claim under its Secret", 3, (*world).recreateClaim},
		{"delete a namespace", 1, (*world).deleteNamespace},
	}
}

func (w *world) userAction() {
	w.users++
	total := 0
	for _, a := range w.actions {
		total += a.weight
	}
	for tries := 0; tries < 5; tries++ {
		n := w.s.pick(total)
		for _, a := range w.actions {
			if n >= a.weight {
				n -= a.weight
				continue
			}
			if did := a.do(w); did != "" {
				w.s.log("user: %s", did)
				return
			}
			break
		}
	}
}

// list reads the API server.
func list[L client.ObjectList](w *world, l L, opts ...client.ListOption) L {
	if err := w.cluster.direct.List(context.Background(), l, opts...); err != nil {
		panic(err)
	}
	return l
}

func (w *world) liveNamespace(name string) bool {
	ns := &corev1.Namespace{}
	err := w.cluster.direct.Get(context.Background(), client.ObjectKey{Name: name}, ns)
	return err == nil && ns.DeletionTimestamp.IsZero()
}

// claims of the users (not the Service controller's), live.
func (w *world) userClaims() []ipamv1.IPAddressClaim {
	var out []ipamv1.IPAddressClaim
	for _, c := range list(w, &ipamv1.IPAddressClaimList{}).Items {
		if metav1.GetControllerOf(&c) == nil && c.DeletionTimestamp.IsZero() {
			out = append(out, c)
		}
	}
	return out
}

func (w *world) createClaim() string {
	if !w.liveNamespace(nsApps) {
		return ""
	}
	w.cluster.nextUID++ // names need not be unique over time, but a fresh one each is easier to read
	name := "c" + strconv.Itoa(w.cluster.nextUID)
	pool := []ipamv1.IPPoolReference{
		{APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: ipamv1alpha1.VitistackIPPoolKind, Name: "nodes"},
		{APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: ipamv1alpha1.VitistackIPPoolKind, Name: "routed"},
		{APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: ipamv1alpha1.GlobalVitistackIPPoolKind, Name: "inet-a"},
		{APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: ipamv1alpha1.GlobalVitistackIPPoolKind, Name: "private"},
	}[w.s.pick(4)]
	c := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: nsApps, Name: name, Annotations: map[string]string{}},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: pool}}
	if w.s.chance(0.3) {
		c.Annotations[ipamv1alpha1.RetentionPeriodDaysAnnotation] = strconv.Itoa(w.s.pick(3))
	}
	if pool.Kind == ipamv1alpha1.GlobalVitistackIPPoolKind {
		switch n := w.s.pick(10); {
		case n < 3:
			c.Annotations[ipamv1alpha1.SecretAnnotation] = "team"
		case n < 8:
			// A Secret of its own, made with the claim (as a GitOps bundle does): once the
			// claim is deleted nothing names it, and the protector lets it go while the claim
			// may be re-created under it.
			solo := "solo-" + name
			if !w.exists(&corev1.Secret{}, nsApps, solo) && w.cluster.create(secretOf(nsApps, solo, solo+"-value-0123456789")) != nil {
				return ""
			}
			c.Annotations[ipamv1alpha1.SecretAnnotation] = solo
		}
	}
	if err := w.cluster.create(c); err != nil {
		return ""
	}
	return fmt.Sprintf("creates IPAddressClaim %s/%s of %s %s %v", c.Namespace, c.Name, pool.Kind, pool.Name, c.Annotations)
}

func (w *world) deleteClaim() string { return deleteOneOf(w, "IPAddressClaim", w.userClaims()) }

// deleteOneOf deletes one of objs, picked by the scheduler, and says so ("" if none).
func deleteOneOf[T any, P interface {
	*T
	client.Object
}](w *world, kind string, objs []T) string {
	if len(objs) == 0 {
		return ""
	}
	o := P(&objs[w.s.pick(len(objs))])
	_ = w.cluster.delete(o)
	return "deletes " + kind + " " + o.GetNamespace() + "/" + o.GetName()
}

// recreateClaim deletes a claim and makes it again, same name, same annotations, once
// the name is free, as a GitOps sync does: the same IPAM-API identity under the same Secret.
func (w *world) recreateClaim() string {
	cs := w.userClaims()
	// Most often one with a Secret of its own, which nothing else names.
	if solo := slices.DeleteFunc(slices.Clone(cs), func(c ipamv1.IPAddressClaim) bool {
		return !strings.HasPrefix(c.Annotations[ipamv1alpha1.SecretAnnotation], "solo-")
	}); len(solo) > 0 && w.s.chance(0.7) {
		cs = solo
	}
	if len(cs) == 0 {
		return ""
	}
	c := cs[w.s.pick(len(cs))]
	_ = w.cluster.delete(&c)
	again := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name, Annotations: map[string]string{}},
		Spec: c.Spec}
	for _, k := range []string{ipamv1alpha1.SecretAnnotation, ipamv1alpha1.RetentionPeriodDaysAnnotation} {
		if v, ok := c.Annotations[k]; ok {
			again.Annotations[k] = v
		}
	}
	w.recreate = append(w.recreate, again)
	return fmt.Sprintf("deletes IPAddressClaim %s, to create it again once it is gone", c.Name)
}

// recreated is the claims waiting to be made again that are due now. A GitOps sync makes a
// claim again at its own pace once the name is free: at once, or as the Secret protector
// looks at the claim's Secret that nothing names any more (its removal delay, 1 s), or later.
func (w *world) recreated() []*ipamv1.IPAddressClaim {
	var out []*ipamv1.IPAddressClaim
	for _, c := range w.recreate {
		due, set := w.due[c]
		if !set {
			if w.exists(&ipamv1.IPAddressClaim{}, c.Namespace, c.Name) {
				continue
			}
			due = w.s.clock.now.Add([]time.Duration{0, time.Second, 2 * time.Second}[w.s.pick(3)])
			w.due[c] = due
		}
		if !w.s.clock.now.Before(due) && !w.exists(&ipamv1.IPAddressClaim{}, c.Namespace, c.Name) {
			out = append(out, c)
		}
	}
	return out
}

func (w *world) updateClaim(mutate func(c *ipamv1.IPAddressClaim) string) string {
	cs := w.userClaims()
	if len(cs) == 0 {
		return ""
	}
	c := cs[w.s.pick(len(cs))].DeepCopy()
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	did := mutate(c)
	if did == "" || w.cluster.update(c) != nil {
		return ""
	}
	return did + " of IPAddressClaim " + c.Name
}

func (w *world) changeRetention() string {
	return w.updateClaim(func(c *ipamv1.IPAddressClaim) string {
		v := strconv.Itoa(w.s.pick(3))
		c.Annotations[ipamv1alpha1.RetentionPeriodDaysAnnotation] = v
		return "sets the retention to " + v
	})
}

func (w *world) changeClaimSecret() string {
	return w.updateClaim(func(c *ipamv1.IPAddressClaim) string {
		name := []string{"team", "team2", "default"}[w.s.pick(3)]
		if name == "team2" && !w.exists(&corev1.Secret{}, nsApps, "team2") && w.liveNamespace(nsApps) {
			_ = w.cluster.create(secretOf(nsApps, "team2", "team2-value-0123456789"))
		}
		c.Annotations[ipamv1alpha1.SecretAnnotation] = name
		return "points the secret annotation at " + name
	})
}

// abandonRotation deletes a claim whose record still names the Secret it is being moved
// to, and that Secret: what a user does to roll back a rotation that does not end.
func (w *world) abandonRotation() string {
	var rotating []ipamv1.IPAddressClaim
	for _, c := range w.userClaims() {
		if r, _ := record.OnClaim(c.Annotations); r != nil && !r.RotatingTo.IsZero() {
			rotating = append(rotating, c)
		}
	}
	if len(rotating) == 0 {
		return ""
	}
	c := rotating[w.s.pick(len(rotating))]
	r, _ := record.OnClaim(c.Annotations)
	to := r.RotatingTo
	_ = w.cluster.delete(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: to.Namespace, Name: to.Name}})
	_ = w.cluster.delete(&c)
	return fmt.Sprintf("deletes Secret %s/%s, the target of IPAddressClaim %s's rotation, and the claim", to.Namespace, to.Name, c.Name)
}

func (w *world) exists(obj client.Object, ns, name string) bool {
	return w.cluster.direct.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, obj) == nil
}

func (w *world) deleteSecret() string {
	secrets := list(w, &corev1.SecretList{}).Items
	secrets = slices.DeleteFunc(secrets, func(s corev1.Secret) bool { return !s.DeletionTimestamp.IsZero() })
	return deleteOneOf(w, "Secret", secrets)
}

func (w *world) recreateSecret() string {
	for _, s := range []*corev1.Secret{secretOf(nsApps, "team", "team-value-0123456789"), secretOf(nsWeb, "svc", "svc-value-0123456789"),
		secretOf(nsApps, "team2", "team2-value-0123456789")} {
		if !w.exists(&corev1.Secret{}, s.Namespace, s.Name) && w.liveNamespace(s.Namespace) && w.cluster.create(s) == nil {
			return "creates Secret " + s.Namespace + "/" + s.Name + " again, with its old value"
		}
	}
	return ""
}

func (w *world) services() []corev1.Service {
	var out []corev1.Service
	for _, s := range list(w, &corev1.ServiceList{}).Items {
		if s.DeletionTimestamp.IsZero() {
			out = append(out, s)
		}
	}
	return out
}

func (w *world) serviceWebhook() *webhooks.Service {
	return &webhooks.Service{Client: w.cluster.direct, APIReader: w.cluster.direct, ExcludedNamespaces: w.options.ExcludedNamespaces,
		DefaultZone: w.options.DefaultZone}
}

func (w *world) createService() string {
	if !w.liveNamespace(nsWeb) {
		return ""
	}
	w.cluster.nextUID++
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: nsWeb, Name: "s" + strconv.Itoa(w.cluster.nextUID),
		Annotations: map[string]string{ipamv1alpha1.ZoneAnnotation: "inet"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if w.s.chance(0.5) {
		svc.Annotations[ipamv1alpha1.PoolAnnotation] = movePools[w.s.pick(len(movePools))]
	}
	if w.s.chance(0.3) {
		svc.Annotations[ipamv1alpha1.SecretAnnotation] = "svc"
	}
	if w.s.chance(0.2) {
		svc.Annotations[ipamv1alpha1.IPFamilyAnnotation] = "dual"
		svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
		svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	}
	if _, err := w.serviceWebhook().ValidateCreate(context.Background(), svc); err != nil {
		w.s.log("user: the Service webhook refuses %s: %v", svc.Name, shorten(err.Error()))
		return ""
	}
	if err := w.cluster.create(svc); err != nil {
		return ""
	}
	return fmt.Sprintf("creates Service %s/%s %v", svc.Namespace, svc.Name, svc.Annotations)
}

func (w *world) deleteService() string { return deleteOneOf(w, "Service", w.services()) }

// moveService sets a Service's pool annotation to another of the three pools of its zone
// and family (or back): a move with the same IPAM-API identity.
func (w *world) moveService() string {
	return w.move(w.services(), nil)
}

// moveWaitingService moves a Service whose claim says it is not bound (a failed request, a
// wait): what a user does when the address does not come.
func (w *world) moveWaitingService() string {
	return w.move(w.servicesWaiting(w.services()), nil)
}

// moveMovingService moves a Service that still has a claim in a pool it was moved from,
// to a pool none of its claims is in: a second move before the first has ended.
func (w *world) moveMovingService() string {
	pools := map[types.UID][]string{}
	for _, c := range list(w, &ipamv1.IPAddressClaimList{}).Items {
		if owner := metav1.GetControllerOf(&c); owner != nil && owner.Kind == "Service" && c.DeletionTimestamp.IsZero() {
			pools[owner.UID] = append(pools[owner.UID], c.Spec.PoolRef.Name)
		}
	}
	var moving []corev1.Service
	for _, s := range w.services() {
		if to := s.Annotations[ipamv1alpha1.PoolAnnotation]; to != "" && slices.ContainsFunc(pools[s.UID], func(p string) bool {
			return p != to && slices.Contains(movePools, p)
		}) {
			moving = append(moving, s)
		}
	}
	return w.move(moving, func(s corev1.Service) []string { return pools[s.UID] })
}

func (w *world) move(ss []corev1.Service, avoid func(corev1.Service) []string) string {
	ss = slices.DeleteFunc(slices.Clone(ss), func(s corev1.Service) bool { return w.moves[s.UID] >= 2 })
	if len(ss) == 0 {
		return ""
	}
	old := ss[w.s.pick(len(ss))]
	svc := old.DeepCopy()
	others := slices.DeleteFunc(slices.Clone(movePools), func(p string) bool {
		return p == svc.Annotations[ipamv1alpha1.PoolAnnotation] || avoid != nil && slices.Contains(avoid(old), p)
	})
	if len(others) == 0 {
		return ""
	}
	to := others[w.s.pick(len(others))]
	svc.Annotations[ipamv1alpha1.PoolAnnotation] = to
	if _, err := w.serviceWebhook().ValidateUpdate(context.Background(), &old, svc); err != nil {
		w.s.log("user: the Service webhook refuses moving %s: %v", svc.Name, shorten(err.Error()))
		return ""
	}
	if err := w.cluster.update(svc); err != nil {
		return ""
	}
	w.moves[svc.UID]++
	return fmt.Sprintf("moves Service %s/%s to pool %s", svc.Namespace, svc.Name, to)
}

// servicesWaiting is those of ss with a live claim that is not bound and says why.
func (w *world) servicesWaiting(ss []corev1.Service) []corev1.Service {
	waiting := map[types.UID]bool{}
	for _, c := range list(w, &ipamv1.IPAddressClaimList{}).Items {
		if owner := metav1.GetControllerOf(&c); owner != nil && owner.Kind == "Service" && c.DeletionTimestamp.IsZero() && c.Status.AddressRef.Name == "" &&
			conditions.IsFalse(&c, ipamv1.IPAddressClaimReadyCondition) {
			waiting[owner.UID] = true
		}
	}
	return slices.DeleteFunc(slices.Clone(ss), func(s corev1.Service) bool { return !waiting[s.UID] })
}

func (w *world) deleteNamespace() string {
	if !w.s.chance(0.3) { // rare: it ends the namespace's part of the run
		return ""
	}
	ns := []string{nsApps, nsWeb}[w.s.pick(2)]
	if !w.liveNamespace(ns) {
		return ""
	}
	n := &corev1.Namespace{}
	if w.cluster.direct.Get(context.Background(), client.ObjectKey{Name: ns}, n) != nil {
		return ""
	}
	_ = w.cluster.delete(n)
	return "deletes Namespace " + ns
}

// admitDelete is the pool webhook's word on a delete (the namespace controller's too).
func (w *world) admitDelete(obj client.Object) error {
	var pool ipamv1alpha1.Pool
	switch p := obj.(type) {
	case *ipamv1alpha1.VitistackIPPool:
		pool = p
	case *ipamv1alpha1.GlobalVitistackIPPool:
		pool = p
	default:
		return nil
	}
	kind := ipamv1alpha1.VitistackIPPoolKind
	if obj.GetNamespace() == "" {
		kind = ipamv1alpha1.GlobalVitistackIPPoolKind
	}
	_, err := (&webhooks.Pool{Client: w.cluster.direct, Kind: kind}).ValidateDelete(context.Background(), pool)
	if err != nil && !apierrors.IsNotFound(err) {
		return errors.Wrap(err, "the pool webhook")
	}
	return nil
}
