package simulation

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/test/chaos"
)

// The oracle of the simulation. At every quiet point, whatever is still under way:
//   - no address handed out twice: two live claims bound to one address unless both
//     declare one share key, or both are the same Service's (a move hands an address over);
//   - no address a live claim is bound to is free in the IPAM-API (MetalLB would announce
//     an address the IPAM-API may give to someone else);
//   - no address leaked: every live holder the IPAM-API has, whatever its identity, is
//     accounted for by an IPAddress's record, or a record on a claim;
//   - no IPAddress whose address is not its record's.
// Once settled, also what test/chaos's Account finds in a settled cluster: nothing
// deleted left behind (but a Secret a live claim's record still names, which the
// provider keeps on purpose), every Secret protected exactly while pools or records name
// it, no IPAddress without its bound claim.

// safety lists what breaks the promise at a quiet point.
func (w *world) safety() []string { return w.safetyOf(w.account()) }

func (w *world) safetyOf(a chaos.Accounts) []string {
	out := prefixed("leaked", a.Leaked)
	out = append(out, prefixed("mismatched", a.Mismatched)...)
	out = append(out, w.boundTwiceOrFree()...)
	return out
}

// settledProblems lists what a settled cluster must not have.
func (w *world) settledProblems() []string {
	a := w.account()
	out := w.safetyOf(a)
	out = append(out, prefixed("orphaned", a.Orphaned)...)
	out = append(out, prefixed("protections", a.Protections)...)
	out = append(out, w.caBundleProtection()...)
	out = append(out, w.movesLeftHalfway()...)
	held := w.secretsOfLiveRecords()
	for _, s := range a.Stuck {
		if strings.HasPrefix(s, "Secret ") {
			key := strings.Fields(strings.TrimPrefix(s, "Secret "))[0]
			if held[key] {
				continue // a live claim's record names it: kept until that claim releases
			}
		}
		out = append(out, "stuck: "+s)
	}
	return out
}

func prefixed(class string, entries []string) []string {
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, class+": "+e)
	}
	return out
}

func (w *world) account() chaos.Accounts {
	// The run owns the whole IPAM-API: every holder it has is accounted (nil scope).
	a, err := chaos.Account(context.Background(), w.cluster.direct, w.ipam.api.Registrations(), nil,
		types.NamespacedName{Namespace: w.options.DefaultSecretNamespace, Name: w.options.DefaultSecretName})
	if err != nil {
		panic(err)
	}
	return a
}

// boundTwiceOrFree finds an address bound by two live claims without consent, and an
// address a live claim is bound to that the IPAM-API does not hold for it.
func (w *world) boundTwiceOrFree() []string {
	live := map[string]bool{} // holder service/ns/cluster @ address
	for _, r := range w.ipam.api.Registrations() {
		for _, h := range r.Holders {
			if h.ExpiresAt == nil {
				live[fmt.Sprintf("%s/%s/%s@%s", h.ServiceName, h.NamespaceID, h.ClusterID, r.Address)] = true
			}
		}
	}
	claims := map[types.NamespacedName]*ipamv1.IPAddressClaim{}
	for _, c := range list(w, &ipamv1.IPAddressClaimList{}).Items {
		claims[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = &c
	}
	type binding struct {
		claim   *ipamv1.IPAddressClaim
		share   string
		service types.UID
	}
	byHost := map[string][]binding{}
	var out []string
	for _, a := range list(w, &ipamv1.IPAddressList{}).Items {
		c := claims[types.NamespacedName{Namespace: a.Namespace, Name: a.Spec.ClaimRef.Name}]
		if c == nil || !c.DeletionTimestamp.IsZero() || c.Status.AddressRef.Name != a.Name || !a.DeletionTimestamp.IsZero() {
			continue // not a live claim's binding
		}
		rec, err := record.OnAddress(a.Labels, a.Annotations)
		if err != nil || rec == nil {
			continue // the settled oracle names it
		}
		id := rec.Identity
		if !live[fmt.Sprintf("%s/%s/%s@%s", id.ServiceName, id.NamespaceID, id.ClusterID, rec.Address)] {
			out = append(out, fmt.Sprintf("free: IPAddressClaim %s/%s is bound to %s, which the IPAM-API does not hold for %s/%s",
				c.Namespace, c.Name, rec.Address, id.NamespaceID, id.ServiceName))
		}
		b := binding{claim: c, share: a.Annotations[ipamv1alpha1.AllowLocalSharedIPAnnotation]}
		if owner := metav1.GetControllerOf(c); owner != nil && owner.Kind == "Service" {
			b.service = owner.UID
		}
		byHost[rec.HostKey()] = append(byHost[rec.HostKey()], b)
	}
	for host, bs := range byHost {
		for _, b := range bs[1:] {
			consent := bs[0].share != "" && b.share == bs[0].share
			handover := bs[0].service != "" && b.service == bs[0].service
			if !consent && !handover {
				var names []string
				for _, x := range bs {
					names = append(names, x.claim.Namespace+"/"+x.claim.Name)
				}
				out = append(out, fmt.Sprintf("duplicated: %s is bound by %s", host, strings.Join(names, ", ")))
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// caBundleProtection finds a CA bundle that a record names without its finalizer, or that
// keeps the finalizer while nothing names it.
func (w *world) caBundleProtection() []string {
	named := map[string]bool{}
	for _, c := range list(w, &ipamv1.IPAddressClaimList{}).Items {
		if r, _ := record.OnClaim(c.Annotations); r != nil && r.CABundle.Name != "" {
			named[r.CABundle.Namespace+"/"+r.CABundle.Name] = true
		}
	}
	for _, a := range list(w, &ipamv1.IPAddressList{}).Items {
		if r, _ := record.OnAddress(a.Labels, a.Annotations); r != nil && r.CABundle.Name != "" {
			named[r.CABundle.Namespace+"/"+r.CABundle.Name] = true
		}
	}
	for _, p := range list(w, &ipamv1alpha1.VitistackIPPoolList{}).Items {
		if p.Spec.CABundleRef != nil {
			named[p.Namespace+"/"+p.Spec.CABundleRef.Name] = true
		}
	}
	var out []string
	for _, cm := range list(w, &corev1.ConfigMapList{}).Items {
		key := cm.Namespace + "/" + cm.Name
		switch has := slices.Contains(cm.Finalizers, ipamv1alpha1.CABundleInUseFinalizer); {
		case named[key] && !has:
			out = append(out, "protections: CA bundle ConfigMap "+key+" is named by a record, without the finalizer "+ipamv1alpha1.CABundleInUseFinalizer)
		case !named[key] && has:
			out = append(out, "protections: CA bundle ConfigMap "+key+" keeps the finalizer "+ipamv1alpha1.CABundleInUseFinalizer+", and nothing names it")
		}
		delete(named, key)
	}
	for key := range named {
		out = append(out, "protections: CA bundle ConfigMap "+key+" is named by a record, and is gone")
	}
	sort.Strings(out)
	return out
}

// secretsOfLiveRecords is the Secrets ("namespace/name") that the record of a live claim,
// or of its IPAddress, names.
func (w *world) secretsOfLiveRecords() map[string]bool {
	out := map[string]bool{}
	name := func(r *record.Registration) {
		for _, ref := range r.Secrets() {
			out[ref.Namespace+"/"+ref.Name] = true
		}
	}
	live := map[types.NamespacedName]bool{}
	for _, c := range list(w, &ipamv1.IPAddressClaimList{}).Items {
		if !c.DeletionTimestamp.IsZero() {
			continue
		}
		live[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = true
		if r, _ := record.OnClaim(c.Annotations); r != nil {
			name(r)
		}
	}
	for _, a := range list(w, &ipamv1.IPAddressList{}).Items {
		if r, _ := record.OnAddress(a.Labels, a.Annotations); r != nil && live[types.NamespacedName{Namespace: a.Namespace, Name: a.Spec.ClaimRef.Name}] {
			name(r)
		}
	}
	return out
}

// movesLeftHalfway finds a Service moved to another pool whose claim there is not bound
// while a claim of its old pool lives on: a move that neither finishes nor lets go.
// Once settled, a move ends bound in the new pool, unless the user must act (the
// Secret the Service names is gone).
func (w *world) movesLeftHalfway() []string {
	claims := map[types.UID][]ipamv1.IPAddressClaim{}
	for _, c := range list(w, &ipamv1.IPAddressClaimList{}).Items {
		if owner := metav1.GetControllerOf(&c); owner != nil && owner.Kind == "Service" && c.DeletionTimestamp.IsZero() {
			claims[owner.UID] = append(claims[owner.UID], c)
		}
	}
	var out []string
	for _, s := range w.services() {
		to := s.Annotations[ipamv1alpha1.PoolAnnotation]
		if to == "" || !w.liveNamespace(s.Namespace) || !w.secretUsable(s) {
			continue
		}
		var stale, current []string
		for _, c := range claims[s.UID] {
			if !slices.Contains(movePools, c.Spec.PoolRef.Name) {
				continue // another family
			}
			if c.Spec.PoolRef.Name != to {
				stale = append(stale, c.Name)
				continue
			}
			if c.Status.AddressRef.Name == "" {
				why := "no Ready condition"
				if r := conditions.Get(&c, ipamv1.IPAddressClaimReadyCondition); r != nil {
					why = r.Reason + ": " + shorten(r.Message)
				}
				current = append(current, c.Name+" ("+why+")")
			}
		}
		if len(stale) > 0 && len(current) > 0 {
			out = append(out, fmt.Sprintf("halfway: Service %s/%s moved to pool %s keeps its old claims %v, and its claims there are not bound: %v",
				s.Namespace, s.Name, to, stale, current))
		}
	}
	sort.Strings(out)
	return out
}

// secretUsable reports whether the Secret a Service registers under exists and is not
// being deleted (a claim cannot register under it otherwise, until the user acts).
func (w *world) secretUsable(s corev1.Service) bool {
	key := client.ObjectKey{Namespace: w.options.DefaultSecretNamespace, Name: w.options.DefaultSecretName}
	if name := s.Annotations[ipamv1alpha1.SecretAnnotation]; name != "" {
		key = client.ObjectKey{Namespace: s.Namespace, Name: name}
	}
	sec := &corev1.Secret{}
	return w.cluster.direct.Get(context.Background(), key, sec) == nil && sec.DeletionTimestamp.IsZero()
}
