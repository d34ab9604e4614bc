package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The report of real go test runs of testdata/fixture: what CI's log ends with, and the
// exit code that decides whether the run is green.
func TestReport(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("the go command is not on PATH")
	}
	bin := filepath.Join(t.TempDir(), "testreport")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building testreport: %v\n%s", err, out)
	}
	run := func(fixture string, args ...string) (string, int) {
		t.Helper()
		args = append(args, "--", "go", "test", "-json", "-count=1", "./testdata/fixture")
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "FIXTURE="+fixture)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return string(out), 0
		case errors.As(err, &exit):
			return string(out), exit.ExitCode()
		}
		t.Fatalf("running testreport: %v\n%s", err, out)
		return "", 0
	}
	mustContain := func(out string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("the report lacks %q:\n%s", w, out)
			}
		}
	}
	mustNotContain := func(out string, unwanted ...string) {
		t.Helper()
		for _, w := range unwanted {
			if strings.Contains(out, w) {
				t.Errorf("the report has %q:\n%s", w, out)
			}
		}
	}

	// Every test passed, a skip allowed: green, with the counts.
	out, code := run("pass", "-allow-skip", "TestSkips$", "-require-tests")
	if code != 0 {
		t.Errorf("a passing run with an allowed skip exited %d:\n%s", code, out)
	}
	mustContain(out, "(ran 4, passed 3, skipped 1)", "tests (with subtests) ran 4, passed 3, failed 0, skipped 1")
	mustNotContain(out, "not shown", "=== RUN", "what failed", "--- TestPasses (")
	// With -times, how long each top-level test that passed took, not its subtests.
	out, _ = run("pass", "-allow-skip", "TestSkips$", "-times")
	mustContain(out, "--- TestPasses (0.0s)", "--- TestParent (")
	mustNotContain(out, "--- TestParent/")

	// The same run without the allowance: the skip fails it, and says which test and why.
	out, code = run("pass")
	if code == 0 {
		t.Errorf("a run with a skip that is not allowed exited 0:\n%s", out)
	}
	mustContain(out, "testreport: these tests skipped", "hack/testreport/testdata/fixture TestSkips: fixture_test.go:23: FIXTURE_TOOL is not set")

	// A -run that matches nothing, with -require-tests.
	cmd := exec.Command(bin, "-require-tests", "--", "go", "test", "-json", "-count=1", "-run", "^TestNothing$", "./testdata/fixture")
	b, err := cmd.CombinedOutput()
	if err == nil {
		t.Errorf("a package that ran no test passed with -require-tests:\n%s", b)
	}
	mustContain(string(b), "these packages ran no test (a -run that matches nothing?): hack/testreport/testdata/fixture")
	cmd = exec.Command(bin, "-require-tests", "-allow-no-tests", "/testdata/fixture$", "--", "go", "test", "-json", "-count=1", "-run", "^TestNothing$", "./testdata/fixture")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("a package -allow-no-tests names failed for running no test: %v\n%s", err, b)
	}

	// A failed subtest: go test's exit code, and its message is last, with its next line.
	out, code = run("fail", "-allow-skip", "TestSkips$")
	if code == 0 {
		t.Errorf("a run with a failed test exited 0:\n%s", out)
	}
	tail := out[strings.Index(out, "testreport: what failed:"):]
	mustContain(tail, "FAIL hack/testreport/testdata/fixture TestParent/child:\n    fixture_test.go:28: the address was handed out twice: 10.0.0.1 to a and b")
	mustNotContain(tail, "FAIL hack/testreport/testdata/fixture TestParent:")

	// A package that failed after its tests passed: its last lines.
	out, code = run("main", "-allow-skip", "TestSkips$")
	if code == 0 {
		t.Errorf("a run whose TestMain failed exited 0:\n%s", out)
	}
	mustContain(out, "FAIL hack/testreport/testdata/fixture, no test failed in it (its build, a panic, its TestMain); its last lines:\n    fixture: the suite found a leak after its tests")
}
