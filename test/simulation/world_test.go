package simulation

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmanager "github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// Budget of one seed.
type budget struct {
	// users is how many user actions the run makes, spread over its chaos phase.
	users int
	// crashes is how many times the process may die.
	crashes int
	// settle is how long (virtual) everything has after the last fault to settle.
	settle time.Duration
	// steps bounds the whole run: a run that does not end in it hot-loops.
	steps int
}

var defaultBudget = budget{users: 40, crashes: 3, settle: 20 * time.Minute, steps: 60000}

// world is one seeded run: the cluster, the IPAM-API, the live process, the users.
type world struct {
	t        testing.TB
	seed     uint64
	s        *sched
	cluster  *cluster
	ipam     *ipam
	options  vmanager.Options
	mapper   meta.RESTMapper
	recorder events.EventRecorder
	budget   budget

	procs   int
	proc    *process // the live one; nil after a crash, until the next starts
	crashes int
	users   int // user actions made
	chaos   bool
	// refused: deletes of the namespace controller that admission refused, and when it
	// tries again.
	refused map[objKey]time.Time
	// looked is the count of changes when the oracle last looked; settled is what it found.
	looked  int
	settled bool
	// recreate: claims a user deleted, to create again once their name is free, not before
	// the time each is due.
	recreate []*ipamv1.IPAddressClaim
	due      map[*ipamv1.IPAddressClaim]time.Time
	// moves counts each Service's moves: a user gives up after two (a third, back to an
	// earlier pool, would undo what a stuck second move left behind).
	moves map[types.UID]int
	// failed is the first failure; calmAt is when the chaos phase ended.
	failed  string
	calmAt  time.Time
	actions []userAction
}

func newWorld(t testing.TB, seed uint64, b budget) *world {
	s := newSched(seed, time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC))
	w := &world{t: t, seed: seed, s: s, budget: b, chaos: true, refused: map[objKey]time.Time{}, due: map[*ipamv1.IPAddressClaim]time.Time{},
		moves: map[types.UID]int{}}
	w.cluster = newCluster(s)
	w.ipam = &ipam{w: w, api: sim.New(sim.Config{Clock: s.clock, RandSeed: seed + 1})}
	w.mapper = restMapper(w.cluster.scheme)
	w.recorder = &recorder{w: w}
	w.options = vmanager.Options{
		IPAMAPIURL:              "http://ipam-api.simulation",
		IPAMAPITimeout:          10 * time.Second,
		IPAMAPIQuarantine:       time.Minute,
		ClusterID:               "sim-cluster",
		DefaultSecretNamespace:  "ipam-system",
		DefaultSecretName:       "default",
		MaxConcurrentReconciles: 2,
		PoolProbeInterval:       5 * time.Minute,
		SubnetRecheckInterval:   time.Minute,
		SecretRecheckInterval:   time.Minute,
		EnableServiceController: true,
		ExcludedNamespaces:      vmanager.DefaultExcludedNamespaces(),
		DefaultZone:             "inet",
	}
	w.actions = userActions()
	w.setUp()
	w.proc = w.startProcess()
	return w
}

// run makes the seed's run: chaos until the users' budget is spent, then calm until
// everything settles. It returns the first failure ("" if none).
func (w *world) run() string {
	for w.failed == "" {
		if w.s.seen > w.budget.steps {
			return fmt.Sprintf("no end after %d steps (a hot loop?)", w.budget.steps)
		}
		if w.chaos && w.users >= w.budget.users {
			w.chaos = false
			w.calmAt = w.s.clock.now
			w.looked = -1 // the settled oracle looks at least once
			w.s.log("the chaos ends: no more user actions or faults")
		}
		if w.step() {
			continue
		}
		// A quiet point: nothing can happen before time moves. The oracle looks again only
		// if anything changed since it last looked.
		if changed := w.cluster.changes + w.ipam.served; changed != w.looked {
			w.looked, w.settled = changed, false
			if f := w.checkSafety(); f != "" {
				return f
			}
			if !w.chaos {
				w.settled = len(w.settledProblems()) == 0
			}
		}
		if !w.chaos && w.settled {
			return ""
		}
		if !w.chaos {
			if w.s.clock.now.Sub(w.calmAt) > w.budget.settle {
				return fmt.Sprintf("nothing settles within %s of the last fault:\n  %s", w.budget.settle, strings.Join(w.settledProblems(), "\n  "))
			}
		}
		if w.chaos && w.s.chance(0.5) {
			w.userAction()
			continue
		}
		if !w.advance() {
			if w.chaos {
				w.userAction()
				continue
			}
			return "nothing left to happen, and the cluster is not settled:\n  " + strings.Join(w.settledProblems(), "\n  ")
		}
	}
	return w.failed
}

// choice is one thing that can happen now.
type choice struct {
	weight int
	do     func()
}

// step makes one thing happen that can happen now, and reports whether there was one.
func (w *world) step() bool {
	var cs []choice
	add := func(weight int, do func()) { cs = append(cs, choice{weight, do}) }
	if w.proc == nil {
		add(20, func() {
			w.proc = w.startProcess()
			w.s.log("p%d starts (a new leader)", w.proc.id)
		})
	}
	for _, t := range w.s.ready() {
		add(10, func() { w.resume(t) })
	}
	if p := w.proc; p != nil {
		for _, c := range p.ctrls {
			c.q.promote()
			if items := c.q.readyItems(); len(items) > 0 && c.busy < c.workers {
				add(6, func() {
					item := items[w.s.pick(len(items))]
					w.s.log("p%d %s takes %s", p.id, c.name, item.NamespacedName)
					p.reconcile(c, item)
				})
			}
		}
		for _, gvk := range p.pendingKinds() {
			add(8, func() {
				ev := p.deliver(gvk)
				w.s.log("p%d sees %s", p.id, describeEvent(ev))
			})
		}
	}
	if g := w.cluster.garbage(); len(g) > 0 {
		add(3, func() {
			k := g[w.s.pick(len(g))]
			w.s.log("garbage collector deletes %s", k)
			_ = w.cluster.delete(w.cluster.objects[k].DeepCopyObject().(client.Object))
		})
	}
	if n := w.terminating(); len(n) > 0 {
		add(3, func() { w.terminate(n[w.s.pick(len(n))]) })
	}
	if rs := w.recreated(); len(rs) > 0 {
		add(20, func() {
			c := rs[w.s.pick(len(rs))]
			w.recreate = slices.DeleteFunc(w.recreate, func(x *ipamv1.IPAddressClaim) bool { return x == c })
			delete(w.due, c)
			if !w.liveNamespace(c.Namespace) {
				return
			}
			if err := w.cluster.create(c.DeepCopy()); err == nil {
				w.s.log("user: creates IPAddressClaim %s/%s again %v", c.Namespace, c.Name, c.Annotations)
			}
		})
	}
	if at := w.ipam.nextLanding(); !at.IsZero() && !w.s.clock.now.Before(at) {
		add(5, func() {
			for _, l := range w.ipam.land() {
				w.s.log("%s", l)
			}
		})
	}
	if len(cs) == 0 {
		return false
	}
	total := 0
	for _, c := range cs {
		total += c.weight
	}
	n := w.s.pick(total)
	for _, c := range cs {
		if n < c.weight {
			c.do()
			return true
		}
		n -= c.weight
	}
	panic("unreachable")
}

// resume lets a parked task go on, with the fault the scheduler draws for its step.
func (w *world) resume(t *task) {
	f := noFault
	if w.chaos && t.proc != nil && !t.proc.dead {
		f = w.drawFault(t)
	}
	if f != noFault || t.point.kind == pointWrite || t.point.kind == pointIPAM {
		w.s.log("%s: %s%s", t.name, t.point.what, map[bool]string{true: " [" + f.String() + "]", false: ""}[f != noFault])
	}
	if f == faultDied {
		w.s.log("  fault: p%d dies before %s", t.proc.id, t.point.what)
		w.crash(t.proc)
	}
	w.s.run(t, verdict{fault: f})
}

// drawFault is the fault a step meets, if any.
func (w *world) drawFault(t *task) fault {
	s := w.s
	canCrash := w.crashes < w.budget.crashes
	switch t.point.kind {
	case pointWrite:
		switch r := s.rng.Float64(); {
		case r < 0.04:
			return faultConflict
		case r < 0.05 && canCrash:
			return faultDied
		case r < 0.06 && canCrash:
			return faultDieAfter
		}
	case pointIPAM:
		if strings.HasPrefix(t.point.what, "answer to ") {
			if canCrash && s.chance(0.01) {
				return faultDied
			}
			return noFault
		}
		switch r := s.rng.Float64(); {
		case r < 0.05:
			return faultLost
		case r < 0.09:
			return faultHeld
		case r < 0.11:
			return faultDropped
		case r < 0.14:
			return fault5xx
		case r < 0.17:
			return faultNetBox
		case r < 0.19:
			return faultInvalidZone
		}
	case pointRead:
		if canCrash && s.chance(0.003) {
			return faultDied
		}
	}
	return noFault
}

// crash kills the live process: its tasks fail every call from now on, and a new
// process (a new leader) starts with empty memory.
func (w *world) crash(p *process) {
	if p.dead {
		return
	}
	w.crashes++
	p.crash()
	for _, t := range w.s.tasks {
		if t.proc == p {
			t.wakeAt = time.Time{}
		}
	}
	if w.proc == p {
		w.proc = nil
	}
}

// advance moves virtual time to the next moment something is due; false if nothing is.
func (w *world) advance() bool {
	var ts []time.Time
	for _, t := range w.s.tasks {
		if t.point.kind == pointSleep && t.wakeAt.After(w.s.clock.now) {
			ts = append(ts, t.wakeAt)
		}
	}
	if p := w.proc; p != nil {
		for _, c := range p.ctrls {
			if at := c.q.next(); !at.IsZero() {
				ts = append(ts, at)
			}
		}
	}
	if at := w.ipam.nextLanding(); !at.IsZero() {
		ts = append(ts, at)
	}
	for _, at := range w.refused {
		if at.After(w.s.clock.now) {
			ts = append(ts, at)
		}
	}
	for _, at := range w.due {
		if at.After(w.s.clock.now) {
			ts = append(ts, at)
		}
	}
	if len(ts) == 0 {
		return false
	}
	next := sortedTimes(ts)[0]
	if next.After(w.s.clock.now) {
		w.s.log("time moves by %s", next.Sub(w.s.clock.now))
		w.s.clock.now = next
	}
	return true
}

// nsRetry is how soon the namespace controller tries a refused delete again.
const nsRetry = 5 * time.Second

// terminating is the namespace controller's work that may be done now.
func (w *world) terminating() []objKey {
	var out []objKey
	for _, k := range w.cluster.terminating() {
		if at, ok := w.refused[k]; !ok || !w.s.clock.now.Before(at) {
			out = append(out, k)
		}
	}
	return out
}

// terminate is one step of the namespace controller.
func (w *world) terminate(k objKey) {
	if k.gvk.Kind == "Namespace" {
		w.s.log("namespace controller: %s is empty, and goes", k.key.Name)
		_ = w.cluster.finishNamespace(k)
		return
	}
	w.s.log("namespace controller deletes %s", k)
	if err := w.admitDelete(w.cluster.objects[k]); err != nil {
		w.s.log("  refused: %v", shorten(err.Error()))
		w.refused[k] = w.s.clock.now.Add(nsRetry)
		return
	}
	_ = w.cluster.delete(w.cluster.objects[k].DeepCopyObject().(client.Object))
}

// checkSafety is the oracle at a quiet point (see safety).
func (w *world) checkSafety() string {
	if entries := w.safety(); len(entries) > 0 {
		return "at a quiet point:\n  " + strings.Join(entries, "\n  ")
	}
	return ""
}

// describe is the cluster's state, for a failure.
func (w *world) describe() string {
	var b strings.Builder
	claims := &ipamv1.IPAddressClaimList{}
	_ = w.cluster.direct.List(context.Background(), claims)
	for _, c := range claims.Items {
		fmt.Fprintf(&b, "claim %s/%s: finalizers %v deleting %v bound %q superseded-by %q record %s\n", c.Namespace, c.Name, c.Finalizers,
			!c.DeletionTimestamp.IsZero(), c.Status.AddressRef.Name, c.Annotations["ipam.vitistack.io/superseded-by"],
			c.Annotations["ipam.vitistack.io/registration"])
		for _, cond := range c.Status.Conditions {
			fmt.Fprintf(&b, "  %s=%s %s: %s\n", cond.Type, cond.Status, cond.Reason, shorten(cond.Message))
		}
	}
	addrs := &ipamv1.IPAddressList{}
	_ = w.cluster.direct.List(context.Background(), addrs)
	for _, a := range addrs.Items {
		fmt.Fprintf(&b, "IPAddress %s/%s: %s\n", a.Namespace, a.Name, a.Spec.Address)
	}
	for _, r := range w.ipam.api.Registrations() {
		for _, h := range r.Holders {
			fmt.Fprintf(&b, "IPAM-API: %s held by %s/%s/%s (expires %v)\n", r.Address, h.NamespaceID, h.ServiceName, h.ClusterID, h.ExpiresAt)
		}
	}
	secrets := &corev1.SecretList{}
	_ = w.cluster.direct.List(context.Background(), secrets)
	for _, s := range secrets.Items {
		fmt.Fprintf(&b, "Secret %s/%s: finalizers %v deleting %v\n", s.Namespace, s.Name, s.Finalizers, !s.DeletionTimestamp.IsZero())
	}
	return b.String()
}

func describeEvent(ev watchEvent) string {
	switch {
	case ev.old == nil:
		return "added " + ev.k.String()
	case ev.new == nil:
		return "deleted " + ev.k.String()
	}
	return fmt.Sprintf("updated %s (rv %s)", ev.k, ev.new.GetResourceVersion())
}

// recorder keeps no events (the simulation asserts what is recorded on objects).
type recorder struct{ w *world }

func (r *recorder) Eventf(runtime.Object, runtime.Object, string, string, string, string, ...any) {}

// seeds is the seeds to run: SIM_SEED (one, to replay), else SIM_SEEDS many from 1,
// else n.
func seeds(t testing.TB, n int) []uint64 {
	if s := os.Getenv("SIM_SEED"); s != "" {
		var seed uint64
		if _, err := fmt.Sscan(s, &seed); err != nil {
			t.Fatalf("SIM_SEED=%q: %v", s, err)
		}
		return []uint64{seed}
	}
	if s := os.Getenv("SIM_SEEDS"); s != "" {
		if _, err := fmt.Sscan(s, &n); err != nil {
			t.Fatalf("SIM_SEEDS=%q: %v", s, err)
		}
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}
