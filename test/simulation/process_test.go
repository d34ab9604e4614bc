package simulation

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"
	"unsafe"

	"github.com/go-logr/logr"
	"github.com/pkg/errors"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/controllers/secret"
	vmanager "github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
)

// watched is what a process's cache holds (the manager's informers); other kinds
// (Secrets, ConfigMaps) are read from the API server, as the provider's RBAC allows.
var watched = map[string]bool{"Namespace": true, "Service": true, "Cluster": true, "GlobalVitistackIPPool": true,
	"VitistackIPPool": true, "IPAddressClaim": true, "IPAddress": true}

var errDied = errors.New("the process died here")

// process is one run of the manager: its controllers as internal/manager.Setup wires them,
// on a cache fed by the simulation's watch events. A crash drops all of it.
type process struct {
	w      *world
	id     int
	dead   bool
	ctx    context.Context
	cancel context.CancelFunc

	store     *store
	pending   map[schema.GroupVersionKind][]watchEvent // not yet delivered, per kind, in order
	informers map[schema.GroupVersionKind]*informer
	ctrls     []*controller
}

type watchEvent struct {
	k        objKey
	old, new client.Object
}

// controller is a controller's reconciler, work queue and number of workers.
type controller struct {
	name    string
	do      reconcile.Reconciler
	q       *queue
	workers int
	busy    int
}

// start builds a process: the provider's wiring on a manager of the simulation, a
// cache listing what the API server has now, and every object's Add event handed to
// the watches, as an informer's initial list is before a controller's workers start.
func (w *world) startProcess() *process {
	w.procs++
	p := &process{w: w, id: w.procs, store: newStore(w.cluster.scheme), pending: map[schema.GroupVersionKind][]watchEvent{},
		informers: map[schema.GroupVersionKind]*informer{}}
	p.ctx, p.cancel = context.WithCancel(ctrl.LoggerInto(context.Background(), logr.Discard()))
	mgr := &fakeManager{p: p}
	mgr.client = p.client()
	mgr.reader = p.apiReader()
	opts := w.options
	opts.Monotonic = w.s.clock
	opts.Clock = w.s.clock
	opts.Clients = w.ipam
	if err := vmanager.Setup(p.ctx, mgr, opts); err != nil {
		panic(err)
	}
	for _, k := range w.cluster.all() {
		if watched[k.gvk.Kind] {
			p.store.set(k, w.cluster.objects[k])
		}
	}
	done, cancel := context.WithCancel(p.ctx)
	cancel() // raw sources that poll on their own (the ledger's sweep) do nothing: the simulation sweeps
	for _, r := range mgr.added {
		c, ok := controllerOf(r)
		if !ok {
			continue
		}
		sc := &controller{name: c.name, do: c.do, workers: max(c.workers, 1), q: newQueue(w.s.clock, c.limiter)}
		for _, src := range c.sources {
			if syncing, ok := src.(source.TypedSyncingSource[reconcile.Request]); ok && strings.HasPrefix(fmt.Sprintf("%T", src), "*internal.Kind") {
				if err := syncing.Start(p.ctx, sc.q); err != nil {
					panic(err)
				}
				if err := syncing.WaitForSync(p.ctx); err != nil {
					panic(err)
				}
				continue
			}
			if err := src.Start(done, sc.q); err != nil {
				panic(err)
			}
		}
		p.ctrls = append(p.ctrls, sc)
	}
	sort.Slice(p.ctrls, func(i, j int) bool { return p.ctrls[i].name < p.ctrls[j].name })
	for _, k := range w.cluster.all() {
		if inf := p.informers[k.gvk]; inf != nil {
			inf.add(w.cluster.objects[k])
		}
	}
	w.cluster.procs = append(w.cluster.procs, p)
	// The ledger's sweep (secret.Ledger.Sweep): every listed Secret is looked at again.
	ledger := &secret.Ledger{Reader: mgr.reader, Key: types.NamespacedName{Namespace: w.options.DefaultSecretNamespace, Name: secret.LedgerName}}
	protector, bundles := p.controller("secret-protector"), p.controller("ca-bundle-protector")
	w.s.spawn(p, fmt.Sprintf("p%d ledger sweep", p.id), func() {
		entries, err := ledger.List(p.ctx)
		if err != nil {
			return // the next process sweeps; a live one keeps its Secrets by events
		}
		for _, e := range entries {
			if secret.IsCABundleEntry(e) {
				bundles.q.Add(reconcile.Request{NamespacedName: e})
			} else {
				protector.q.Add(reconcile.Request{NamespacedName: e})
			}
		}
	}, nil)
	return p
}

func (p *process) controller(name string) *controller {
	for _, c := range p.ctrls {
		if c.name == name {
			return c
		}
	}
	panic("no controller " + name)
}

// crash ends the process: its tasks fail every call from now on.
func (p *process) crash() {
	p.dead = true
	p.cancel()
	procs := p.w.cluster.procs[:0]
	for _, q := range p.w.cluster.procs {
		if q != p {
			procs = append(procs, q)
		}
	}
	p.w.cluster.procs = procs
}

// enqueueEvent queues a watch event for delivery, if the process watches the kind.
func (p *process) enqueueEvent(k objKey, old, new client.Object) {
	if !watched[k.gvk.Kind] {
		return
	}
	p.pending[k.gvk] = append(p.pending[k.gvk], watchEvent{k: k, old: old, new: new})
}

// pendingKinds is the kinds with events to deliver, sorted.
func (p *process) pendingKinds() []schema.GroupVersionKind {
	var out []schema.GroupVersionKind
	for gvk, evs := range p.pending {
		if len(evs) > 0 {
			out = append(out, gvk)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kind < out[j].Kind })
	return out
}

// deliver hands the next event of a kind to the cache and to the watches.
func (p *process) deliver(gvk schema.GroupVersionKind) watchEvent {
	ev := p.pending[gvk][0]
	p.pending[gvk] = p.pending[gvk][1:]
	p.store.set(ev.k, ev.new)
	if inf := p.informers[gvk]; inf != nil {
		switch {
		case ev.old == nil:
			inf.add(ev.new)
		case ev.new == nil:
			inf.del(ev.old)
		default:
			inf.update(ev.old, ev.new)
		}
	}
	return ev
}

// reconcile is a worker's turn: one reconcile of item, then the queue as
// controller-runtime's reconcileHandler leaves it.
func (p *process) reconcile(c *controller, item reconcile.Request) {
	c.q.take(item)
	c.busy++
	name := fmt.Sprintf("p%d %s %s", p.id, c.name, item.NamespacedName)
	p.w.s.spawn(p, name, func() {
		ctx, cancel := context.WithTimeout(p.ctx, time.Hour)
		defer cancel()
		res, err := c.do.Reconcile(ctx, item)
		if p.dead {
			return
		}
		switch {
		case err != nil:
			if errors.Is(err, reconcile.TerminalError(nil)) {
				c.q.Forget(item)
			} else {
				c.q.AddRateLimited(item)
			}
			p.w.s.log("  %s: %v", name, shorten(err.Error()))
		case res.RequeueAfter > 0:
			c.q.Forget(item)
			c.q.AddAfter(item, res.RequeueAfter)
		case res.Requeue: //nolint:staticcheck // as controller-runtime does
			c.q.AddRateLimited(item)
		default:
			c.q.Forget(item)
		}
	}, func() {
		c.busy--
		c.q.Done(item)
	})
}

func shorten(s string) string {
	if len(s) > 240 {
		return s[:240] + "…"
	}
	return s
}

// client is the manager's client: reads from the cache (the watched kinds) or the API
// server, writes to the API server; each call is a step of the scheduler, and a write
// may meet a fault.
func (p *process) client() client.Client {
	c := p.w.cluster
	// A read of the cache stays in the process: no step (a lock held across one, as the
	// in-flight table holds its own, is fine). A read of another kind goes to the API server.
	read := func(ctx context.Context, what string, obj runtime.Object, cached func() error, direct func() error) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if p.dead {
			return errDied
		}
		gvk, _ := c.gvkOf(obj)
		if watched[strings.TrimSuffix(gvk.Kind, "List")] {
			return cached()
		}
		if f := p.w.s.yield(point{kind: pointRead, what: "uncached " + what}); f == faultDied {
			return errDied
		}
		return direct()
	}
	return interceptor.NewClient(c.direct, interceptor.Funcs{
		Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			what := "get " + kindOf(c, obj) + " " + key.String()
			return read(ctx, what, obj, func() error {
				err := p.store.Get(ctx, key, obj)
				if _, addr := obj.(*ipamv1.IPAddress); addr && apierrors.IsNotFound(err) {
					// ipamutil's claim loop polls the cache for the IPAddress it created, on
					// the host's clock: a miss parks the task, so that the scheduler can
					// deliver the event it waits for.
					if f := p.w.s.yield(point{kind: pointRead, what: "cache miss, " + what}); f == faultDied {
						return errDied
					}
				}
				return err
			}, func() error { return cl.Get(ctx, key, obj, opts...) })
		},
		List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			return read(ctx, "list "+kindOf(c, list), list,
				func() error { return p.store.List(ctx, list, opts...) }, func() error { return cl.List(ctx, list, opts...) })
		},
		Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			return p.write(ctx, "create", obj, func() error {
				if err := c.admit(ctx, obj); err != nil {
					return err
				}
				return cl.Create(ctx, obj, opts...)
			})
		},
		Update: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			return p.write(ctx, "update", obj, func() error { return cl.Update(ctx, obj, opts...) })
		},
		Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			return p.write(ctx, "patch", obj, func() error { return cl.Patch(ctx, obj, patch, opts...) })
		},
		Delete: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			return p.write(ctx, "delete", obj, func() error { return cl.Delete(ctx, obj, opts...) })
		},
		SubResourcePatch: func(ctx context.Context, cl client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			return p.write(ctx, "patch "+sub+" of", obj, func() error { return cl.SubResource(sub).Patch(ctx, obj, patch, opts...) })
		},
		SubResourceUpdate: func(ctx context.Context, cl client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			return p.write(ctx, "update "+sub+" of", obj, func() error { return cl.SubResource(sub).Update(ctx, obj, opts...) })
		},
	})
}

// apiReader reads the API server, uncached, as the manager's APIReader does.
func (p *process) apiReader() client.Reader {
	c := p.w.cluster
	return interceptor.NewClient(c.direct, interceptor.Funcs{
		Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			if f := p.w.s.yield(point{kind: pointRead, what: "uncached get " + kindOf(c, obj) + " " + key.String()}); f == faultDied {
				return errDied
			}
			return cl.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			if f := p.w.s.yield(point{kind: pointRead, what: "uncached list " + kindOf(c, list)}); f == faultDied {
				return errDied
			}
			return cl.List(ctx, list, opts...)
		},
	})
}

// write is one write of the process: a step, then the fault the scheduler chose.
func (p *process) write(ctx context.Context, verb string, obj client.Object, do func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c := p.w.cluster
	what := verb + " " + kindOf(c, obj) + " " + client.ObjectKeyFromObject(obj).String()
	switch p.w.s.yield(point{kind: pointWrite, what: what}) {
	case faultDied:
		return errDied
	case faultConflict:
		p.w.s.log("  fault: conflict on %s", what)
		return apierrors.NewConflict(schema.GroupResource{Resource: kindOf(c, obj)}, obj.GetName(), errors.New("injected by the simulation"))
	case faultDieAfter:
		err := do()
		c.changed(c.keyOf(obj))
		p.w.s.log("  fault: p%d dies after %s (%v)", p.id, what, err)
		p.w.crash(p)
		return errDied
	}
	err := do()
	c.changed(c.keyOf(obj))
	if err != nil {
		p.w.s.log("  %s: %v", what, shorten(err.Error()))
	}
	return err
}

func (c *cluster) gvkOf(obj runtime.Object) (schema.GroupVersionKind, error) {
	gvks, _, err := c.scheme.ObjectKinds(obj)
	if err != nil || len(gvks) == 0 {
		return schema.GroupVersionKind{}, err
	}
	return gvks[0], nil
}

func kindOf(c *cluster, obj runtime.Object) string {
	gvk, _ := c.gvkOf(obj)
	return gvk.Kind
}

func labelsOf(o client.Object) labels.Set { return labels.Set(o.GetLabels()) }

// fakeManager is the manager internal/manager.Setup wires the provider on. A method the
// simulation does not provide panics (the nil Manager), so a new dependency of the wiring
// shows at once.
type fakeManager struct {
	manager.Manager
	p      *process
	client client.Client
	reader client.Reader
	added  []manager.Runnable
}

func (m *fakeManager) Add(r manager.Runnable) error                 { m.added = append(m.added, r); return nil }
func (m *fakeManager) GetScheme() *runtime.Scheme                   { return m.p.w.cluster.scheme }
func (m *fakeManager) GetClient() client.Client                     { return m.client }
func (m *fakeManager) GetAPIReader() client.Reader                  { return m.reader }
func (m *fakeManager) GetCache() cache.Cache                        { return &fakeCache{p: m.p} }
func (m *fakeManager) GetFieldIndexer() client.FieldIndexer         { return &fakeCache{p: m.p} }
func (m *fakeManager) GetLogger() logr.Logger                       { return logr.Discard() }
func (m *fakeManager) GetRESTMapper() meta.RESTMapper               { return m.p.w.mapper }
func (m *fakeManager) GetEventRecorder(string) events.EventRecorder { return m.p.w.recorder }
func (m *fakeManager) GetControllerOptions() config.Controller {
	c := vmanager.ControllerConfig()
	c.SkipNameValidation = ptr.To(true) // every process registers the same names
	return c
}

// fakeCache gives the watches informers the simulation feeds.
type fakeCache struct {
	cache.Cache
	p *process
}

func (c *fakeCache) GetInformer(_ context.Context, obj client.Object, _ ...cache.InformerGetOption) (cache.Informer, error) {
	gvk, err := c.p.w.cluster.gvkOf(obj)
	if err != nil {
		return nil, err
	}
	inf := c.p.informers[gvk]
	if inf == nil {
		inf = &informer{}
		c.p.informers[gvk] = inf
	}
	return inf, nil
}

func (c *fakeCache) IndexField(context.Context, client.Object, string, client.IndexerFunc) error {
	return nil // the store has every index of internal/index
}

func (c *fakeCache) WaitForCacheSync(context.Context) bool { return true }

// informer hands each event to the watches' handlers, on the scheduler's goroutine.
type informer struct {
	cache.Informer
	handlers []toolscache.ResourceEventHandler
}

func (i *informer) AddEventHandlerWithOptions(h toolscache.ResourceEventHandler, _ toolscache.HandlerOptions) (toolscache.ResourceEventHandlerRegistration, error) {
	i.handlers = append(i.handlers, h)
	return registration{}, nil
}

func (i *informer) AddEventHandler(h toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error) {
	return i.AddEventHandlerWithOptions(h, toolscache.HandlerOptions{})
}

func (i *informer) HasSynced() bool { return true }

func (i *informer) add(o client.Object) {
	for _, h := range i.handlers {
		h.OnAdd(o.DeepCopyObject(), false)
	}
}

func (i *informer) update(old, new client.Object) {
	for _, h := range i.handlers {
		h.OnUpdate(old.DeepCopyObject(), new.DeepCopyObject())
	}
}

func (i *informer) del(o client.Object) {
	for _, h := range i.handlers {
		h.OnDelete(o.DeepCopyObject())
	}
}

type registration struct{}

func (registration) HasSynced() bool                          { return true }
func (registration) HasSyncedChecker() toolscache.DoneChecker { return synced{} }

type synced struct{}

func (synced) Name() string          { return "simulation" }
func (synced) Done() <-chan struct{} { c := make(chan struct{}); close(c); return c }

// capturedController is what the simulation takes from a controller-runtime controller
// that the provider's builders made: its name, reconciler (under Cluster API's wrapper,
// which rate-limits on the host's clock), workers, rate limiter and watches.
type capturedController struct {
	name    string
	do      reconcile.Reconciler
	workers int
	limiter workqueue.TypedRateLimiter[reconcile.Request]
	sources []source.TypedSource[reconcile.Request]
}

func controllerOf(r manager.Runnable) (capturedController, bool) {
	v := reflect.ValueOf(r)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct || v.Elem().FieldByName("startWatches").Kind() != reflect.Slice {
		return capturedController{}, false
	}
	e := v.Elem()
	field := func(name string) reflect.Value {
		f := e.FieldByName(name)
		return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
	}
	c := capturedController{
		name:    field("Name").String(),
		do:      field("Do").Interface().(reconcile.Reconciler),
		workers: int(field("MaxConcurrentReconciles").Int()),
		sources: field("startWatches").Interface().([]source.TypedSource[reconcile.Request]),
	}
	if l, ok := field("RateLimiter").Interface().(workqueue.TypedRateLimiter[reconcile.Request]); ok {
		c.limiter = l
	}
	// Cluster API's builder wraps the reconciler: at most one reconcile a second per object,
	// timed on the host's clock, and a wait for the cache. The simulation runs the provider's.
	if w := reflect.ValueOf(c.do); w.Kind() == reflect.Pointer && strings.HasSuffix(w.Elem().Type().Name(), "reconcilerWrapper") {
		f := w.Elem().FieldByName("reconciler")
		c.do = reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface().(reconcile.Reconciler)
		c.limiter = nil // Cluster API's limiter adds its second on the host's clock
	}
	return c, true
}

// restMapper knows the scope of every kind the provider watches or owns.
func restMapper(scheme *runtime.Scheme) meta.RESTMapper {
	m := meta.NewDefaultRESTMapper(nil)
	cluster := map[string]bool{"Namespace": true, "GlobalVitistackIPPool": true}
	for gvk := range scheme.AllKnownTypes() {
		scope := meta.RESTScopeNamespace
		if cluster[gvk.Kind] {
			scope = meta.RESTScopeRoot
		}
		m.Add(gvk, scope)
	}
	return m
}

func (i *informer) AddIndexers(toolscache.Indexers) error { return nil } // the store has every index
