package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
)

func main() {
	allowSkip := flag.String("allow-skip", "", "a regexp of the tests (\"package TestName\") that may skip; none may without it")
	requireTests := flag.Bool("require-tests", false, "fail when a package with test files ran no test")
	allowNoTests := flag.String("allow-no-tests", "", "with -require-tests, a regexp of the packages that may run none (benchmarks only)")
	times := flag.Bool("times", false, "print how long each top-level test took as it passes")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: testreport [-allow-skip REGEXP] [-require-tests] -- go test -json ...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	allow, noTests := compile("-allow-skip", *allowSkip), compile("-allow-no-tests", *allowNoTests)
	cmd := exec.Command(flag.Arg(0), flag.Args()[1:]...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	r := newReport(os.Stdout, allow, *requireTests)
	r.allowNoTests, r.times = noTests, *times
	readErr := r.read(out)
	runErr := cmd.Wait()
	ok := r.summary()
	switch {
	case readErr != nil:
		fmt.Fprintln(os.Stderr, "testreport: reading go test's output:", readErr)
		os.Exit(1)
	case runErr != nil:
		var exit *exec.ExitError
		if errors.As(runErr, &exit) && exit.ExitCode() > 0 {
			os.Exit(exit.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "testreport:", runErr)
		os.Exit(1)
	case !ok:
		os.Exit(1)
	}
}

// compile compiles a flag's regexp; "" is none.
func compile(name, expr string) *regexp.Regexp {
	if expr == "" {
		return nil
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testreport: %s: %v\n", name, err)
		os.Exit(2)
	}
	return re
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action      string
	Package     string
	Test        string
	Elapsed     float64
	Output      string
	ImportPath  string // of build-output and build-fail
	FailedBuild string // of a package's fail: the import path whose build failed
}

type pkgResult struct {
	name                         string
	ran, passed, failed, skipped int
	action                       string // pass, fail, skip (no test files)
	elapsed                      float64
	tail                         []string // the last lines the package printed outside its tests
	failedTests, skippedTests    []*testResult
}

type testResult struct {
	pkg, name string
	lines     []string // the test's output but go test's framing lines
}

// report keeps what the events say until the end.
type report struct {
	w            io.Writer
	allow        *regexp.Regexp
	requireTests bool
	allowNoTests *regexp.Regexp
	times        bool
	pkgs         map[string]*pkgResult
	order        []string
	running      map[[2]string]*testResult
	builds       map[string][]string // build-output by import path
}

func newReport(w io.Writer, allow *regexp.Regexp, requireTests bool) *report {
	return &report{w: w, allow: allow, requireTests: requireTests,
		pkgs: map[string]*pkgResult{}, running: map[[2]string]*testResult{}, builds: map[string][]string{}}
}

const (
	tailLines     = 15   // package lines kept for a package that failed without a failed test
	maxTestLines  = 2000 // lines kept of one test's output
	messageLines  = 3    // of a failed test, its last messages repeated in the summary
	messageLength = 300  // characters of each
)

// The report's output goes to a terminal or CI's log: a write that fails has nowhere
// else to go.
func (r *report) printf(format string, args ...any) { _, _ = fmt.Fprintf(r.w, format, args...) }
func (r *report) println(s string)                  { _, _ = fmt.Fprintln(r.w, s) }
func (r *report) print(s string)                    { _, _ = fmt.Fprint(r.w, s) }

func (r *report) pkg(name string) *pkgResult {
	p := r.pkgs[name]
	if p == nil {
		p = &pkgResult{name: name}
		r.pkgs[name] = p
		r.order = append(r.order, name)
	}
	return p
}

// read handles go test's output line by line; a line that is not an event (a build
// error, go vet's output) passes through.
func (r *report) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Action == "" {
			r.println(string(line))
			continue
		}
		r.handle(e)
	}
	return sc.Err()
}

// framing is go test -v's lines about a test's life, which go test without -v does not print.
var framing = regexp.MustCompile(`^\s*=== (RUN|PAUSE|CONT|NAME)\b|^\s*--- (PASS|SKIP)\b`)

// trailer is a package's last line, which the report prints its own way.
var trailer = regexp.MustCompile(`^(PASS|FAIL|ok  \t|FAIL\t|\?   \t|testing: warning: no tests to run)`)

func (r *report) handle(e event) {
	switch e.Action {
	case "build-output":
		r.print(e.Output)
		r.builds[e.ImportPath] = append(r.builds[e.ImportPath], strings.TrimRight(e.Output, "\n"))
		return
	case "build-fail":
		return
	}
	p := r.pkg(e.Package)
	if e.Test == "" {
		switch e.Action {
		case "output":
			if trailer.MatchString(e.Output) {
				return
			}
			r.print(e.Output)
			p.tail = append(p.tail, strings.TrimRight(e.Output, "\n"))
			if len(p.tail) > tailLines {
				p.tail = p.tail[len(p.tail)-tailLines:]
			}
		case "pass", "fail", "skip":
			p.action, p.elapsed = e.Action, e.Elapsed
			if e.FailedBuild != "" {
				p.tail = r.builds[e.FailedBuild]
			}
			r.packageLine(p)
		}
		return
	}
	key := [2]string{e.Package, e.Test}
	t := r.running[key]
	if t == nil {
		t = &testResult{pkg: e.Package, name: e.Test}
		r.running[key] = t
	}
	switch e.Action {
	case "run":
		p.ran++
	case "output":
		if framing.MatchString(e.Output) {
			return
		}
		if len(t.lines) < maxTestLines {
			t.lines = append(t.lines, strings.TrimRight(e.Output, "\n"))
		}
	case "pass":
		p.passed++
		delete(r.running, key)
		if r.times && !strings.Contains(e.Test, "/") {
			r.printf("--- %s (%.1fs)\n", e.Test, e.Elapsed)
		}
	case "skip":
		p.skipped++
		p.skippedTests = append(p.skippedTests, t)
		delete(r.running, key)
	case "fail":
		p.failed++
		p.failedTests = append(p.failedTests, t)
		delete(r.running, key)
		// As go test without -v: a failed test's output, when it ends.
		for _, l := range t.lines {
			r.println(l)
		}
	}
}

// packageLine prints go test's line for a package that ended, with its counts.
func (r *report) packageLine(p *pkgResult) {
	switch p.action {
	case "skip":
		r.printf("?   \t%s\t[no test files]\n", p.name)
	case "pass":
		r.printf("ok  \t%s\t%.3fs\t%s\n", p.name, p.elapsed, p.counts())
	default:
		r.printf("FAIL\t%s\t%.3fs\t%s\n", p.name, p.elapsed, p.counts())
	}
}

func (p *pkgResult) counts() string {
	s := fmt.Sprintf("(ran %d, passed %d", p.ran, p.passed)
	if p.failed > 0 {
		s += fmt.Sprintf(", failed %d", p.failed)
	}
	return s + fmt.Sprintf(", skipped %d)", p.skipped)
}

// summary prints the counts of every package, the skips that fail the run and last the
// failures, and says whether the run holds (go test's own verdict aside).
func (r *report) summary() bool {
	ok := true
	var ran, passed, failed, skipped int
	var badSkips, empty []string
	for _, name := range r.order {
		p := r.pkgs[name]
		ran, passed, failed, skipped = ran+p.ran, passed+p.passed, failed+p.failed, skipped+p.skipped
		for _, t := range p.skippedTests {
			if r.allow != nil && r.allow.MatchString(t.pkg+" "+t.name) {
				continue
			}
			badSkips = append(badSkips, fmt.Sprintf("%s %s: %s", short(t.pkg), t.name, skipReason(t.lines)))
		}
		if r.requireTests && p.action == "pass" && p.ran == 0 && (r.allowNoTests == nil || !r.allowNoTests.MatchString(p.name)) {
			empty = append(empty, short(p.name))
		}
	}
	r.printf("\ntestreport: %d packages; tests (with subtests) ran %d, passed %d, failed %d, skipped %d\n",
		len(r.order), ran, passed, failed, skipped)
	if len(empty) > 0 {
		ok = false
		r.printf("testreport: these packages ran no test (a -run that matches nothing?): %s\n", strings.Join(empty, ", "))
	}
	if len(badSkips) > 0 {
		ok = false
		r.println("testreport: these tests skipped, which this run does not allow (a variable not exported, a tool not built?):")
		for _, s := range badSkips {
			r.println("  " + s)
		}
	}
	r.failures()
	return ok
}

// failures prints, last, each failed test that has no failed subtest, with its first
// messages, and each failed package in which no test failed (a panic, a timeout, a
// verdict of its TestMain) with the last lines it printed.
func (r *report) failures() {
	var lines []string
	for _, name := range r.order {
		p := r.pkgs[name]
		failedNames := map[string]bool{}
		for _, t := range p.failedTests {
			failedNames[t.name] = true
		}
		leaves := 0
		for _, t := range p.failedTests {
			if hasFailedSubtest(t.name, failedNames) {
				continue
			}
			leaves++
			lines = append(lines, fmt.Sprintf("FAIL %s %s:", short(p.name), t.name))
			for _, m := range messages(t.lines) {
				lines = append(lines, "    "+m)
			}
		}
		var unended []string
		for _, t := range r.running {
			if t.pkg == p.name && p.action == "fail" {
				unended = append(unended, t.name)
			}
		}
		sort.Strings(unended)
		for _, t := range unended {
			leaves++
			lines = append(lines, fmt.Sprintf("FAIL %s %s: did not end (a panic or a timeout ended the package)", short(p.name), t))
		}
		if p.action == "fail" && leaves == 0 {
			lines = append(lines, fmt.Sprintf("FAIL %s, no test failed in it (its build, a panic, its TestMain); its last lines:", short(p.name)))
			for _, l := range p.tail {
				lines = append(lines, "    "+cut(l))
			}
		}
	}
	if len(lines) == 0 {
		return
	}
	r.println("testreport: what failed:")
	for _, l := range lines {
		r.println(l)
	}
}

func hasFailedSubtest(name string, failed map[string]bool) bool {
	for other := range failed {
		if strings.HasPrefix(other, name+"/") {
			return true
		}
	}
	return false
}

// location is the start of a message of the testing package: "    file_test.go:12: ".
var location = regexp.MustCompile(`^\s*[\w.-]+\.go:\d+: `)

// messages returns the last messages of a failed test (the lines that follow a
// file:line, cut; a failed assertion usually ends the test, after its logs), or its last
// lines if it has none.
func messages(lines []string) []string {
	var out []string
	for i := len(lines) - 1; i >= 0 && len(out) < messageLines; i-- {
		l := lines[i]
		if !location.MatchString(l) {
			continue
		}
		m := strings.TrimSpace(l)
		// A message's next lines (Gomega's "Expected …") are indented below it.
		for j := i + 1; j < len(lines) && j <= i+2 && !location.MatchString(lines[j]) && !strings.HasPrefix(strings.TrimSpace(lines[j]), "--- "); j++ {
			m += " " + strings.TrimSpace(lines[j])
		}
		out = append([]string{cut(m)}, out...)
	}
	if len(out) > 0 {
		return out
	}
	for _, l := range lines[max(0, len(lines)-messageLines):] {
		out = append(out, cut(strings.TrimSpace(l)))
	}
	return out
}

// skipReason returns what a skipped test said (its last message).
func skipReason(lines []string) string {
	if m := messages(lines); len(m) > 0 && m[0] != "" {
		return m[0]
	}
	return "skipped"
}

func cut(s string) string {
	if len(s) > messageLength {
		return s[:messageLength] + " …"
	}
	return s
}

// short drops the module path from a package's path.
func short(pkg string) string {
	const module = "github.com/vitistack/cluster-api-ipam-provider-vitistack/"
	return strings.TrimPrefix(pkg, module)
}
