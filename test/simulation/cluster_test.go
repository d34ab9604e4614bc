package simulation

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
)

// namespaceFinalizer stands for the API server's spec.finalizers "kubernetes" on a
// Namespace: the fake client knows only metadata finalizers, so the namespace
// controller of the simulation removes this one once the namespace is empty.
const namespaceFinalizer = "simulation/namespace"

// cluster is the API server: controller-runtime's fake client, with what the fake lacks
// and a user meets (UIDs, creation times, generations, refused creates in a namespace
// being deleted), and every change fanned out as a watch event to every live process.
type cluster struct {
	s       *sched
	scheme  *runtime.Scheme
	direct  client.WithWatch
	objects map[objKey]client.Object // as last seen: what an event's old object is
	uids    map[types.UID]objKey
	procs   []*process
	nextUID int
	// changes counts the changes of any object: an oracle that saw none since it last
	// looked finds the same.
	changes int
}

type objKey struct {
	gvk schema.GroupVersionKind
	key types.NamespacedName
}

func (k objKey) String() string { return k.gvk.Kind + " " + k.key.String() }

func newCluster(s *sched) *cluster {
	scheme := manager.NewScheme()
	b := fake.NewClientBuilder().WithScheme(scheme).
		WithStatusSubresource(&ipamv1.IPAddressClaim{}, &ipamv1alpha1.VitistackIPPool{}, &ipamv1alpha1.GlobalVitistackIPPool{}, &corev1.Service{})
	index.Each(func(obj client.Object, field string, fn client.IndexerFunc) { b = b.WithIndex(obj, field, fn) })
	return &cluster{s: s, scheme: scheme, direct: b.Build(), objects: map[objKey]client.Object{}, uids: map[types.UID]objKey{}}
}

func (c *cluster) keyOf(obj client.Object) objKey {
	gvk, err := apiutil.GVKForObject(obj, c.scheme)
	if err != nil {
		panic(err)
	}
	return objKey{gvk: gvk, key: client.ObjectKeyFromObject(obj)}
}

func (c *cluster) newObject(gvk schema.GroupVersionKind) client.Object {
	o, err := c.scheme.New(gvk)
	if err != nil {
		panic(err)
	}
	return o.(client.Object)
}

// get reads the API server's object of k (nil: none).
func (c *cluster) get(k objKey) client.Object {
	o := c.newObject(k.gvk)
	if err := c.direct.Get(context.Background(), k.key, o); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		panic(err)
	}
	return o
}

// changed fans out what a write did to the object of k as one watch event per process.
func (c *cluster) changed(k objKey) {
	now := c.get(k)
	old := c.objects[k]
	if old == nil && now == nil || old != nil && now != nil && old.GetResourceVersion() == now.GetResourceVersion() {
		return
	}
	c.changes++
	if now == nil {
		delete(c.objects, k)
		delete(c.uids, old.GetUID())
	} else {
		c.objects[k] = now
		c.uids[now.GetUID()] = k
	}
	for _, p := range c.procs {
		p.enqueueEvent(k, old, now)
	}
}

// admit does for a create what the API server does that the fake client does not.
func (c *cluster) admit(ctx context.Context, obj client.Object) error {
	if ns := obj.GetNamespace(); ns != "" {
		n := &corev1.Namespace{}
		if err := c.direct.Get(ctx, types.NamespacedName{Name: ns}, n); err != nil {
			return err
		}
		if !n.DeletionTimestamp.IsZero() {
			return apierrors.NewForbidden(schema.GroupResource{Resource: c.keyOf(obj).gvk.Kind}, obj.GetName(),
				fmt.Errorf("unable to create new content in namespace %s because it is being terminated", ns))
		}
	}
	if obj.GetUID() == "" {
		c.nextUID++
		obj.SetUID(types.UID("uid-" + strconv.Itoa(c.nextUID)))
	}
	if ts := obj.GetCreationTimestamp(); ts.IsZero() {
		obj.SetCreationTimestamp(metav1.NewTime(c.s.clock.now))
	}
	if obj.GetGeneration() == 0 {
		obj.SetGeneration(1)
	}
	if _, ok := obj.(*corev1.Namespace); ok && !slices.Contains(obj.GetFinalizers(), namespaceFinalizer) {
		obj.SetFinalizers(append(obj.GetFinalizers(), namespaceFinalizer))
	}
	return nil
}

// Writes of users and the cluster's own controllers (garbage collector, namespace
// controller): straight to the API server.

func (c *cluster) create(obj client.Object) error {
	ctx := context.Background()
	if err := c.admit(ctx, obj); err != nil {
		return err
	}
	if err := c.direct.Create(ctx, obj); err != nil {
		return err
	}
	c.changed(c.keyOf(obj))
	return nil
}

func (c *cluster) update(obj client.Object) error {
	err := c.direct.Update(context.Background(), obj)
	c.changed(c.keyOf(obj))
	return err
}

func (c *cluster) delete(obj client.Object) error {
	err := c.direct.Delete(context.Background(), obj)
	c.changed(c.keyOf(obj))
	return err
}

// all lists the objects the cluster has of every kind, sorted by kind then key.
func (c *cluster) all() []objKey {
	out := make([]objKey, 0, len(c.objects))
	for k := range c.objects {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// garbage is what the garbage collector deletes next: an object none of whose owners
// exist, not being deleted already.
func (c *cluster) garbage() []objKey {
	var out []objKey
	for _, k := range c.all() {
		o := c.objects[k]
		refs := o.GetOwnerReferences()
		if len(refs) == 0 || !o.GetDeletionTimestamp().IsZero() {
			continue
		}
		alive := false
		for _, r := range refs {
			if _, ok := c.uids[r.UID]; ok {
				alive = true
			}
		}
		if !alive {
			out = append(out, k)
		}
	}
	return out
}

// terminating is the work of the namespace controller: for each namespace being deleted,
// the objects in it not deleted yet, or the namespace itself once it is empty.
func (c *cluster) terminating() []objKey {
	var out []objKey
	for _, k := range c.all() {
		ns, ok := c.objects[k].(*corev1.Namespace)
		if !ok || ns.DeletionTimestamp.IsZero() {
			continue
		}
		empty := true
		for _, o := range c.all() {
			if o.key.Namespace == ns.Name {
				empty = false
				if c.objects[o].GetDeletionTimestamp().IsZero() {
					out = append(out, o)
				}
			}
		}
		if empty {
			out = append(out, k)
		}
	}
	return out
}

// finishNamespace removes the stand-in for the API server's namespace finalizer.
func (c *cluster) finishNamespace(k objKey) error {
	ns := c.objects[k].DeepCopyObject().(*corev1.Namespace)
	ns.Finalizers = slices.DeleteFunc(ns.Finalizers, func(f string) bool { return f == namespaceFinalizer })
	return c.update(ns)
}

// store is a process's cache: what the watch events it was given say, read as
// controller-runtime's cache reads (field indexes, label selectors, namespaces).
type store struct {
	scheme  *runtime.Scheme
	objects map[objKey]client.Object
	indexes map[schema.GroupVersionKind]map[string]client.IndexerFunc
}

func newStore(scheme *runtime.Scheme) *store {
	st := &store{scheme: scheme, objects: map[objKey]client.Object{}, indexes: map[schema.GroupVersionKind]map[string]client.IndexerFunc{}}
	index.Each(func(obj client.Object, field string, fn client.IndexerFunc) {
		gvk, err := apiutil.GVKForObject(obj, scheme)
		if err != nil {
			panic(err)
		}
		if st.indexes[gvk] == nil {
			st.indexes[gvk] = map[string]client.IndexerFunc{}
		}
		st.indexes[gvk][field] = fn
	})
	return st
}

func (st *store) set(k objKey, o client.Object) {
	if o == nil {
		delete(st.objects, k)
		return
	}
	cp := o.DeepCopyObject().(client.Object)
	cp.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{}) // as an informer's typed objects
	st.objects[k] = cp
}

func (st *store) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	gvk, err := apiutil.GVKForObject(obj, st.scheme)
	if err != nil {
		return err
	}
	o, ok := st.objects[objKey{gvk: gvk, key: key}]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Group: gvk.Group, Resource: gvk.Kind}, key.Name)
	}
	reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(o.DeepCopyObject()).Elem())
	return nil
}

func (st *store) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	lgvk, err := apiutil.GVKForObject(list, st.scheme)
	if err != nil {
		return err
	}
	gvk := lgvk.GroupVersion().WithKind(lgvk.Kind[:len(lgvk.Kind)-len("List")])
	o := client.ListOptions{}
	o.ApplyOptions(opts)
	var keys []objKey
	for k := range st.objects {
		if k.gvk == gvk && (o.Namespace == "" || k.key.Namespace == o.Namespace) {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].key.String() < keys[j].key.String() })
	var items []runtime.Object
	for _, k := range keys {
		obj := st.objects[k]
		if o.LabelSelector != nil && !o.LabelSelector.Matches(labelsOf(obj)) {
			continue
		}
		if o.FieldSelector != nil && !o.FieldSelector.Empty() {
			match := true
			for _, r := range o.FieldSelector.Requirements() {
				fn := st.indexes[gvk][r.Field]
				if fn == nil {
					return fmt.Errorf("no index %s on %s", r.Field, gvk.Kind)
				}
				if !slices.Contains(fn(obj), r.Value) {
					match = false
				}
			}
			if !match {
				continue
			}
		}
		items = append(items, obj.DeepCopyObject())
	}
	return apimeta.SetList(list, items)
}
