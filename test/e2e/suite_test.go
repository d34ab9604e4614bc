package e2e

import (
	"context"
	"fmt"
	. "github.com/onsi/gomega"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

// The suite's control plane "a", with the provider installed and its manager running;
// the move test starts a second one.
var (
	paths   localcluster.Paths
	workDir string
	ipamAPI *localcluster.Sim
	a       *localcluster.ControlPlane
	aMgr    *localcluster.Manager
	initOut string
)

func TestMain(m *testing.M) {
	var ok bool
	if paths, ok = localcluster.PathsFromEnv(); !ok {
		fmt.Println("e2e: skipped: run through 'make test' or 'make test-e2e', which build the release artifacts and set E2E_REPOSITORY")
		os.Exit(0)
	}
	ctrl.SetLogger(logr.Discard()) // envtest's own chatter; the processes log to files
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if err := paths.Check(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	var err error
	if workDir, err = os.MkdirTemp("", "e2e-"); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	ctx := context.Background()
	code := 1
	defer func() {
		if aMgr != nil {
			aMgr.Stop()
		}
		if a != nil {
			a.Stop()
		}
		if ipamAPI != nil {
			ipamAPI.Stop()
		}
		if code != 0 {
			// What CI shows: the end of every manager's log. The files stay.
			logs, _ := filepath.Glob(filepath.Join(workDir, "*", "manager*.log"))
			for _, f := range logs {
				b, _ := os.ReadFile(f)
				fmt.Fprintf(os.Stderr, "e2e: last lines of %s:\n%s\n", f, tail(string(b), 40))
			}
			fmt.Fprintf(os.Stderr, "e2e: logs kept in %s\n", workDir)
			if f := failures.String(); f != "" {
				fmt.Fprintf(os.Stderr, "e2e: the failed assertions again:\n%s\n", f)
			}
			return
		}
		if os.Getenv("E2E_KEEP") == "" {
			_ = os.RemoveAll(workDir)
		}
	}()
	start := time.Now()
	if err := setup(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: setting up: %v\n", err)
		return code
	}
	fmt.Printf("e2e: control plane, clusterctl init and manager ready in %s (logs in %s)\n", time.Since(start).Round(time.Millisecond), workDir)
	code = m.Run()
	writeChaosSummary()
	// The managers ran as their ServiceAccount: a permission its RBAC lacks shows here.
	logs, _ := filepath.Glob(filepath.Join(a.Dir, "manager*.log"))
	for _, f := range logs {
		if b, _ := os.ReadFile(f); rbacRefusal.Match(b) {
			fmt.Fprintf(os.Stderr, "e2e: a manager was refused a request by RBAC (%s); see %s\n", rbacRefusal.Find(b), f)
			code = 1
		}
	}
	return code
}

// rbacRefusal matches the API server's answer when RBAC refuses a request ("… is
// forbidden: User "system:serviceaccount:…" cannot create resource …"), and not its other
// 403s, such as an event refused in a namespace that is being deleted.
var rbacRefusal = regexp.MustCompile(`is forbidden: User \\?"[^"]+" cannot [a-z]+ resource`)

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func setup(ctx context.Context) error {
	var err error
	if ipamAPI, err = localcluster.StartSim(workDir, paths, nil); err != nil {
		return err
	}
	if a, err = localcluster.StartControlPlane(workDir, "a", paths); err != nil {
		return err
	}
	if initOut, err = a.Init(ctx, providerVars()); err != nil {
		return err
	}
	aMgr, err = a.StartManager(ctx, nil)
	return err
}

// providerVars are the clusterctl variables the suite installs the provider with.
func providerVars() map[string]string {
	return map[string]string{
		"VITISTACK_IPAM_API_URL":              ipamAPI.URL,
		"VITISTACK_LOG_LEVEL":                 "2",
		"VITISTACK_MAX_CONCURRENT_RECONCILES": "5",
	}
}

// TestRBACRefusalDetector keeps the suite's RBAC check honest: it must see a refusal
// and must not mistake other 403s for one.
func TestRBACRefusalDetector(t *testing.T) {
	g := newG(t)
	g.Expect(rbacRefusal.MatchString(`E1123 "Reconciler error" err="secrets is forbidden: User \"system:serviceaccount:capi-ipam-vitistack-system:capi-ipam-vitistack-manager\" cannot create resource \"secrets\" in API group \"\" in the namespace \"ipam-system\""`)).To(BeTrue())
	g.Expect(rbacRefusal.MatchString(`E1123 "Server rejected event (will not retry!)" err="events.events.k8s.io \"node-53.18ea\" is forbidden: unable to create new content in namespace burst because it is being terminated"`)).To(BeFalse())
}
