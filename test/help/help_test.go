package help_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// usageLine and flagLine are what every usage has: the word "usage" and at least one
// indented flag ("  -listen string", "      --cluster-id string", "  -h, -help").
var (
	usageLine = regexp.MustCompile(`(?i)usage`)
	flagLine  = regexp.MustCompile(`(?m)^\s+--?[A-Za-z][\w-]*`)
)

// Every main package of the module answers --help and -h with its usage and exit code
// 0, and does nothing else: it runs in an empty directory with only PATH and a
// temporary HOME set (asking for help must not need a cluster, a kubeconfig or any
// variable), must not write there, and must return within the timeout (a binary that
// ignored --help would start serving).
func TestEveryBinaryAnswersHelp(t *testing.T) {
	if testing.Short() {
		// Warm, the links alone take ~10 s on 2 cores; with a cold build cache it compiles
		// the manager and all its dependencies, minutes (make test builds them before).
		t.Skip("builds every binary of the repository; skipped with -short")
	}
	g := NewWithT(t)
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH; it is needed to list and build the binaries")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	g.Expect(err).NotTo(HaveOccurred())
	goCmd := func(args ...string) string {
		cmd := exec.Command(goTool, args...)
		cmd.Dir = root
		// Static, as make build builds them (with -trimpath below): the compiled
		// dependencies come from that build, not from a second compile with cgo.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		g.Expect(err).NotTo(HaveOccurred(), "go %s: %s", strings.Join(args, " "), stderr.String())
		return string(out)
	}

	module := strings.TrimSpace(goCmd("list", "-m"))
	pkgs := strings.Fields(goCmd("list", "-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`, "./..."))
	// A sanity check of the listing: these two are certainly binaries.
	g.Expect(pkgs).To(ContainElements(module+"/cmd/manager", module+"/cmd/ipam-api-sim"))

	// One 'go build' for all of them: the compiled packages come from the build cache and
	// the links run in parallel. "-o DIR/" names each binary after its import path's last
	// element, so two binaries with one name would overwrite each other.
	bin := t.TempDir()
	names := map[string]string{}
	for _, p := range pkgs {
		name := path.Base(p)
		g.Expect(names).NotTo(HaveKey(name), "%s and %s both build a binary %q; the test cannot tell them apart", names[name], p, name)
		names[name] = p
	}
	goCmd(append([]string{"build", "-trimpath", "-o", bin + string(filepath.Separator)}, pkgs...)...)

	for _, p := range pkgs {
		exe := filepath.Join(bin, path.Base(p))
		t.Run(strings.TrimPrefix(p, module+"/"), func(t *testing.T) {
			for _, arg := range []string{"--help", "-h"} {
				t.Run(arg, func(t *testing.T) {
					g := NewWithT(t)
					dir := t.TempDir()
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					cmd := exec.CommandContext(ctx, exe, arg)
					cmd.Dir = dir
					cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
					cmd.WaitDelay = 5 * time.Second
					out, err := cmd.CombinedOutput()
					g.Expect(ctx.Err()).NotTo(HaveOccurred(), "%s %s did not return within a minute; output: %s", p, arg, out)
					var exit *exec.ExitError
					if errors.As(err, &exit) {
						t.Fatalf("%s %s exited with %d, want 0 (print the usage and exit 0); output:\n%s", p, arg, exit.ExitCode(), out)
					}
					g.Expect(err).NotTo(HaveOccurred(), "running %s %s", p, arg)
					g.Expect(string(out)).To(MatchRegexp(usageLine.String()), "%s %s printed no usage:\n%s", p, arg, out)
					g.Expect(string(out)).To(MatchRegexp(flagLine.String()), "%s %s names no flag in its usage:\n%s", p, arg, out)
					entries, err := os.ReadDir(dir)
					g.Expect(err).NotTo(HaveOccurred())
					g.Expect(entries).To(BeEmpty(), "%s %s wrote into its working directory", p, arg)
				})
			}
		})
	}
}
