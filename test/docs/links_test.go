package docs

import (
	"fmt"
	"html"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestRepositoryLinks checks every link of README.md and the other Markdown files of
// the repository.
func TestRepositoryLinks(t *testing.T) {
	root := repoRoot(t)
	files, err := markdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	// The walk must not miss what users read first.
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"README.md"}
	for _, d := range docs {
		want = append(want, "docs/"+filepath.Base(d))
	}
	for _, w := range want {
		if !slices.Contains(files, w) {
			t.Errorf("%s is not among the Markdown files checked: %v", w, files)
		}
	}

	res := check(root, files)
	for _, p := range res.problems {
		t.Error(p)
	}
	if res.relative["README.md"] == 0 {
		t.Errorf("found no relative link in README.md: the parser sees nothing")
	}
	for _, f := range files {
		t.Logf("%s: %d links, %d of them inside the repository", f, res.links[f], res.relative[f])
	}
}

// TestBrokenLinksAreReported feeds the checker a small repository with good and broken
// links of every kind, and expects exactly the broken ones.
func TestBrokenLinksAreReported(t *testing.T) {
	root := t.TempDir()
	write(t, root, "README.md", strings.Join([]string{
		"# Title", // 1
		"",
		"## Secret values and rotation", // 3
		"## Duplicate",                  // 4
		"## Duplicate",                  // 5
		"## The `IPAM-API` stand-in",    // 6
		"",
		"Good: [a](#secret-values-and-rotation), [b](#duplicate-1), [c](docs/x.md#section-two),", // 8
		"[d](https://example.com/never-fetched), [e](mailto:a@example.com), ![i](docs/), [f](docs/x.md),",
		"[g](<docs/x.md> \"title\"), [h](#the-ipam-api-stand-in), [j](main.go#L2), [k](./docs/../README.md#title),", // 10
		"[link with `[brackets]` in code](#title), [escaped \\] bracket](#title), \\[not a link](#nope-escaped).",
		"",
		"Bad: [l](#duplicate-2)",   // 13
		"[m](docs/missing.md)",     // 14
		"[n](/etc/passwd)",         // 15
		"[o](../outside.md)",       // 16
		"[p](docs/x.md#nope)",      // 17
		"[q](ftp://example.com)",   // 18
		"[r]()",                    // 19
		"[s](main.go#L99)",         // 20
		"[t](bin/tool)",            // 21
		"[u](Docs/x.md)",           // 22
		"[v](docs/#anchor)",        // 23
		"A link over two lines [w", // 24
		"x](#nope-multi-line) and ![image](docs/missing.png).", // 25
		"[ref]: docs/missing-ref.md",                           // 26
		"",
		"Not links: `[y](#in-inline-code)` and ``[z](#in-`double`-code)``.", // 28
		"",
		"```md",
		"[in-fence](#in-fence)",
		"# not a heading",
		"```",
		"",
		"- a list item with a fence",
		"  ~~~",
		"  [in-tilde-fence](#nope)",
		"  ~~~",
		"",
		"[after the fences](#not-a-heading)", // 40
		"<!-- [in a comment](#nope-comment) -->",
		"",
	}, "\n"))
	write(t, root, "docs/x.md", "# X\n\n## Section two\n\n[back](../README.md#title) and [self](#x)\n")
	write(t, root, "main.go", "package main\n\nfunc main() {}\n")
	write(t, root, "bin/tool", "built, never committed\n")

	res := check(root, []string{"README.md", "docs/x.md"})
	var got []string
	for _, p := range res.problems {
		got = append(got, fmt.Sprintf("%s:%d %s", p.file, p.line, p.target))
	}
	want := []string{
		"README.md:13 #duplicate-2",
		"README.md:14 docs/missing.md",
		"README.md:15 /etc/passwd",
		"README.md:16 ../outside.md",
		"README.md:17 docs/x.md#nope",
		"README.md:18 ftp://example.com",
		"README.md:19 ",
		"README.md:20 main.go#L99",
		"README.md:21 bin/tool",
		"README.md:22 Docs/x.md",
		"README.md:23 docs/#anchor",
		"README.md:25 #nope-multi-line",
		"README.md:25 docs/missing.png",
		"README.md:26 docs/missing-ref.md",
		"README.md:40 #not-a-heading",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n  %s\nwant:\n  %s\nin full:\n%v", strings.Join(got, "\n  "), strings.Join(want, "\n  "), res.problems)
	}
	if res.links["docs/x.md"] != 2 {
		t.Errorf("docs/x.md: %d links, want 2", res.links["docs/x.md"])
	}
}

// TestEveryReadmeLinkIsChecked breaks, one at a time, each link of a scratch copy of
// the real README.md that points inside the repository (the copy is held in memory;
// the files it links to are the repository's own), and expects the checker to report
// exactly that link.
func TestEveryReadmeLinkIsChecked(t *testing.T) {
	root := repoRoot(t)
	src, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	scratch := map[string]string{"README.md": string(src)}
	if res := checkWith(root, []string{"README.md"}, scratch); len(res.problems) > 0 {
		t.Fatalf("the scratch copy is not clean: %v", res.problems)
	}

	broken := 0
	for _, l := range parse(string(src)).links {
		if isExternal(l.target) {
			continue
		}
		scratch["README.md"] = string(src[:l.offset]) + l.target + "-broken" + string(src[l.offset+len(l.target):])
		res := checkWith(root, []string{"README.md"}, scratch)
		if len(res.problems) != 1 || res.problems[0].line != l.line || res.problems[0].target != l.target+"-broken" {
			t.Errorf("README.md:%d: breaking %q reported %v, want exactly that link", l.line, l.target, res.problems)
		}
		broken++
	}
	if broken == 0 {
		t.Error("README.md has no link inside the repository to break")
	}
	t.Logf("broke %d links of README.md one at a time; each was reported", broken)
}

// TestSlug checks GitHub's heading anchors for headings like the README's.
func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Secret values and rotation":                                                 "secret-values-and-rotation",
		"Routed mode and subnet mode":                                                "routed-mode-and-subnet-mode",
		"The IPAM-API stand-in":                                                      "the-ipam-api-stand-in",
		"Install with clusterctl":                                                    "install-with-clusterctl",
		"Annotations you may set on a claim":                                         "annotations-you-may-set-on-a-claim",
		"POST /v2/address — decision table":                                          "post-v2address--decision-table",
		"DELETE /v2/service — release with retention":                                "delete-v2service--release-with-retention",
		"The IPAM-operator's conventions (for Service compatibility)":                "the-ipam-operators-conventions-for-service-compatibility",
		"When its own dependencies fail (observed on the real server code, v1.0.40)": "when-its-own-dependencies-fail-observed-on-the-real-server-code-v1040",
		"Validation order (first failure wins) and its messages":                     "validation-order-first-failure-wins-and-its-messages",
		"Facts about `ipamutil` v1.1.0":                                              "facts-about-ipamutil-v110",
		"`--ipam-api-url` and `spec.endpoint`":                                       "--ipam-api-url-and-specendpoint",
		"api/v1alpha1 and internal/controllers":                                      "apiv1alpha1-and-internalcontrollers",
		"[Performance](#performance) at 10,000 claims":                               "performance-at-10000-claims",
		"Speed: 2.2× at 200 claims, ≤ 5 min":                                         "speed-22-at-200-claims--5-min",
		"Tom &amp; Jerry":                                                            "tom--jerry",
		"snake_case and UPPER case":                                                  "snake_case-and-upper-case",
		"Størrelse på nettet":                                                        "størrelse-på-nettet",
		"Headings with <em>HTML</em>":                                                "headings-with-html",
		"Escaped \\*stars\\*":                                                        "escaped-stars",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}

	// Duplicates get -1, -2, ..., skipping anchors that already exist.
	var s slugger
	var got []string
	for _, h := range []string{"Pools", "Pools", "Pools-1", "Pools", "Claims"} {
		got = append(got, s.anchor(h))
	}
	if want := []string{"pools", "pools-1", "pools-1-1", "pools-2", "claims"}; !slices.Equal(got, want) {
		t.Errorf("anchors %v, want %v", got, want)
	}
}

// TestHeadings checks which lines are headings: ATX and setext, not code.
func TestHeadings(t *testing.T) {
	doc := parse(strings.Join([]string{
		"# Title #",
		"Setext heading",
		"==============",
		"",
		"Two-line setext",
		"heading two",
		"---",
		"",
		"- list item",
		"---",
		"",
		"#hashtag is not a heading",
		"    # indented code is not a heading either",
		"```",
		"# in a fence",
		"```",
		`<a id="custom-anchor"></a>`,
		"## `Code` *and* [link](https://example.com)",
	}, "\n"))
	var got []string
	for a := range doc.anchors {
		got = append(got, a)
	}
	slices.Sort(got)
	want := []string{"code-and-link", "custom-anchor", "setext-heading", "title", "two-line-setext-heading-two"}
	if !slices.Equal(got, want) {
		t.Errorf("anchors %v, want %v", got, want)
	}
}

// problem is a link that does not resolve.
type problem struct {
	file   string // relative to the repository root, with slashes
	line   int
	target string
	why    string
}

func (p problem) String() string {
	return fmt.Sprintf("%s:%d: link %q: %s", p.file, p.line, p.target, p.why)
}

// result is what check found.
type result struct {
	problems []problem
	links    map[string]int // links (and images) per file
	relative map[string]int // of them, the ones that point inside the repository
}

// check checks every link of files (slash-separated paths relative to root).
func check(root string, files []string) result { return checkWith(root, files, nil) }

// checkWith is check with the contents of some files replaced (scratch copies).
func checkWith(root string, files []string, contents map[string]string) result {
	c := &checker{root: root, contents: contents, docs: map[string]*document{}}
	res := result{links: map[string]int{}, relative: map[string]int{}}
	for _, f := range files {
		doc, err := c.document(f)
		if err != nil {
			res.problems = append(res.problems, problem{file: f, why: err.Error()})
			continue
		}
		if doc.unclosedFence > 0 {
			res.problems = append(res.problems, problem{file: f, line: doc.unclosedFence,
				why: "code fence opened here is never closed: the rest of the file is code"})
		}
		for _, l := range doc.links {
			res.links[f]++
			if isExternal(l.target) {
				continue
			}
			res.relative[f]++
			if why := c.resolve(f, l.target); why != "" {
				res.problems = append(res.problems, problem{file: f, line: l.line, target: l.target, why: why})
			}
		}
	}
	return res
}

// checker resolves links inside one repository.
type checker struct {
	root     string
	contents map[string]string // files read from here instead of the disk
	docs     map[string]*document
}

// document parses a Markdown file of the repository once.
func (c *checker) document(file string) (*document, error) {
	if d, ok := c.docs[file]; ok {
		return d, nil
	}
	if src, ok := c.contents[file]; ok {
		d := parse(src)
		c.docs[file] = d
		return d, nil
	}
	b, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(file)))
	if err != nil {
		return nil, err
	}
	d := parse(string(b))
	c.docs[file] = d
	return d, nil
}

var (
	schemeRE     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	lineAnchorRE = regexp.MustCompile(`^L([0-9]+)(?:-L([0-9]+))?$`)
)

// isExternal reports whether a target is left alone: http(s) and mailto.
func isExternal(target string) bool {
	t := strings.ToLower(strings.TrimSpace(target))
	return strings.HasPrefix(t, "http://") || strings.HasPrefix(t, "https://") || strings.HasPrefix(t, "mailto:")
}

// resolve checks a link target of file that is not external; "" means it resolves.
func (c *checker) resolve(file, target string) string {
	if target == "" {
		return "empty target"
	}
	if strings.HasPrefix(target, "//") || schemeRE.MatchString(target) {
		return "only http(s) and mailto links may leave the repository; anything else must be a relative path"
	}
	p, frag, hasFrag := strings.Cut(target, "#")
	p, _, _ = strings.Cut(p, "?")
	p, err := url.PathUnescape(p)
	if err != nil {
		return "path is not valid URL escaping: " + err.Error()
	}
	if strings.Contains(p, `\`) {
		return `paths use /, not \`
	}
	if strings.HasPrefix(p, "/") {
		return "absolute path: write it relative to " + file
	}

	dest := file // an anchor alone points into the file itself
	isDir := false
	if p != "" {
		dest = path.Join(path.Dir(file), p)
		if dest == ".." || strings.HasPrefix(dest, "../") {
			return "points outside the repository"
		}
		if first, _, _ := strings.Cut(dest, "/"); notInRepository[first] {
			return first + "/ is not part of the repository"
		}
		if why := c.exists(dest); why != "" {
			return why
		}
		fi, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(dest)))
		if err != nil {
			return err.Error()
		}
		isDir = fi.IsDir()
	}
	if !hasFrag {
		return ""
	}
	frag, err = url.PathUnescape(frag)
	if err != nil {
		return "anchor is not valid URL escaping: " + err.Error()
	}
	switch {
	case frag == "":
		return "empty anchor"
	case isDir:
		return "anchor on a directory"
	case isMarkdown(dest):
		doc, err := c.document(dest)
		if err != nil {
			return err.Error()
		}
		if doc.anchors[frag] {
			return ""
		}
		why := fmt.Sprintf("no heading of %s has the anchor #%s", dest, frag)
		if near := nearest(frag, doc.anchors); near != "" {
			why += fmt.Sprintf(" (did you mean #%s?)", near)
		}
		return why
	default:
		m := lineAnchorRE.FindStringSubmatch(frag)
		if m == nil {
			return "anchor on a file that is not Markdown: only #L<line> can be checked there"
		}
		b, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(dest)))
		if err != nil {
			return err.Error()
		}
		lines := strings.Count(string(b), "\n")
		if !strings.HasSuffix(string(b), "\n") {
			lines++
		}
		for _, s := range m[1:] {
			if n, _ := strconv.Atoi(s); s != "" && (n < 1 || n > lines) {
				return fmt.Sprintf("%s has %d lines", dest, lines)
			}
		}
		return ""
	}
}

// exists checks that every element of dest exists with exactly this spelling (GitHub
// is case-sensitive even where the local file system is not).
func (c *checker) exists(dest string) string {
	dir := c.root
	for _, name := range strings.Split(dest, "/") {
		if name == "." {
			continue
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Sprintf("%s does not exist", dest)
		}
		found := false
		for _, e := range entries {
			if e.Name() == name {
				found = true
				break
			}
		}
		if !found {
			return fmt.Sprintf("%s does not exist", dest)
		}
		dir = filepath.Join(dir, name)
	}
	return ""
}

func isMarkdown(p string) bool {
	ext := strings.ToLower(path.Ext(p))
	return ext == ".md" || ext == ".markdown"
}

// nearest returns the anchor closest to frag, if one is close (a renamed heading).
func nearest(frag string, anchors map[string]bool) string {
	best, bestDist := "", len(frag)/3+2
	for a := range anchors {
		if d := distance(frag, a); d < bestDist || (d == bestDist && a < best) {
			best, bestDist = a, d
		}
	}
	return best
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// Directories whose Markdown is not checked: anywhere (Git's own, other people's
// code, test fixtures, editors), and at the top (the Makefile's build outputs).
var (
	skippedDirs    = map[string]bool{".git": true, "vendor": true, "testdata": true, "node_modules": true, ".idea": true, ".vscode": true}
	skippedTopDirs = map[string]bool{"bin": true, "out": true}
)

// notInRepository are the top directories a link may not point into: they exist in a
// working copy but are never committed.
var notInRepository = map[string]bool{".git": true, "bin": true, "out": true}

// markdownFiles lists the repository's Markdown files, relative to root, with slashes.
func markdownFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (skippedDirs[d.Name()] || (!strings.Contains(rel, "/") && skippedTopDirs[rel])) {
				return filepath.SkipDir
			}
			return nil
		}
		if isMarkdown(rel) {
			files = append(files, rel)
		}
		return nil
	})
	return files, err
}

// repoRoot is the directory of go.mod above the test's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

func write(t *testing.T, root, name, content string) {
	t.Helper()
	p := filepath.Join(root, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// The Markdown parser: just enough CommonMark and GitHub Flavored Markdown to find
// links and headings. Fenced code blocks, inline code and HTML comments hold no links;
// indented code blocks are not recognised (inside lists they cannot be told apart from
// continuation lines without a full parser), nor are headings inside block quotes.

// document is what the checker needs of a Markdown file.
type document struct {
	links         []link
	anchors       map[string]bool
	unclosedFence int // line of a code fence that is never closed, or 0
}

// link is an inline link or image, or a link reference definition.
type link struct {
	target string
	line   int // 1-based line of the target
	offset int // byte offset of the target in the file
}

var (
	fenceRE     = regexp.MustCompile("^[ \t]*(`{3,}|~{3,})(.*)$")
	atxRE       = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$`)
	atxCloseRE  = regexp.MustCompile(`(?:^|[ \t]+)#+$`)
	setextRE    = regexp.MustCompile(`^ {0,3}(?:=+|-+)[ \t]*$`)
	notPlainRE  = regexp.MustCompile(`^[ \t]*(?:[-*+>|]|[0-9]{1,9}[.)])(?:[ \t]|$)|^ {4}|^\t`)
	refDefRE    = regexp.MustCompile(`^ {0,3}\[([^\]^][^\]]*)\]:[ \t]*(<[^>\n]*>|\S+)`)
	htmlAnchorR = regexp.MustCompile(`<a\s[^>]*\b(?:id|name)\s*=\s*"([^"]+)"`)
)

// block is a run of lines parsed together: a paragraph or list (links and code spans
// may span its lines), a heading, or a table row.
type block struct {
	lines []string
	start int // index of the first line
	off   int // byte offset of the first line
}

// parse reads a Markdown file's links and the anchors of its headings.
func parse(src string) *document {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	doc := &document{anchors: map[string]bool{}}
	var s slugger
	addHeading := func(text string) {
		if a := s.anchor(text); a != "" {
			doc.anchors[a] = true
		}
	}

	lines := strings.SplitAfter(src, "\n")
	var cur block
	flush := func() {
		if len(cur.lines) > 0 {
			doc.links = append(doc.links, cur.links()...)
		}
		cur = block{}
	}
	var fence string // the opening fence while inside a fenced code block
	off := 0
	for i, raw := range lines {
		lineOff := off
		off += len(raw)
		line := strings.TrimSuffix(raw, "\n")

		if fence != "" {
			if m := fenceRE.FindStringSubmatch(line); m != nil && m[1][0] == fence[0] && len(m[1]) >= len(fence) && strings.TrimSpace(m[2]) == "" {
				fence = ""
				doc.unclosedFence = 0
			}
			continue
		}
		if m := fenceRE.FindStringSubmatch(line); m != nil && (m[1][0] == '~' || !strings.Contains(m[2], "`")) {
			flush()
			fence = m[1]
			doc.unclosedFence = i + 1
			continue
		}
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		if m := atxRE.FindStringSubmatch(line); m != nil {
			flush()
			addHeading(strings.TrimSpace(atxCloseRE.ReplaceAllString(m[2], "")))
			cur = block{lines: []string{line}, start: i, off: lineOff}
			flush()
			continue
		}
		if setextRE.MatchString(line) && len(cur.lines) > 0 && !slices.ContainsFunc(cur.lines, notPlainRE.MatchString) {
			var text []string
			for _, l := range cur.lines {
				text = append(text, strings.TrimSpace(l))
			}
			addHeading(strings.Join(text, " "))
			flush()
			continue
		}
		for _, m := range htmlAnchorR.FindAllStringSubmatch(line, -1) {
			doc.anchors[m[1]] = true
		}
		if strings.HasPrefix(strings.TrimSpace(line), "|") {
			flush() // a table row: its cells are parsed on their own
			cur = block{lines: []string{line}, start: i, off: lineOff}
			flush()
			continue
		}
		if len(cur.lines) == 0 {
			cur.start, cur.off = i, lineOff
		}
		cur.lines = append(cur.lines, line)
	}
	flush()
	return doc
}

// links finds the inline links and images, and link reference definitions, of a block.
func (b block) links() []link {
	text := strings.Join(b.lines, "\n")
	masked, escaped := mask(text)
	lineOf := func(pos int) int { return b.start + 1 + strings.Count(text[:pos], "\n") }
	var out []link

	// Link reference definitions, [label]: target, each at the start of a line.
	pos := 0
	for _, l := range strings.Split(masked, "\n") {
		if m := refDefRE.FindStringSubmatchIndex(l); m != nil {
			start, end := pos+m[4], pos+m[5]
			if masked[start] == '<' {
				start, end = start+1, end-1
			}
			out = append(out, link{target: text[start:end], line: lineOf(start), offset: b.off + start})
		}
		pos += len(l) + 1
	}

	// Inline links and images: [text](target "title"), ![alt](target).
	for i := 0; i < len(masked); i++ {
		if masked[i] != '[' || escaped[i] {
			continue
		}
		close := matchBracket(masked, escaped, i)
		if close < 0 || close+1 >= len(masked) || masked[close+1] != '(' {
			continue
		}
		start, end, ok := destination(masked, escaped, close+2)
		if !ok {
			continue
		}
		out = append(out, link{target: text[start:end], line: lineOf(start), offset: b.off + start})
	}
	slices.SortFunc(out, func(a, b link) int { return a.offset - b.offset })
	return out
}

// mask blanks code spans and HTML comments (keeping line breaks), and marks the
// characters escaped by a backslash.
func mask(text string) (string, []bool) {
	m := []byte(text)
	escaped := make([]bool, len(text))
	blank := func(from, to int) {
		for k := from; k < to; k++ {
			if m[k] != '\n' {
				m[k] = 0
			}
		}
	}
	for i := 0; i < len(text); {
		switch {
		case text[i] == '\\' && i+1 < len(text) && isASCIIPunct(text[i+1]):
			escaped[i+1] = true
			i += 2
		case strings.HasPrefix(text[i:], "<!--"):
			end := strings.Index(text[i+4:], "-->")
			if end < 0 {
				i += 4
				continue
			}
			blank(i, i+4+end+3)
			i += 4 + end + 3
		case text[i] == '`':
			n := runLength(text, i, '`')
			closeAt := -1
			for j := i + n; j < len(text); {
				if text[j] != '`' {
					j++
					continue
				}
				if k := runLength(text, j, '`'); k == n {
					closeAt = j
					break
				} else {
					j += k
				}
			}
			if closeAt < 0 {
				i += n // no closing run: the backticks are literal
				continue
			}
			blank(i, closeAt+n)
			i = closeAt + n
		default:
			i++
		}
	}
	return string(m), escaped
}

// isASCIIPunct reports whether a backslash escapes c (CommonMark: ASCII punctuation).
func isASCIIPunct(c byte) bool {
	return c >= '!' && c <= '/' || c >= ':' && c <= '@' || c >= '[' && c <= '`' || c >= '{' && c <= '~'
}

func runLength(s string, i int, c byte) int {
	n := 0
	for i+n < len(s) && s[i+n] == c {
		n++
	}
	return n
}

// matchBracket returns the index of the ] that closes the [ at open, or -1.
func matchBracket(s string, escaped []bool, open int) int {
	depth := 0
	for i := open; i < len(s); i++ {
		if escaped[i] {
			continue
		}
		switch s[i] {
		case '[':
			depth++
		case ']':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// destination parses a link destination and optional title starting at i (just after
// the opening parenthesis), up to the closing parenthesis. It returns where the
// destination is in s; ok is false if this is not a link.
func destination(s string, escaped []bool, i int) (start, end int, ok bool) {
	skip := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n') {
			i++
		}
	}
	skip()
	switch {
	case i < len(s) && s[i] == ')':
		return i, i, true // empty destination
	case i < len(s) && s[i] == '<':
		gt := strings.IndexAny(s[i+1:], ">\n")
		if gt < 0 || s[i+1+gt] != '>' {
			return 0, 0, false
		}
		start, end = i+1, i+1+gt
		i = end + 1
	default:
		start = i
		depth := 0
	loop:
		for ; i < len(s); i++ {
			c := s[i]
			switch {
			case escaped[i]:
			case c <= ' ' || c == 0x7f:
				break loop
			case c == '(':
				depth++
			case c == ')':
				if depth == 0 {
					break loop
				}
				depth--
			}
		}
		end = i
		if start == end {
			return 0, 0, false
		}
	}
	skip()
	if i < len(s) && (s[i] == '"' || s[i] == '\'' || s[i] == '(') {
		closing := s[i]
		if closing == '(' {
			closing = ')'
		}
		for i++; i < len(s) && (s[i] != closing || escaped[i]); i++ {
		}
		i++
		skip()
	}
	if i >= len(s) || s[i] != ')' {
		return 0, 0, false
	}
	return start, end, true
}

// slugger gives a document's headings GitHub's anchors: the slug of the heading's
// text, and for the second and later heading with the same slug -1, -2, ... (skipping
// any anchor already taken), as github-slugger does.
type slugger struct {
	seen map[string]int
}

func (s *slugger) anchor(heading string) string {
	if s.seen == nil {
		s.seen = map[string]int{}
	}
	base := slug(heading)
	if base == "" {
		return ""
	}
	a := base
	for {
		if _, taken := s.seen[a]; !taken {
			break
		}
		s.seen[base]++
		a = base + "-" + strconv.Itoa(s.seen[base])
	}
	s.seen[a] = 0
	return a
}

var (
	inlineLinkRE = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTagRE    = regexp.MustCompile(`<[^>]*>`)
	escapeRE     = regexp.MustCompile("\\\\([!-/:-@\\[-`{-~])")
)

// slug is GitHub's anchor for a heading's Markdown text: the text as rendered (links
// and images by their text, no HTML tags, entities and escapes resolved, backticks
// gone), in lower case, without punctuation and symbols except hyphens and
// underscores, and every space turned into a hyphen.
func slug(heading string) string {
	text := strings.ReplaceAll(heading, "`", "")
	text = inlineLinkRE.ReplaceAllString(text, "$1")
	text = htmlTagRE.ReplaceAllString(text, "")
	text = escapeRE.ReplaceAllString(text, "$1")
	text = html.UnescapeString(text)
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ' || r == '\t':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
