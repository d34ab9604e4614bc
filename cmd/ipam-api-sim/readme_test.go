package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// standInSection returns docs/stand-in.md, the stand-in's page, without its heading.
func standInSection(g Gomega) string {
	raw, err := os.ReadFile("../../docs/stand-in.md")
	g.Expect(err).NotTo(HaveOccurred())
	const heading = "# The IPAM-API stand-in\n"
	page := string(raw)
	g.Expect(page).To(HavePrefix(heading), "docs/stand-in.md does not start with %q", strings.TrimSpace(heading))
	return page[len(heading):]
}

// The debug routes are listed in one place, sim.DebugRoutes; docs/stand-in.md repeats them in
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
	g.Expect(row).NotTo(BeEmpty(), "docs/stand-in.md has no table row for `--debug-listen`")
	g.Expect(row).To(ContainSubstring("ipam-api-sim --help"), "the --debug-listen row should point to `ipam-api-sim --help` for what each route takes and answers")

	table := map[string]bool{}
	for _, rt := range sim.DebugRoutes() {
		route := rt.Method + " " + rt.Path
		table[route] = true
		g.Expect(row).To(ContainSubstring("`"+route+"`"),
			"docs/stand-in.md's --debug-listen row lacks `%s` (from sim.DebugRoutes): add it to the row", route)
	}
	for _, m := range regexp.MustCompile("`((?:GET|PUT|POST|DELETE|PATCH) /[^`]*)`").FindAllStringSubmatch(row, -1) {
		g.Expect(table).To(HaveKey(m[1]), "docs/stand-in.md's --debug-listen row lists `%s`, which sim.DebugRoutes does not serve: remove it from the row", m[1])
	}

	// The state of holders and registrations is described once.
	g.Expect(section).To(ContainSubstring("`state`"), "docs/stand-in.md should describe the `state` field of GET /registrations")
	g.Expect(section).To(ContainSubstring("`live`"))
	g.Expect(section).To(ContainSubstring("`expiring`"))
}
