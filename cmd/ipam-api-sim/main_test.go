package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type instance struct {
	api, debug string
	logs       *syncBuffer
	stop       func() error
}

var listenLine = regexp.MustCompile(`msg=listening address=(\S+)`)
var debugLine = regexp.MustCompile(`msg="debug listening" address=(\S+)`)

func start(t *testing.T, args ...string) *instance {
	t.Helper()
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, logs) }()
	inst := &instance{logs: logs}
	wantDebug := slices.Contains(args, "--debug-listen")
	g.Eventually(func() bool {
		if m := listenLine.FindStringSubmatch(logs.String()); m != nil {
			inst.api = "http://" + m[1]
		}
		if m := debugLine.FindStringSubmatch(logs.String()); m != nil {
			inst.debug = "http://" + m[1]
		}
		// Both listeners log their line; under load the second may come a moment later.
		return inst.api != "" && (!wantDebug || inst.debug != "")
	}).Should(BeTrue(), "no listening line in %q", logs.String())
	var once sync.Once
	var err error
	inst.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("run did not return after cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = inst.stop() })
	return inst
}

func do(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const reg = `{"secret":"cmd-test-secret-1","zone":"inet","ip_family":"ipv4","service":{"service_name":"web","namespace_id":"ns","cluster_id":"cl"}}`

func TestRegisterRoundTripStateFileAndDebug(t *testing.T) {
	g := NewWithT(t)
	state := filepath.Join(t.TempDir(), "state.json")
	args := []string{"--listen", "127.0.0.1:0", "--debug-listen", "127.0.0.1:0", "--state-file", state, "--sweep-interval", "1h"}

	first := start(t, args...)
	g.Expect(first.debug).NotTo(BeEmpty())
	status, body := do(t, http.MethodPost, first.api+"/v2/address", reg)
	g.Expect(status).To(Equal(200))
	g.Expect(body).To(Equal(`{"message":"Address registered successfully","address":"83.118.168.0/32"}`))

	status, body = do(t, http.MethodGet, first.debug+"/registrations", "")
	g.Expect(status).To(Equal(200))
	g.Expect(body).To(ContainSubstring(`"address": "83.118.168.0/32"`))
	status, body = do(t, http.MethodGet, first.debug+"/stats", "")
	g.Expect(status).To(Equal(200))
	g.Expect(body).To(MatchRegexp(`"POST /v2/address": \{\s+"200": 1`))

	raw, err := os.ReadFile(state)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(raw)).To(ContainSubstring("83.118.168.0/32"))
	g.Expect(string(raw)).NotTo(ContainSubstring("cmd-test-secret-1"))
	g.Expect(first.stop()).To(Succeed())

	logs := first.logs.String()
	g.Expect(logs).To(MatchRegexp(`msg=request method=POST path=/v2/address .*status=200 .*duration=`))
	g.Expect(logs).NotTo(ContainSubstring("cmd-test-secret-1"))
	g.Expect(logs).To(ContainSubstring("shutting down"))

	// A restart with the same state file knows the registration (case B, same address).
	second := start(t, args...)
	status, body = do(t, http.MethodPost, second.api+"/v2/address", reg)
	g.Expect(status).To(Equal(200))
	g.Expect(body).To(Equal(`{"message":"Address updated successfully","address":"83.118.168.0/32"}`))

	// Faults set through the debug listener reach the API listener.
	status, _ = do(t, http.MethodPut, second.debug+"/faults", `{"error_rate":1,"error_status":503,"error_body":"{\"message\":\"maintenance\"}"}`)
	g.Expect(status).To(Equal(200))
	status, body = do(t, http.MethodPost, second.api+"/v2/address", reg)
	g.Expect(status).To(Equal(503))
	g.Expect(body).To(Equal(`{"message":"maintenance"}`))
}

func TestDebugListenerIsOffByDefaultAndZonesFileIsUsed(t *testing.T) {
	g := NewWithT(t)
	zones := filepath.Join(t.TempDir(), "zones.yaml")
	g.Expect(os.WriteFile(zones, []byte("zones:\n- name: lab\n  ipv4: [192.0.2.0/24]\n"), 0o600)).To(Succeed())
	inst := start(t, "--listen", "127.0.0.1:0", "--zones", zones, "--latency", "1ms")
	g.Expect(inst.logs.String()).NotTo(ContainSubstring("debug listening"))
	_, body := do(t, http.MethodPost, inst.api+"/v2/address", strings.Replace(reg, `"inet"`, `"lab"`, 1))
	g.Expect(body).To(Equal(`{"message":"Address registered successfully","address":"192.0.2.0/32"}`))
	_, body = do(t, http.MethodPost, inst.api+"/v2/address", reg)
	g.Expect(body).To(Equal(`{"message":"invalid zone 'inet', must be one of: 'lab'"}`))
}

func TestBadArguments(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	var out bytes.Buffer
	g.Expect(run(ctx, []string{"--zones", filepath.Join(t.TempDir(), "missing.json")}, &out)).To(MatchError(ContainSubstring("reading zone file")))
	g.Expect(run(ctx, []string{"--no-such-flag"}, &out)).To(HaveOccurred())
	g.Expect(run(ctx, []string{"--sweep-interval", "0s"}, &out)).To(HaveOccurred())
	g.Expect(run(ctx, []string{"--listen", "256.0.0.1:1"}, &out)).To(HaveOccurred())
	g.Expect(run(ctx, []string{"--prefix-load-delay", "-1s"}, &out)).To(MatchError(ContainSubstring("--prefix-load-delay must not be negative")))
}

// --help and -h print the usage, with every flag and every debug route, and succeed.
func TestHelpSucceedsAndListsTheDebugRoutes(t *testing.T) {
	for _, arg := range []string{"--help", "-h", "-help"} {
		t.Run(arg, func(t *testing.T) {
			g := NewWithT(t)
			var out bytes.Buffer
			g.Expect(run(context.Background(), []string{arg}, &out)).To(Succeed())
			help := out.String()
			for _, flag := range []string{"-listen", "-zones", "-sweep-interval", "-latency", "-latency-jitter", "-state-file", "-debug-listen", "-prefix-load-delay"} {
				g.Expect(help).To(ContainSubstring("  "+flag+" "), flag)
			}
			g.Expect(sim.DebugRoutes()).To(HaveLen(7))
			for _, rt := range sim.DebugRoutes() {
				g.Expect(help).To(MatchRegexp(`(?m)^  ` + rt.Method + ` +` + regexp.QuoteMeta(rt.Path) + ` +` + regexp.QuoteMeta(rt.Doc) + `$`))
			}
			for _, field := range []string{"netbox_down", "netbox_body", "prefixes_loading", "mongo_down", "mongo_hang"} {
				g.Expect(help).To(ContainSubstring(field))
			}
		})
	}
}

// The process exits 0 after --help (not 1 with the flag package's "flag: help requested"), and
// its usage lists every route of sim.DebugRoutes with method, path and doc.
func TestHelpExitCode(t *testing.T) {
	if os.Getenv("IPAM_API_SIM_TEST_MAIN") == "1" {
		os.Args = []string{"ipam-api-sim", "--help"}
		main()
		return
	}
	g := NewWithT(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelpExitCode$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IPAM_API_SIM_TEST_MAIN=1")
	out, err := cmd.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "%s", out)
	g.Expect(string(out)).To(ContainSubstring("Routes of the debug listener"))
	g.Expect(string(out)).NotTo(ContainSubstring("help requested"))
	g.Expect(sim.DebugRoutes()).NotTo(BeEmpty())
	for _, rt := range sim.DebugRoutes() {
		g.Expect(string(out)).To(MatchRegexp(`(?m)^  `+regexp.QuoteMeta(rt.Method)+` +`+regexp.QuoteMeta(rt.Path)+` +`+regexp.QuoteMeta(rt.Doc)+`$`),
			"%s %s is missing from the --help output", rt.Method, rt.Path)
	}
}

// The backend failures are set through the debug listener (as the process-level e2e
// does) and the prefix load delay is a flag.
func TestBackendFailuresThroughTheProcess(t *testing.T) {
	g := NewWithT(t)
	inst := start(t, "--listen", "127.0.0.1:0", "--debug-listen", "127.0.0.1:0", "--prefix-load-delay", "2s")
	status, body := do(t, http.MethodPost, inst.api+"/v2/address", reg)
	g.Expect(status).To(Equal(400))
	g.Expect(body).To(Equal(`{"message":"no prefixes found for zone inet with IP family ipv4"}`))
	g.Eventually(func() string {
		_, body := do(t, http.MethodPost, inst.api+"/v2/address", reg)
		return body
	}).WithTimeout(10 * time.Second).WithPolling(100 * time.Millisecond).Should(Equal(`{"message":"Address registered successfully","address":"83.118.168.0/32"}`))
	backendFailures := func() int {
		_, body := do(t, http.MethodGet, inst.debug+"/stats", "")
		var st sim.Stats
		g.Expect(json.Unmarshal([]byte(body), &st)).To(Succeed())
		return st.BackendFailures
	}
	loading := backendFailures()
	g.Expect(loading).To(BeNumerically(">=", 1))

	status, _ = do(t, http.MethodPut, inst.debug+"/faults", `{"netbox_down":true,"netbox_body":"no healthy upstream"}`)
	g.Expect(status).To(Equal(200))
	status, body = do(t, http.MethodDelete, inst.api+"/v2/service", strings.Replace(reg, `"ip_family":"ipv4",`, `"ip_family":"ipv4","address":"83.118.168.0/32",`, 1))
	g.Expect(status).To(Equal(400))
	g.Expect(body).To(Equal(`{"message":"failed to fetch zones: no healthy upstream"}`))

	status, _ = do(t, http.MethodPut, inst.debug+"/faults", `{"mongo_down":true,"mongo_hang":"10ms"}`)
	g.Expect(status).To(Equal(200))
	status, body = do(t, http.MethodPost, inst.api+"/v2/address", reg)
	g.Expect(status).To(Equal(500))
	g.Expect(body).To(HavePrefix(`{"message":"failed to query address documents: server selection error: `))
	g.Expect(backendFailures()).To(Equal(loading + 2))
	g.Expect(inst.logs.String()).To(ContainSubstring("outcome=mongo-down"))

	// POST /reset clears the faults and starts the prefix load delay again.
	status, _ = do(t, http.MethodPost, inst.debug+"/reset", "")
	g.Expect(status).To(Equal(200))
	_, body = do(t, http.MethodPost, inst.api+"/v2/address", reg)
	g.Expect(body).To(Equal(`{"message":"no prefixes found for zone inet with IP family ipv4"}`))
}
