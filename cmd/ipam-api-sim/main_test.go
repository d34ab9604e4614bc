package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
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
	g.Eventually(func() string {
		if m := listenLine.FindStringSubmatch(logs.String()); m != nil {
			inst.api = "http://" + m[1]
		}
		if m := debugLine.FindStringSubmatch(logs.String()); m != nil {
			inst.debug = "http://" + m[1]
		}
		return inst.api
	}).ShouldNot(BeEmpty(), "no listening line in %q", logs.String())
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
}
