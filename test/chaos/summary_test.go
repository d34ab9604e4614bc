package chaos_test

import (
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/test/chaos"
)

// Rows recorded by one suite are read back by another through the CHAOS_ROWS file,
// and rendered one line each.
func TestRowsGoThroughTheFile(t *testing.T) {
	g := NewWithT(t)
	t.Setenv("CHAOS_ROWS", filepath.Join(t.TempDir(), "sub", "rows.jsonl"))
	t.Setenv("E2E_CHAOS", "full")
	t.Setenv("CHAOS_COMMIT", "0123abc")
	g.Expect(chaos.Record(chaos.Row{Scenario: "clock", Claims: 400, Faults: 41, Duration: 90 * time.Second})).To(Succeed())
	g.Expect(chaos.Record(chaos.Row{Scenario: "kill", Detail: "3 while binding, 2 while deleting", Claims: 1000, Services: 50, Kills: 5, Leaked: 1})).To(Succeed())
	failed := chaos.Row{Scenario: "restart", Failed: true, Claims: 40}
	failed.SetAccounts(chaos.Accounts{Stuck: []string{"a", "b"}, Protections: []string{"c"}, Mismatched: []string{"d"}})
	g.Expect(chaos.Record(failed)).To(Succeed())
	rows, err := chaos.Rows()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rows).To(HaveLen(3))
	g.Expect(rows[0].Zero()).To(BeTrue())
	g.Expect(rows[1].Zero()).To(BeFalse())
	g.Expect(rows[2].Zero()).To(BeFalse())
	table := chaos.Table(rows, time.Date(2026, 11, 23, 16, 0, 0, 0, time.UTC))
	g.Expect(table).To(ContainSubstring("Chaos scenarios, full (make test-chaos) size, commit 0123abc, 2026-11-23 16:00 UTC"))
	g.Expect(table).To(ContainSubstring("| clock | passed | 400 | 0 | 0 | 41 | 1m30s | 0 | 0 | 0 | 0 | 0 | 0 | 0 |\n"))
	g.Expect(table).To(ContainSubstring("| kill (3 while binding, 2 while deleting) | **FAILED** | 1000 | 50 | 5 | 0 | 0s | 1 | 0 | 0 | 0 | 0 | 0 | 0 |\n"))
	g.Expect(table).To(ContainSubstring("| restart | **FAILED** | 40 | 0 | 0 | 0 | 0s | 0 | 0 | 0 | 1 | 2 | 1 | 0 |\n"))
}

// failingT is a test that failed, whose cleanups the test runs by hand.
type failingT struct {
	testing.TB
	cleanups []func()
}

func (f *failingT) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *failingT) Failed() bool      { return true }

// A scenario that fails still has its row, marked FAILED, with what the oracle finds
// when it ends.
func TestAFailedScenarioKeepsItsRow(t *testing.T) {
	g := NewWithT(t)
	t.Setenv("CHAOS_ROWS", filepath.Join(t.TempDir(), "rows.jsonl"))
	ft := &failingT{TB: t}
	row := &chaos.Row{Scenario: "restart", Claims: 40}
	chaos.RecordAtEnd(ft, row, func() (chaos.Accounts, error) {
		return chaos.Accounts{Leaked: []string{"10.0.0.1/32 held by x"}}, nil
	})
	g.Expect(ft.cleanups).To(HaveLen(1))
	ft.cleanups[0]()
	rows, err := chaos.Rows()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rows).To(ConsistOf(HaveField("Failed", true)))
	g.Expect(rows[0].Leaked).To(Equal(1))
	g.Expect(chaos.Table(rows, time.Now())).To(ContainSubstring("| restart | **FAILED** | 40 |"))
}
