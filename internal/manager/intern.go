package manager

import (
	"sync"
	"unique"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
)

// internMaxLen bounds the annotation values shared: longer ones (a registration
// record) are one object's own.
const internMaxLen = 64

// intern returns the one shared copy of s.
func intern(s string) string {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}

// internMap returns m with its keys, and its values up to maxLen bytes, shared.
func internMap(m map[string]string, maxLen int) map[string]string {
	if len(m) == 0 {
		return m
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		if len(v) <= maxLen {
			v = intern(v)
		}
		out[intern(k)] = v
	}
	return out
}

// maxLabelSets bounds how many label sets labelSets keeps. The sets that repeat are few
// (one a pool, zone and family for IPAddresses; one a Cluster or Service for claims);
// when the table is full (many Services, or sets of objects long gone) it starts again
// empty: cached objects keep the maps they have, and sets seen again are kept anew.
const maxLabelSets = 1024

// labelSets keeps one map of each set of labels it has seen on claims and IPAddresses:
// every IPAddress of a pool carries the same labels (pool, kind, zone, family, often the
// cluster), and one shared map instead of a map an object is about 300 bytes less for
// each (3 MB at 10,000 bound claims). The cache's objects are read, never written: a
// Get or List copies them, and what lists them with client.UnsafeDisableDeepCopy (or an
// event handler, which gets them as they are) must not write to them, now less than
// ever: a label written to one would be written to every object that shares its map.
type labelSets struct {
	mu   sync.Mutex
	sets map[string]map[string]string
}

func newLabelSets() *labelSets { return &labelSets{sets: map[string]map[string]string{}} }

// share returns the kept map equal to m, else m with its strings interned (and keeps
// it).
func (l *labelSets) share(m map[string]string) map[string]string {
	if len(m) == 0 {
		return m
	}
	// Sorted key=value pairs: valid label keys and values hold neither "=" nor ",".
	key := labels.Set(m).String()
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.sets[key]; ok {
		return s
	}
	s := internMap(m, 1<<10)
	if len(l.sets) >= maxLabelSets {
		clear(l.sets)
	}
	l.sets[key] = s
	return s
}

// internStrings is a cache transform: the strings that repeat across thousands of
// cached claims and IPAddresses (namespace, label and annotation keys, zone, family,
// pool, owner kinds and UIDs, finalizers, condition types and reasons) share one copy
// instead of one per object, as decoded from the watch. The objects are equal to what
// was decoded, so nothing the provider compares or patches changes; the cache of
// 10,000 bound claims is smaller by about a tenth. Claims and IPAddresses with the same
// labels share one map of them (sets).
func internStrings(obj any, sets *labelSets) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetNamespace(intern(m.GetNamespace()))
		switch obj.(type) {
		case *ipamv1.IPAddressClaim, *ipamv1.IPAddress:
			m.SetLabels(sets.share(m.GetLabels()))
		default:
			m.SetLabels(internMap(m.GetLabels(), 1<<10))
		}
		m.SetAnnotations(internMap(m.GetAnnotations(), internMaxLen))
		fins := m.GetFinalizers()
		for i := range fins {
			fins[i] = intern(fins[i])
		}
		refs := m.GetOwnerReferences()
		for i := range refs {
			refs[i].APIVersion, refs[i].Kind = intern(refs[i].APIVersion), intern(refs[i].Kind)
			if sharedOwner(refs[i].Kind) {
				refs[i].Name, refs[i].UID = intern(refs[i].Name), types.UID(intern(string(refs[i].UID)))
			}
		}
	}
	switch o := obj.(type) {
	case *ipamv1.IPAddressClaim:
		internPoolRef(&o.Spec.PoolRef)
		o.Spec.ClusterName = intern(o.Spec.ClusterName)
		internConditions(o.Status.Conditions)
	case *ipamv1.IPAddress:
		internPoolRef(&o.Spec.PoolRef)
		o.Spec.Gateway = intern(o.Spec.Gateway)
	}
	return obj, nil
}

// sharedOwner reports whether owners of kind own many cached objects each.
func sharedOwner(kind string) bool {
	return kind == ipamv1alpha1.VitistackIPPoolKind || kind == ipamv1alpha1.GlobalVitistackIPPoolKind || kind == "Cluster"
}

func internPoolRef(r *ipamv1.IPPoolReference) {
	r.APIGroup, r.Kind, r.Name = intern(r.APIGroup), intern(r.Kind), intern(r.Name)
}

func internConditions(cs []metav1.Condition) {
	for i := range cs {
		cs[i].Type, cs[i].Reason = intern(cs[i].Type), intern(cs[i].Reason)
		cs[i].Status = metav1.ConditionStatus(intern(string(cs[i].Status)))
	}
}

// cacheTransform strips managedFields and shares repeated strings and label sets.
func cacheTransform() toolscache.TransformFunc {
	strip := cache.TransformStripManagedFields()
	sets := newLabelSets()
	return func(obj any) (any, error) {
		obj, err := strip(obj)
		if err != nil {
			return obj, err
		}
		return internStrings(obj, sets)
	}
}
