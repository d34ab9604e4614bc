package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/testenv"
)

// docs/flags.md names every flag of the manager, and only those, each with the default
// the binary has.
func TestFlagsPageMatchesTheBinary(t *testing.T) {
	page, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "flags.md"))
	if err != nil {
		t.Fatal(err)
	}
	fs, _ := newFlags()
	problems := flagsPageProblems(fs, string(page))
	for _, p := range problems {
		t.Error(p)
	}
}

// The check finds a flag added without docs, a documented flag that is gone, and a
// default that changed.
func TestFlagsPageProblemsAreFound(t *testing.T) {
	page := "| Flag | Default | Meaning |\n|---|---|---|\n" +
		"| `--kept` | `5m` | fine |\n" +
		"| `--gone` | `1` | removed from the binary |\n" +
		"| `--changed`, `--list` | `10s`, `a,b` | default differs |\n"
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.Duration("kept", 5*time.Minute, "")
	fs.Duration("changed", 20*time.Second, "")
	fs.StringSlice("list", []string{"a", "b"}, "")
	fs.String("added", "", "")
	fs.Bool("secret-option", false, "")
	_ = fs.MarkHidden("secret-option")
	got := flagsPageProblems(fs, page)
	want := []string{
		"--added is a flag of the manager and not in docs/flags.md",
		"--changed defaults to 20s, docs/flags.md says 10s",
		"--gone is in docs/flags.md and not a flag of the manager",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

var backticked = regexp.MustCompile("`([^`]*)`")

// flagsPageProblems compares the rows of the flags table of page (first column: the
// flags, backticked; second: their defaults, comma-separated when a row has several
// flags) with fs's visible flags.
func flagsPageProblems(fs *pflag.FlagSet, page string) []string {
	var problems []string
	defaults := map[string]string{} // documented flag -> its Default cell
	for _, line := range strings.Split(page, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "| `--") || len(cells) < 4 {
			continue
		}
		cells = cells[1:]
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		var names []string
		for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
			if strings.HasPrefix(m[1], "--") {
				names = append(names, strings.TrimPrefix(m[1], "--"))
			}
		}
		parts := strings.Split(cells[1], ", ")
		for i, name := range names {
			defaults[name] = cells[1]
			if len(parts) == len(names) {
				defaults[name] = parts[i]
			}
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		cell, ok := defaults[f.Name]
		if !ok {
			problems = append(problems, "--"+f.Name+" is a flag of the manager and not in docs/flags.md")
			return
		}
		delete(defaults, f.Name)
		want := strings.Trim(f.DefValue, "[]")
		if want == "" || (want == "false" && cell == "") {
			return
		}
		for _, m := range backticked.FindAllStringSubmatch(cell, -1) {
			if m[1] == want {
				return
			}
			d, err1 := time.ParseDuration(m[1])
			w, err2 := time.ParseDuration(want)
			if err1 == nil && err2 == nil && d == w {
				return
			}
		}
		problems = append(problems, "--"+f.Name+" defaults to "+want+", docs/flags.md says "+strings.Join(strings.Fields(strings.ReplaceAll(cell, "`", "")), " "))
	})
	for name := range defaults {
		problems = append(problems, "--"+name+" is in docs/flags.md and not a flag of the manager")
	}
	slices.Sort(problems)
	return problems
}
