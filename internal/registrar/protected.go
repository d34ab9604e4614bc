package registrar

import (
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
)

// Protected is the set of Secret keys the Secret protector has protected and
// fingerprinted, so it is not asked again for every record that names them. A read of
// a Secret that finds it not ready drops it, and the next record that names it asks
// again. It also keeps the claims that wait for a key to be protected (Await), for the
// protector to wake. The zero value is empty and ready to use.
type Protected struct {
	// Ask takes the Secrets that claims wait for to the Secret protector; nil: nobody
	// is asked (the protector is enqueued by records only).
	Ask chan event.GenericEvent
	// Clock times the waits for a Secret's protection and its first record (nil: the
	// host's monotonic clock).
	Clock clock.PassiveClock

	mu   sync.Mutex
	keys map[types.NamespacedName]map[string]bool
	// changed is, by Secret, the keys whose value the protector last found changed
	// since their fingerprint was taken (absent: not looked at since this process
	// started, or let go).
	changed map[types.NamespacedName]map[string]bool
	waiting map[types.NamespacedName]*waiters
	// recording is, by Secret key, the claim of this process that writes the first
	// record naming it, and since when.
	recording map[string]recorder
	// failures is the protector's last failure to look at a Secret, by Secret.
	failures map[types.NamespacedName]error
}

type recorder struct {
	claim types.UID
	since time.Time
}

// recordingFor is how long the other claims wait for the first claim's record to ask
// for a Secret key's protection before each writes its own.
const recordingFor = 5 * time.Second

// waiters are the claims that wait for keys of one Secret to be protected.
type waiters struct {
	// claims maps each claim to the key it waits for.
	claims map[types.NamespacedName]string
	// asked is when the protector was last asked to look at the Secret; since is when
	// the first of the claims began to wait, last when one last did.
	asked, since, last time.Time
}

// staleWait ends a wait for a Secret that no claim has renewed for this long (a waiting
// claim looks again at least once a minute): a claim that waits for it later starts a
// new wait, and the claims of the old one (deleted since) are forgotten.
const staleWait = 2 * time.Minute

// askAgain is how often the claims waiting for a Secret ask the protector again.
const askAgain = time.Second

// Has reports whether ref's Secret key was protected.
func (p *Protected) Has(ref record.ObjectRef) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.keys[ref.ObjectKey()][ref.Key]
}

// RecordedByAnother reports whether another claim of this process has started, in the
// last few seconds, to write the first record naming ref's Secret key (not protected
// yet). If not, claim is that claim from now on.
func (p *Protected) RecordedByAnother(ref record.ObjectRef, claim types.UID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.recording[ref.String()]; ok && r.claim != claim && p.now().Sub(r.since) < recordingFor {
		return true
	}
	if p.recording == nil {
		p.recording = map[string]recorder{}
	}
	p.recording[ref.String()] = recorder{claim: claim, since: p.now()}
	return false
}

// Await records that claim waits for ref's Secret key to be protected, and asks the
// protector to look at the Secret (once a second at most, whoever waits). It reports
// for how long claims have waited for the Secret, or protected, recording nothing, when
// the key is protected already. The claims are handed out by the Set that protects the
// key.
func (p *Protected) Await(ref record.ObjectRef, claim types.NamespacedName) (waited time.Duration, protected bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	secret := ref.ObjectKey()
	if p.keys[secret][ref.Key] {
		return 0, true
	}
	now := p.now()
	if p.waiting == nil {
		p.waiting = map[types.NamespacedName]*waiters{}
	}
	w := p.waiting[secret]
	if w == nil || now.Sub(w.last) > staleWait {
		w = &waiters{claims: map[types.NamespacedName]string{}, since: now}
		p.waiting[secret] = w
	}
	w.claims[claim], w.last = ref.Key, now
	if p.Ask != nil && now.Sub(w.asked) >= askAgain {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secret.Namespace, Name: secret.Name}}
		select {
		case p.Ask <- event.GenericEvent{Object: s}:
			w.asked = now
		default: // full: the next claim to wait asks again
		}
	}
	return now.Sub(w.since), false
}

func (p *Protected) now() time.Time {
	if p.Clock == nil {
		return time.Now()
	}
	return p.Clock.Now()
}

// Changed reports what the protector's last look at ref's Secret found: whether the
// value of the key differs from its fingerprint (changed in place after addresses were
// registered under it), and whether it has looked at the Secret since this process
// started (known).
func (p *Protected) Changed(ref record.ObjectRef) (changed, known bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys, known := p.changed[ref.ObjectKey()]
	return keys[ref.Key], known
}

// SetChanged records the keys of a Secret whose value the protector found changed
// (nil, with protected false: the Secret is let go), and reports whether that differs
// from what it found the time before, which the claims bound under the Secret show.
func (p *Protected) SetChanged(secret types.NamespacedName, changed []string, protected bool) (differs bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	before, known := p.changed[secret]
	if !protected {
		delete(p.changed, secret)
		return known && len(before) > 0
	}
	now := map[string]bool{}
	for _, k := range changed {
		now[k] = true
	}
	if p.changed == nil {
		p.changed = map[types.NamespacedName]map[string]bool{}
	}
	p.changed[secret] = now
	return !maps.Equal(before, now) && (known || len(now) > 0)
}

// Set records the keys of a Secret that are protected now (none: it is not), and
// returns the claims that waited for one of them.
func (p *Protected) Set(secret types.NamespacedName, keys []string) []types.NamespacedName {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(keys) == 0 {
		delete(p.keys, secret)
		return nil
	}
	if p.keys == nil {
		p.keys = map[types.NamespacedName]map[string]bool{}
	}
	m := map[string]bool{}
	for _, k := range keys {
		m[k] = true
	}
	p.keys[secret] = m
	for _, k := range keys {
		delete(p.recording, record.ObjectRef{Namespace: secret.Namespace, Name: secret.Name, Key: k}.String())
	}
	var woken []types.NamespacedName
	if w := p.waiting[secret]; w != nil {
		for c, k := range w.claims {
			if m[k] {
				woken = append(woken, c)
				delete(w.claims, c)
			}
		}
		if len(w.claims) == 0 {
			delete(p.waiting, secret)
		}
	}
	return woken
}

// Tried records how the protector's last look at a Secret ended (nil: it did not
// fail), for the claims that wait for it to say why they still do (Failure).
func (p *Protected) Tried(secret types.NamespacedName, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		delete(p.failures, secret)
		return
	}
	if p.failures == nil || len(p.failures) > 1024 {
		p.failures = map[types.NamespacedName]error{}
	}
	p.failures[secret] = err
}

// Failure is the protector's last failure to look at a Secret, if its last look
// failed.
func (p *Protected) Failure(secret types.NamespacedName) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failures[secret]
}
