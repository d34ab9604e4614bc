package e2e

import (
	"context"
	"flag"
	"fmt"
	. "github.com/onsi/gomega"
	"os"
	"path/filepath"
	"regexp"
	"slices"
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
		// No test runs: make's test targets count that as a failure (hack/testreport).
		fmt.Println("e2e: skipped: run through 'make test' or 'make test-e2e', which build the release artifacts and set E2E_REPOSITORY")
		os.Exit(0)
	}
	ctrl.SetLogger(logr.Discard()) // envtest's own chatter; the processes log to files
	// The lanes (onA, onOwn), not -parallel, keep the tests apart: a test waiting for its
	// lane must not hold one of GOMAXPROCS's slots from the other lane.
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		_ = flag.Set("test.parallel", "64")
	}
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
	// What fails the suite beyond its tests, said last: CI shows the end of the output.
	var problems []string
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
			// The end of every manager's log. The files stay.
			logs, _ := filepath.Glob(filepath.Join(workDir, "*", "manager*.log"))
			for _, f := range logs {
				b, err := os.ReadFile(f)
				if err != nil {
					fmt.Fprintf(os.Stderr, "e2e: reading %s: %v\n", f, err)
					continue
				}
				fmt.Fprintf(os.Stderr, "e2e: last lines of %s:\n%s\n", f, tail(string(b), 40))
			}
			fmt.Fprintf(os.Stderr, "e2e: logs kept in %s\n", workDir)
			for _, p := range problems {
				fmt.Fprintln(os.Stderr, "e2e:", p)
			}
			return
		}
		if os.Getenv("E2E_KEEP") == "" {
			_ = os.RemoveAll(workDir)
		}
	}()
	start := time.Now()
	if err := setup(ctx); err != nil {
		problems = append(problems, fmt.Sprintf("setting up: %v", err))
		return code
	}
	fmt.Printf("e2e: control plane, clusterctl init and manager ready in %s (logs in %s)\n", time.Since(start).Round(time.Millisecond), workDir)
	code = m.Run()
	writeChaosSummary()
	// The managers ran as their ServiceAccount: a permission its RBAC lacks shows here.
	logs, _ := filepath.Glob(filepath.Join(a.Dir, "manager*.log"))
	for _, f := range logs {
		b, err := os.ReadFile(f)
		if err != nil {
			problems, code = append(problems, fmt.Sprintf("reading %s: %v", f, err)), 1
			continue
		}
		if refused := rbacRefusals(string(b), a.Outages); len(refused) > 0 {
			problems = append(problems, fmt.Sprintf("a manager was refused a request by RBAC (%s); see %s", refused[0], f))
			code = 1
		}
	}
	// Nothing the API servers were asked to call left this machine: every webhook
	// configuration and CRD conversion left installed points at 127.0.0.1.
	logs, _ = filepath.Glob(filepath.Join(workDir, "*", "kube-apiserver.log"))
	for _, f := range logs {
		b, err := os.ReadFile(f)
		if err != nil {
			problems, code = append(problems, fmt.Sprintf("reading %s: %v", f, err)), 1
			continue
		}
		if calls := callsOffMachine(string(b)); len(calls) > 0 {
			problems = append(problems, fmt.Sprintf("the API server called a Service address %d times, the first: %s; see %s", len(calls), calls[0], f))
			code = 1
		}
	}
	return code
}

// callOffMachine matches an API server's log line about a call to a webhook or
// conversion webhook by its Service name: the API server resolves it to the Service's
// ClusterIP, which no process on this machine serves. (A webhook routed to 127.0.0.1
// is called by URL; its failures, while a manager is killed, are not such calls.)
var callOffMachine = regexp.MustCompile(`\.svc(\.cluster\.local)?(:[0-9]+)?/`)

// callsOffMachine returns the lines of an API server's log that show such calls.
func callsOffMachine(log string) []string {
	var out []string
	for line := range strings.Lines(log) {
		if callOffMachine.MatchString(line) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// rbacRefusals returns the log lines in which RBAC refused a request, but for those
// logged while the API server was restarting (until it is ready, its RBAC caches are
// empty and it refuses everyone).
func rbacRefusals(log string, outages []localcluster.Outage) []string {
	var out []string
	for line := range strings.Lines(log) {
		if !rbacRefusal.MatchString(line) {
			continue
		}
		at, ok := klogTime(line)
		if ok && slices.ContainsFunc(outages, func(o localcluster.Outage) bool {
			return !at.Before(o.From) && !at.After(o.To.Add(2*time.Second))
		}) {
			continue
		}
		out = append(out, strings.TrimSpace(line))
	}
	return out
}

// klogTime reads the time of a klog line ("E1123 16:17:23.815729 ..."), logged on
// this host this year.
func klogTime(line string) (time.Time, bool) {
	if len(line) < 21 {
		return time.Time{}, false
	}
	t, err := time.ParseInLocation("0102 15:04:05.000000", line[1:21], time.Local)
	if err != nil {
		return time.Time{}, false
	}
	return t.AddDate(time.Now().Year(), 0, 0), true
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
	stands.Store(a, ipamAPI)
	if initOut, err = a.Init(ctx, providerVars(ipamAPI)); err != nil {
		return err
	}
	aMgr, err = a.StartManager(ctx, nil)
	return err
}

// providerVars are the clusterctl variables the suite installs the provider with, talking to api.
func providerVars(api *localcluster.Sim) map[string]string {
	return map[string]string{
		"VITISTACK_IPAM_API_URL":              api.URL,
		"VITISTACK_LOG_LEVEL":                 "2",
		"VITISTACK_MAX_CONCURRENT_RECONCILES": "5",
	}
}

// TestRBACRefusalDetector keeps the suite's log checks honest: the RBAC check must see
// a refusal and must not mistake other 403s for one; the check of calls off the machine
// must see a conversion webhook's call, and not a webhook routed to 127.0.0.1.
func TestRBACRefusalDetector(t *testing.T) {
	g := newG(t)
	refusal := `E1123 16:17:23.815729    3809 controller.go:494] "Reconciler error" err="secrets is forbidden: User \"system:serviceaccount:capi-ipam-vitistack-system:capi-ipam-vitistack-manager\" cannot create resource \"secrets\" in API group \"\" in the namespace \"ipam-system\""` + "\n"
	terminating := `E1123 16:17:23.815729    3809 event_broadcaster.go:270] "Server rejected event (will not retry!)" err="events.events.k8s.io \"node-53.18ea\" is forbidden: unable to create new content in namespace burst because it is being terminated"` + "\n"
	g.Expect(rbacRefusals(refusal+terminating, nil)).To(HaveLen(1))
	g.Expect(rbacRefusals(terminating, nil)).To(BeEmpty())
	// And the check that no call left the machine.
	conversion := `E1124 20:45:30.293834   26792 watcher.go:664] failed to prepare current and previous objects: conversion webhook for ipam.cluster.x-k8s.io/v1beta2, Kind=IPAddressClaim failed: Post "https://capi-webhook-service.capi-system.svc:443/convert?timeout=30s": tls: failed to verify certificate` + "\n"
	local := `W1124 22:05:24.633557   23011 dispatcher.go:217] Failed calling webhook, failing closed validation.service.ipam.vitistack.io: failed calling webhook "validation.service.ipam.vitistack.io": failed to call webhook: Post "https://127.0.0.1:43437/validate--v1-service?timeout=5s": read: connection reset by peer` + "\n"
	g.Expect(callsOffMachine(conversion + local)).To(HaveLen(1))
	g.Expect(callsOffMachine(local)).To(BeEmpty())
	// And the quickstart's check for recurring errors: the same message three times.
	g.Expect(recurringErrors(conversion+conversion+local+conversion, 3)).To(ConsistOf(HavePrefix("3× failed to prepare current and previous objects: conversion webhook")))
	g.Expect(recurringErrors(conversion+conversion+local, 3)).To(BeEmpty())
	// While the API server restarts, RBAC refuses everyone: not the provider's RBAC.
	at := time.Date(time.Now().Year(), 11, 23, 16, 17, 23, 815729000, time.Local)
	g.Expect(rbacRefusals(refusal, []localcluster.Outage{{From: at.Add(-10 * time.Second), To: at.Add(-time.Second)}})).To(BeEmpty())
	g.Expect(rbacRefusals(refusal, []localcluster.Outage{{From: at.Add(-time.Minute), To: at.Add(-10 * time.Second)}})).To(HaveLen(1))
}
