package note

import (
	"fmt"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

// EventLimit is the longest note the API server accepts on an event (events.k8s.io/v1
// validation): it refuses a longer one, and the event never shows.
const EventLimit = 1024

// ConditionLimit is the longest condition message the provider writes: the API server
// refuses a status with a message over 32,768 characters (metav1.Condition), which an
// IPAM-API's error body (read up to 1 MiB) can be, and a few KiB say all a reader needs.
const ConditionLimit = 4096

// Truncate cuts s to at most n bytes, on a rune boundary, ending in "…" when it cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	n -= len("…")
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:max(n, 0)] + "…"
}

// Capped records events with their notes cut to EventLimit.
func Capped(r events.EventRecorder) events.EventRecorder { return capped{r} }

type capped struct{ events.EventRecorder }

func (c capped) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	c.EventRecorder.Eventf(regarding, related, eventtype, reason, action, "%s", Truncate(fmt.Sprintf(note, args...), EventLimit))
}
