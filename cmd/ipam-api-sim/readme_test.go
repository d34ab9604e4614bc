package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// standInSection returns README.md's section "## The IPAM-API stand-in", up to the
// next section.
func standInSection(g Gomega) string {
	raw, err := os.ReadFile("../../README.md")
	g.Expect(err).NotTo(HaveOccurred())
	readme := string(raw)
	const heading, next = "\n## The IPAM-API stand-in\n", "\n## Development and tests\n"
	start := strings.Index(readme, heading)
	g.Expect(start).To(BeNumerically(">=", 0), "README.md has no section %q", strings.TrimSpace(heading))
	section := readme[start+len(heading):]
	end := strings.Index(section, next)
	g.Expect(end).To(BeNumerically(">=", 0), "README.md has no section %q after the stand-in", strings.TrimSpace(next))
	return section[:end]
}

// The debug routes are listed in one place, sim.DebugRoutes; README.md repeats them in
// the --debug-listen row as `METHOD /path`. This test keeps the two from drifting in
// either direction: every route of the table is in the row, and every `METHOD /path`
// in the row is a route of the table.
func TestREADMEListsTheDebugRoutes(t *testing.T) {
	g := NewWithT(t)
	section := standInSection(g)

	var row string
	for line := range strings.SplitSeq(section, "\n") {
		if strings.HasPrefix(line, "| `--debug-listen`") {
			row = line
		}
	}
	g.Expect(row).NotTo(BeEmpty(), "README.md's stand-in section has no table row for `--debug-listen`")
	g.Expect(row).To(ContainSubstring("ipam-api-sim --help"), "the --debug-listen row should point to `ipam-api-sim --help` for what each route takes and answers")

	table := map[string]bool{}
	for _, rt := range sim.DebugRoutes() {
		route := rt.Method + " " + rt.Path
		table[route] = true
		g.Expect(row).To(ContainSubstring("`"+route+"`"),
			"README.md's --debug-listen row lacks `%s` (from sim.DebugRoutes): add it to the row", route)
	}
	for _, m := range regexp.MustCompile("`((?:GET|PUT|POST|DELETE|PATCH) /[^`]*)`").FindAllStringSubmatch(row, -1) {
		g.Expect(table).To(HaveKey(m[1]), "README.md's --debug-listen row lists `%s`, which sim.DebugRoutes does not serve: remove it from the row", m[1])
	}

	// The state of holders and registrations is described once.
	g.Expect(section).To(ContainSubstring("`state`"), "README.md's stand-in section should describe the `state` field of GET /registrations")
	g.Expect(section).To(ContainSubstring("`live`"))
	g.Expect(section).To(ContainSubstring("`expiring`"))
}
