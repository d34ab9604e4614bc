package note_test

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/note"
)

func TestTruncate(t *testing.T) {
	g := NewWithT(t)
	g.Expect(note.Truncate("short", 10)).To(Equal("short"))
	g.Expect(note.Truncate("0123456789", 10)).To(Equal("0123456789"))
	cut := note.Truncate(strings.Repeat("ö", 20), 10) // 2 bytes a rune
	g.Expect(len(cut)).To(BeNumerically("<=", 10))
	g.Expect(cut).To(Equal("ööö…"))
	g.Expect(note.Truncate("abcdef", 2)).To(Equal("…"))
}

// An event's note longer than the API server takes reaches the recorder cut to the
// limit, still readable: its start and a mark that it was cut.
func TestCappedKeepsEventsWithinTheAPIServersLimit(t *testing.T) {
	g := NewWithT(t)
	fake := events.NewFakeRecorder(2)
	r := note.Capped(fake)
	long := "protecting Secret a/b: " + strings.Repeat("webhook refusal ", 200)
	r.Eventf(&corev1.Secret{}, nil, corev1.EventTypeWarning, "SecretNotProtected", "Allocate", "%s", long)
	r.Eventf(&corev1.Secret{}, nil, corev1.EventTypeNormal, "Allocated", "Allocate", "bound to %s", "10.0.0.1")
	first := <-fake.Events
	g.Expect(len(first)).To(BeNumerically("<=", len("Warning SecretNotProtected ")+note.EventLimit))
	g.Expect(first).To(HavePrefix("Warning SecretNotProtected protecting Secret a/b: webhook refusal"))
	g.Expect(first).To(HaveSuffix("…"))
	g.Expect(<-fake.Events).To(Equal("Normal Allocated bound to 10.0.0.1"))
}
