package registrar

import (
	"maps"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
)

// Protected is the set of Secret keys the Secret protector has protected and
// fingerprinted, so it is not enqueued again for every record that names them. A read
// of a Secret that finds it not ready drops it, and the next record that names it
// enqueues the protector again. The zero value is empty and ready to use.
type Protected struct {
	mu   sync.Mutex
	keys map[types.NamespacedName]map[string]bool
	// changed is, by Secret, the keys whose value the protector last found changed
	// since their fingerprint was taken (absent: not looked at since this process
	// started, or let go).
	changed map[types.NamespacedName]map[string]bool
}

// Has reports whether ref's Secret key was protected.
func (p *Protected) Has(ref record.ObjectRef) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.keys[ref.ObjectKey()][ref.Key]
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

// Set records the keys of a Secret that are protected now (none: it is not).
func (p *Protected) Set(secret types.NamespacedName, keys []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(keys) == 0 {
		delete(p.keys, secret)
		return
	}
	if p.keys == nil {
		p.keys = map[types.NamespacedName]map[string]bool{}
	}
	m := map[string]bool{}
	for _, k := range keys {
		m[k] = true
	}
	p.keys[secret] = m
}
