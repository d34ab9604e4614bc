package simulation

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"k8s.io/utils/clock"
)

// The scheduler runs one goroutine at a time: itself, or one task (a reconcile, a
// process's start-up sweep). A task runs until its next call (an API read or write, an
// IPAM-API request, a sleep), parks there and hands the baton back; the scheduler then
// decides what happens next. Everything that is nondeterministic in production is a
// draw from rng.
type sched struct {
	rng     *rand.Rand
	clock   *simClock
	parked  chan *task
	current *task
	tasks   []*task // live tasks, in creation order
	nextID  int
	trace   []string
	// seen counts every step, for the trace.
	seen int
}

// point is where a task is parked: what it is about to do.
type point struct {
	kind pointKind
	what string
}

type pointKind int

const (
	pointStart pointKind = iota
	pointRead
	pointWrite
	pointIPAM
	pointSleep
)

// verdict is what the scheduler tells a task it resumes: go on, or the fault to meet.
type verdict struct{ fault fault }

type fault int

const (
	noFault          fault = iota
	faultDied              // the process died: nothing lands
	faultDieAfter          // the write lands, then the process dies
	faultConflict          // the write is refused with a conflict
	faultLost              // the IPAM-API request is carried out, its answer lost
	faultHeld              // the IPAM-API request stalls: carried out later, its answer lost
	faultDropped           // the IPAM-API request never reaches the server
	fault5xx               // the IPAM-API answers 503 without doing anything
	faultNetBox            // the IPAM-API's NetBox is down: 400 failed to fetch zones
	faultInvalidZone       // NetBox answers a zone list without the zone: 400 invalid zone
)

func (f fault) String() string {
	return [...]string{"", "died", "die-after", "conflict", "lost", "held", "dropped", "503", "netbox-down", "invalid-zone"}[f]
}

type task struct {
	id     int
	name   string
	proc   *process
	resume chan verdict
	point  point
	wakeAt time.Time // a sleeping task may go on from then
	done   bool
	onDone func()
}

func newSched(seed uint64, start time.Time) *sched {
	s := &sched{rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), parked: make(chan *task)}
	s.clock = &simClock{s: s, now: start}
	return s
}

// spawn makes a task of fn; it runs when the scheduler first picks it.
func (s *sched) spawn(proc *process, name string, fn func(), onDone func()) *task {
	s.nextID++
	t := &task{id: s.nextID, name: name, proc: proc, resume: make(chan verdict), point: point{kind: pointStart}, onDone: onDone}
	s.tasks = append(s.tasks, t)
	go func() {
		<-t.resume
		defer func() {
			t.done = true
			s.parked <- t
		}()
		fn()
	}()
	return t
}

// run hands the baton to t until it parks again or ends.
func (s *sched) run(t *task, v verdict) {
	s.current = t
	t.resume <- v
	var back *task
	select {
	case back = <-s.parked:
	case <-time.After(time.Minute):
		panic(fmt.Sprintf("task %s neither parked at its next call nor ended within a minute: it waits for something outside "+
			"the scheduler (a lock another parked task holds across a call?)", t.name))
	}
	s.current = nil
	if back != t {
		panic(fmt.Sprintf("task %s parked while %s held the baton", back.name, t.name))
	}
	if t.done {
		s.tasks = removeTask(s.tasks, t)
		if t.onDone != nil {
			t.onDone()
		}
	}
}

func removeTask(ts []*task, t *task) []*task {
	for i, x := range ts {
		if x == t {
			return append(ts[:i:i], ts[i+1:]...)
		}
	}
	return ts
}

// yield parks the calling task at p and returns the fault the scheduler chose for it.
// Called from the scheduler itself (event handlers, users, the oracle), it returns at
// once.
func (s *sched) yield(p point) fault {
	t := s.current
	if t == nil {
		return noFault
	}
	if t.proc != nil && t.proc.dead {
		return faultDied
	}
	t.point = p
	s.parked <- t
	v := <-t.resume
	if t.proc != nil && t.proc.dead {
		return faultDied
	}
	return v.fault
}

// ready lists the tasks that may go on now.
func (s *sched) ready() []*task {
	var out []*task
	for _, t := range s.tasks {
		if t.point.kind != pointSleep || !s.clock.now.Before(t.wakeAt) {
			out = append(out, t)
		}
	}
	return out
}

// chance is true with probability p.
func (s *sched) chance(p float64) bool { return s.rng.Float64() < p }

// pick is one of n, uniformly.
func (s *sched) pick(n int) int { return s.rng.IntN(n) }

func (s *sched) log(format string, args ...any) {
	s.seen++
	s.trace = append(s.trace, fmt.Sprintf("%5d %8s  ", s.seen, s.clock.elapsed())+fmt.Sprintf(format, args...))
}

// tail is the last n lines of the trace.
func (s *sched) tail(n int) []string {
	if len(s.trace) <= n {
		return s.trace
	}
	return s.trace[len(s.trace)-n:]
}

// simClock is virtual time: it moves only when the scheduler moves it. It serves as the
// wall clock and as the monotonic clock of every process, and as the stand-in's clock.
type simClock struct {
	s     *sched
	now   time.Time
	start time.Time
}

var _ clock.WithTicker = &simClock{}

func (c *simClock) Now() time.Time                  { return c.now }
func (c *simClock) Since(t time.Time) time.Duration { return c.now.Sub(t) }

func (c *simClock) elapsed() time.Duration {
	if c.start.IsZero() {
		c.start = c.now
	}
	return c.now.Sub(c.start).Truncate(time.Millisecond)
}

// Sleep parks the calling task until virtual time has moved by d.
func (c *simClock) Sleep(d time.Duration) {
	t := c.s.current
	if t == nil || d <= 0 {
		return
	}
	t.wakeAt = c.now.Add(d)
	c.s.yield(point{kind: pointSleep, what: "sleep " + d.String()})
}

func (c *simClock) After(time.Duration) <-chan time.Time { panic("simClock.After is not simulated") }
func (c *simClock) NewTimer(time.Duration) clock.Timer   { panic("simClock.NewTimer is not simulated") }
func (c *simClock) Tick(time.Duration) <-chan time.Time  { panic("simClock.Tick is not simulated") }
func (c *simClock) NewTicker(time.Duration) clock.Ticker {
	panic("simClock.NewTicker is not simulated")
}

// sortedTimes sorts the moments something is due (a sleeping task's wake-up, a queued
// item's delay, a held request's landing), earliest first.
func sortedTimes(ts []time.Time) []time.Time {
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	return ts
}
