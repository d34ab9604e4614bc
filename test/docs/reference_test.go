package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
)

// docs/README.md is the index: every page under docs/ can be reached from it by
// following links.
func TestEveryPageIsReachableFromTheIndex(t *testing.T) {
	root := repoRoot(t)
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, p := range pages {
		all = append(all, "docs/"+filepath.Base(p))
	}
	for _, p := range unreachable(root, "docs/README.md", all) {
		t.Errorf("%s cannot be reached from docs/README.md: link it from the index or from a page the index reaches", p)
	}
}

func TestUnreachablePagesAreFound(t *testing.T) {
	root := t.TempDir()
	write(t, root, "docs/README.md", "# Index\n\n[a](a.md)\n")
	write(t, root, "docs/a.md", "# A\n\n[b](b.md#b) and [back](README.md)\n")
	write(t, root, "docs/b.md", "# B\n\n[the README](../README.md)\n")
	write(t, root, "docs/c.md", "# C\n\n[a](a.md)\n")
	write(t, root, "README.md", "# R\n\n[c](docs/c.md)\n")
	got := unreachable(root, "docs/README.md", []string{"docs/README.md", "docs/a.md", "docs/b.md", "docs/c.md"})
	if !slices.Equal(got, []string{"docs/c.md"}) {
		t.Errorf("unreachable %v, want [docs/c.md]", got)
	}
}

// unreachable is the pages that following relative links from start, between pages
// under docs/, never reaches.
func unreachable(root, start string, pages []string) []string {
	c := &checker{root: root, docs: map[string]*document{}}
	seen := map[string]bool{start: true}
	for queue := []string{start}; len(queue) > 0; queue = queue[1:] {
		doc, err := c.document(queue[0])
		if err != nil {
			continue
		}
		for _, l := range doc.links {
			p, _, _ := strings.Cut(l.target, "#")
			if isExternal(l.target) || p == "" {
				continue
			}
			dest := path.Join(path.Dir(queue[0]), p)
			if isMarkdown(dest) && strings.HasPrefix(dest, "docs/") && !seen[dest] {
				seen[dest] = true
				queue = append(queue, dest)
			}
		}
	}
	var missed []string
	for _, p := range pages {
		if !seen[p] {
			missed = append(missed, p)
		}
	}
	return missed
}

// internalWork finds references to how the work was organised (sessions, waves, stops,
// issue numbers of the tracker) where a reader needs dates, versions or commits. A
// reference into another repository (owner/repo#123) is fine.
var internalWork = regexp.MustCompile(`(?i)\b(sessions?|waves? [0-9]+|stops? [0-9]+|issues? #?[0-9]+)\b|(^|[^\w/&])#[0-9]+\b`)

// No page speaks of internal work steps.
func TestNoPageNamesInternalWorkSteps(t *testing.T) {
	eachMarkdown(t, repoRoot(t), func(f, text string) {
		for i, line := range strings.Split(text, "\n") {
			if m := internalWork.FindString(line); m != "" {
				t.Errorf("%s:%d: %q refers to internal work; name a date, a version or a commit instead", f, i+1, strings.TrimSpace(m))
			}
		}
	})
}

// eachMarkdown calls do with every Markdown file of the repository and its text.
func eachMarkdown(t *testing.T, root string, do func(file, text string)) {
	t.Helper()
	files, err := markdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		do(f, string(b))
	}
}

func TestInternalWorkIsFound(t *testing.T) {
	for line, want := range map[string]bool{
		"measured in session 12": true,
		"as wave 2 planned":      true,
		"see issue 27":           true,
		"fixed in #26":           true,
		"(#31)":                  true,
		"kubernetes-sigs/controller-runtime#3538":     false,
		"[Pools](pools.md#pools), anchors like (#a1)": false,
		"measured on 2026-11-24 at 77172e5":           false,
		"&#8212; an entity":                           false,
	} {
		if got := internalWork.MatchString(line); got != want {
			t.Errorf("%q: found %v, want %v", line, got, want)
		}
	}
}

var (
	keyRE          = regexp.MustCompile(`^(ipam\.vitistack\.io|metallb\.io)/[A-Za-z0-9.-]+$`)
	providerKeyRE  = regexp.MustCompile(`ipam\.vitistack\.io/[A-Za-z][A-Za-z0-9-]*`)
	codeSpanRE     = regexp.MustCompile("`([^`]+)`")
	notProviderKey = map[string]bool{"ipam.vitistack.io/v1alpha1": true} // the API group's version
)

// docs/annotations.md has a row for every label, annotation and finalizer key the code
// defines, and names no other; no page names an ipam.vitistack.io key the code does
// not define.
func TestAnnotationsPageNamesEveryKey(t *testing.T) {
	root := repoRoot(t)
	keys := map[string]bool{}
	for _, file := range []string{"api/v1alpha1/annotations.go", "internal/lbservice/annotations.go"} {
		for _, v := range stringConstants(t, filepath.Join(root, file)) {
			if keyRE.MatchString(v) {
				keys[v] = true
			}
		}
	}
	checkPage(t, filepath.Join(root, "docs", "annotations.md"), keys, 30, keyProblems)

	eachMarkdown(t, root, func(f, text string) {
		for _, k := range providerKeyRE.FindAllString(text, -1) {
			if !keys[k] && !notProviderKey[k] {
				t.Errorf("%s names %s, which the code does not define", f, k)
			}
		}
	})
}

// keyProblems compares the keys named in the first column of page's tables with keys.
func keyProblems(keys map[string]bool, page string) []string {
	documented := map[string]bool{}
	for k := range firstColumn(page, "") {
		if keyRE.MatchString(k) {
			documented[k] = true
		}
	}
	return differences(keys, documented,
		"docs/annotations.md has no row for %s, which the code defines",
		"docs/annotations.md names %s, which the code does not define")
}

// firstColumn is the code spans in the first column of the tables of page, or of its
// "## section" alone.
func firstColumn(page, section string) map[string]bool {
	spans := map[string]bool{}
	in := section == ""
	for _, line := range strings.Split(page, "\n") {
		if section != "" && strings.HasPrefix(line, "## ") {
			in = strings.TrimSpace(line[3:]) == section
		}
		cells := strings.Split(line, "|")
		if !in || len(cells) < 3 || !strings.HasPrefix(line, "|") {
			continue
		}
		for _, m := range codeSpanRE.FindAllStringSubmatch(cells[1], -1) {
			spans[m[1]] = true
		}
	}
	return spans
}

// differences reports each element of code missing from documented, and each element
// of documented missing from code, sorted.
func differences(code, documented map[string]bool, missing, extra string) []string {
	var problems []string
	for k := range code {
		if !documented[k] {
			problems = append(problems, fmt.Sprintf(missing, k))
		}
	}
	for k := range documented {
		if !code[k] {
			problems = append(problems, fmt.Sprintf(extra, k))
		}
	}
	slices.Sort(problems)
	return problems
}

// The reasons of Cluster API's that the provider sets on claims, by the name of their
// constant in sigs.k8s.io/cluster-api/api/ipam/v1beta2.
var capiReasons = map[string]string{
	"IPAddressClaimReadyAllocationFailedReason": ipamv1.IPAddressClaimReadyAllocationFailedReason,
	"IPAddressClaimReadyPoolNotReadyReason":     ipamv1.IPAddressClaimReadyPoolNotReadyReason,
	"IPAddressClaimReadyPoolExhaustedReason":    ipamv1.IPAddressClaimReadyPoolExhaustedReason,
}

var capiReasonUse = regexp.MustCompile(`ipamv1\.(\w+Reason)\b`)

// literalEventReason is an event whose reason is written out in the code, not a constant:
// Eventf(regarding, related, type, "Reason", ...) or note(type, "Reason", ...).
var literalEventReason = regexp.MustCompile(`(?:Eventf\([^,()]+,[^,()]+,[^,()]+,|\bnote\([^,()]+,)\s*"(\w+)"`)

// The troubleshooting page's "By condition reason" tables name every reason the provider
// sets on a condition or an event, and no other.
func TestTroubleshootingNamesEveryReason(t *testing.T) {
	root := repoRoot(t)
	reasons := providerReasons(t, root)
	checkPage(t, filepath.Join(root, "docs", "troubleshooting.md"), reasons, 25, reasonProblems)
}

// checkPage reports what problems finds between the page file and what the code has
// (at least atLeast of them, or the parser saw too little).
func checkPage(t *testing.T, file string, code map[string]bool, atLeast int, problems func(map[string]bool, string) []string) {
	t.Helper()
	if len(code) < atLeast {
		t.Fatalf("found only %d in the code for %s: the parser sees too little", len(code), file)
	}
	page, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems(code, string(page)) {
		t.Error(p)
	}
}

// The checks of the reference pages find a key or reason added to the code without a
// row, and a row for one the code no longer has.
func TestReferenceProblemsAreFound(t *testing.T) {
	for _, tc := range []struct {
		got  []string
		want []string
	}{{
		got: keyProblems(map[string]bool{"ipam.vitistack.io/zone": true, "ipam.vitistack.io/new": true},
			"| `ipam.vitistack.io/zone` | label |\n| `ipam.vitistack.io/gone` | annotation |\n"),
		want: []string{
			"docs/annotations.md has no row for ipam.vitistack.io/new, which the code defines",
			"docs/annotations.md names ipam.vitistack.io/gone, which the code does not define",
		},
	}, {
		got: reasonProblems(map[string]bool{"Ready": true, "New": true},
			"# T\n\n| `Elsewhere` | x |\n\n## By condition reason\n\n| `Ready` | True |\n| `Gone` | False |\n\n## Later\n\n| `Other` | x |\n"),
		want: []string{
			"docs/troubleshooting.md (By condition reason) has no row for New, which the provider sets",
			"docs/troubleshooting.md (By condition reason) names Gone, which the provider never sets",
		},
	}} {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("problems %q, want %q", tc.got, tc.want)
		}
	}
}

// reasonProblems compares the reasons in the first column of the tables of page's
// "By condition reason" section with reasons.
func reasonProblems(reasons map[string]bool, page string) []string {
	return differences(reasons, firstColumn(page, "By condition reason"),
		"docs/troubleshooting.md (By condition reason) has no row for %s, which the provider sets",
		"docs/troubleshooting.md (By condition reason) names %s, which the provider never sets")
}

// stringConstants is the string constants of a Go file by name, with the values
// computed for the forms the API package uses: a literal, a constant of the same file,
// and sums of them.
func stringConstants(t *testing.T, file string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{}
	var eval func(e ast.Expr) (string, bool)
	eval = func(e ast.Expr) (string, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind == token.STRING {
				s, err := strconv.Unquote(e.Value)
				return s, err == nil
			}
		case *ast.Ident:
			s, ok := consts[e.Name]
			return s, ok
		case *ast.ParenExpr:
			return eval(e.X)
		case *ast.BinaryExpr:
			if e.Op == token.ADD {
				x, ok1 := eval(e.X)
				y, ok2 := eval(e.Y)
				return x + y, ok1 && ok2
			}
		}
		return "", false
	}
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					if v, ok := eval(vs.Values[i]); ok {
						consts[name.Name] = v
					}
				}
			}
		}
	}
	return consts
}

// README.md stays a front door: short, the quickstart near the top, its sections in the
// order a newcomer needs them.
func TestReadmeIsAFrontDoor(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 250 {
		t.Errorf("README.md has %d lines, at most 250: move detail into a page under docs/ and link it", len(lines))
	}
	var sections []string
	for i, l := range lines {
		if strings.HasPrefix(l, "## ") {
			sections = append(sections, l[3:])
			if l == "## Quickstart" && i >= 80 {
				t.Errorf("the quickstart starts at line %d, not within the first 80", i+1)
			}
		}
	}
	want := []string{"Compatibility", "Quickstart", "Install with clusterctl", "Install with Helm", "A pool, a claim, an address",
		"A LoadBalancer Service", "Control-plane endpoints from a pool", "Where to read next", "Tests", "Licence"}
	if !slices.Equal(sections, want) {
		t.Errorf("README.md's sections are %q, want %q", sections, want)
	}
}
