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
	g.Expect(chaos.Record(chaos.Row{Scenario: "clock", Claims: 400, Faults: 41, Duration: 90 * time.Second})).To(Succeed())
	g.Expect(chaos.Record(chaos.Row{Scenario: "kill", Claims: 1000, Services: 50, Kills: 10, Leaked: 1})).To(Succeed())
	rows, err := chaos.Rows()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rows).To(HaveLen(2))
	g.Expect(rows[0].Zero()).To(BeTrue())
	g.Expect(rows[1].Zero()).To(BeFalse())
	table := chaos.Table(rows, time.Date(2026, 11, 23, 16, 0, 0, 0, time.UTC))
	g.Expect(table).To(ContainSubstring("Chaos scenarios, full (make test-chaos) size, 2026-11-23 16:00 UTC"))
	g.Expect(table).To(ContainSubstring("| clock | 400 | 0 | 0 | 41 | 1m30s | 0 | 0 | 0 | 0 | 0 |\n"))
	g.Expect(table).To(ContainSubstring("| kill | 1000 | 50 | 10 | 0 | 0s | 1 | 0 | 0 | 0 | 0 |\n"))
}
