package sim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

func TestOverlappingFirstRegistrationsLeakAndAreCounted(t *testing.T) {
	g := NewWithT(t)
	s, url := startSim(t, sim.Config{})
	g.Expect(s.SetLatency(400*time.Millisecond, 0)).To(Succeed())

	var wg sync.WaitGroup
	answers := make([]answer, 2)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "", "svc", 0))
		}()
	}
	wg.Wait()

	g.Expect([]string{answers[0].body, answers[1].body}).To(ConsistOf(
		registered("83.118.168.0/32"), registered("83.118.168.1/32")))
	held := s.HeldBy(ref("svc"))
	g.Expect(held).To(HaveLen(2))
	g.Expect(s.Stats().OverlappingRegistrations).To(Equal(1))

	// A later re-POST returns one of them (the first stored), the other one leaked.
	g.Expect(s.SetLatency(0, 0)).To(Succeed())
	a := call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "", "svc", 0))
	g.Expect(a.body).To(Equal(updated(held[0].Address)))
	g.Expect(s.Stats().OverlappingRegistrations).To(Equal(1), "sequential POSTs are no overlap")
}

func TestDualStackInParallelIsNoOverlap(t *testing.T) {
	g := NewWithT(t)
	s, url := startSim(t, sim.Config{})
	g.Expect(s.SetLatency(200*time.Millisecond, 0)).To(Succeed())
	var wg sync.WaitGroup
	for _, fam := range []string{"ipv4", "ipv6"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", fam, "", "svc", 0))
		}()
	}
	wg.Wait()
	g.Expect(s.HeldBy(ref("svc"))).To(HaveLen(2))
	g.Expect(s.Stats().OverlappingRegistrations).To(Equal(0))
}

func TestSweeperExpiresHoldersOnTheFakeClock(t *testing.T) {
	g := NewWithT(t)
	clk := clocktesting.NewFakeClock(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC))
	s := sim.New(sim.Config{Clock: clk})

	g.Expect(serve(s, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", "", "a", 0)).body).To(Equal(registered("83.118.168.0/32")))
	g.Expect(serve(s, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", "83.118.168.0/32", "b", 0)).body).To(Equal(updated("83.118.168.0/32")))

	// a releases with 1 day of retention, b with 0.
	g.Expect(serve(s, http.MethodDelete, "/v2/service", body(secretA, "inet", "ipv4", "83.118.168.0/32", "a", 1)).status).To(Equal(http.StatusOK))
	g.Expect(serve(s, http.MethodDelete, "/v2/service", body(secretA, "inet", "ipv4", "83.118.168.0/32", "b", 0)).status).To(Equal(http.StatusOK))
	hs := s.Holders("83.118.168.0/32")
	g.Expect(hs).To(HaveLen(2))
	g.Expect(*hs[0].ExpiresAt).To(Equal(clk.Now().AddDate(0, 0, 1)))

	expired, freed := s.Sweep()
	g.Expect([]int{expired, freed}).To(Equal([]int{1, 0}), "b expires at once, a holds on")
	g.Expect(s.Holders("83.118.168.0/32")).To(HaveLen(1))

	clk.Step(24*time.Hour - time.Second)
	expired, freed = s.Sweep()
	g.Expect([]int{expired, freed}).To(Equal([]int{0, 0}))

	clk.Step(time.Second)
	expired, freed = s.Sweep()
	g.Expect([]int{expired, freed}).To(Equal([]int{1, 1}))
	g.Expect(s.Registrations()).To(BeEmpty())
	g.Expect(s.Stats().Freed).To(Equal(map[string]int{"83.118.168.0/32": 1}), "the stats say which address was freed")

	// The freed address goes to the next claimant, even with another secret.
	g.Expect(serve(s, http.MethodPost, "/v2/address", body(secretB, "inet", "ipv4", "", "c", 0)).body).To(Equal(registered("83.118.168.0/32")))
}

func TestRunSweepsOnEveryTick(t *testing.T) {
	g := NewWithT(t)
	clk := clocktesting.NewFakeClock(time.Now())
	s := sim.New(sim.Config{Clock: clk, SweepInterval: 30 * time.Second})
	serve(s, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", "", "a", 0))
	serve(s, http.MethodDelete, "/v2/service", body(secretA, "inet", "ipv4", "83.118.168.0/32", "a", 0))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	g.Eventually(clk.HasWaiters).Should(BeTrue())
	g.Expect(s.Registrations()).To(HaveLen(1), "nothing is swept before the first tick")
	clk.Step(30 * time.Second)
	g.Eventually(s.Registrations).Should(BeEmpty())
	cancel()
	g.Eventually(done).Should(Receive(BeNil()))
}

func TestStateFileSurvivesRestartWithoutSecrets(t *testing.T) {
	g := NewWithT(t)
	path := filepath.Join(t.TempDir(), "state.json")
	s1 := sim.New(sim.Config{StateFile: path})
	g.Expect(serve(s1, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", "", "a", 3)).body).To(Equal(registered("83.118.168.0/32")))
	g.Expect(serve(s1, http.MethodPost, "/v2/address", body(secretB, "hnet-private", "ipv4", "10.9.8.7/32", "b", 0)).body).To(Equal(registered("10.9.8.7/32")))
	g.Expect(serve(s1, http.MethodDelete, "/v2/service", body(secretB, "hnet-private", "ipv4", "10.9.8.7/32", "b", 2)).status).To(Equal(http.StatusOK))

	raw, err := os.ReadFile(path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(raw)).NotTo(ContainSubstring(secretA))
	g.Expect(string(raw)).NotTo(ContainSubstring(secretB))
	g.Expect(string(raw)).NotTo(ContainSubstring(`"state"`), "the holder state is derived, never persisted")
	for _, r := range s1.ExportState().Registrations {
		for _, h := range r.Holders {
			g.Expect(h.State).To(BeEmpty(), "ExportState holds no derived state")
		}
	}
	entries, err := os.ReadDir(filepath.Dir(path))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(entries).To(HaveLen(1), "no temporary files are left behind")

	s2 := sim.New(sim.Config{StateFile: path})
	g.Expect(s2.Registrations()).To(Equal(s1.Registrations()))
	// The restored secret hash still authenticates, and allocation continues after the restored address.
	g.Expect(serve(s2, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", "", "a", 3)).body).To(Equal(updated("83.118.168.0/32")))
	g.Expect(serve(s2, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", "", "new", 0)).body).To(Equal(registered("83.118.168.1/32")))
	g.Expect(serve(s2, http.MethodPost, "/v2/address", body(secretA, "hnet-private", "ipv4", "10.9.8.7/32", "x", 0)).body).
		To(Equal(`{"message":"Could not register address: no matching address found with the provided secret, zone and address"}`))

	_, err = sim.NewServer(sim.Config{StateFile: filepath.Join(t.TempDir(), "missing.json")})
	g.Expect(err).NotTo(HaveOccurred(), "a missing state file is an empty state")
	bad := filepath.Join(t.TempDir(), "bad.json")
	g.Expect(os.WriteFile(bad, []byte(`{"version":1,"registrations":[{"address":"10.0.0.1","zone":"x","ip_family":"ipv4","secret_sha256":"00","holders":[]}]}`), 0o600)).To(Succeed())
	_, err = sim.NewServer(sim.Config{StateFile: bad})
	g.Expect(err).To(HaveOccurred())
}

func TestAllocationMovesToTheNextContainerWhenFull(t *testing.T) {
	g := NewWithT(t)
	clk := clocktesting.NewFakeClock(time.Now())
	s := sim.New(sim.Config{Clock: clk, Zones: []sim.Zone{{Name: "z", IPv4: []string{"10.0.0.0/31", "192.168.7.4/30"}}}})
	var got []string
	for i := range 6 {
		a := serve(s, http.MethodPost, "/v2/address", body(secretA, "z", "ipv4", "", fmt.Sprintf("svc-%d", i), 0))
		g.Expect(a.status).To(Equal(http.StatusOK), a.body)
		var out struct{ Address string }
		g.Expect(json.Unmarshal([]byte(a.body), &out)).To(Succeed())
		got = append(got, out.Address)
	}
	g.Expect(got).To(Equal([]string{"10.0.0.0/32", "10.0.0.1/32", "192.168.7.4/32", "192.168.7.5/32", "192.168.7.6/32", "192.168.7.7/32"}))

	a := serve(s, http.MethodPost, "/v2/address", body(secretA, "z", "ipv4", "", "svc-6", 0))
	g.Expect(a.status).To(Equal(http.StatusInternalServerError))
	g.Expect(a.body).To(Equal(`{"message":"Could not register address: no available prefix found for zone z_v4"}`))
	g.Expect(serve(s, http.MethodPost, "/v2/address", body(secretA, "z", "ipv6", "", "svc-6", 0)).body).
		To(Equal(`{"message":"no prefixes found for zone z with IP family ipv6"}`))
	g.Expect(serve(s, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", "", "svc-6", 0)).body).
		To(Equal(`{"message":"invalid zone 'inet', must be one of: 'z'"}`))

	// Freeing an address in the first container makes it the next one handed out.
	serve(s, http.MethodDelete, "/v2/service", body(secretA, "z", "ipv4", "10.0.0.1/32", "svc-1", 0))
	s.Sweep()
	g.Expect(serve(s, http.MethodPost, "/v2/address", body(secretA, "z", "ipv4", "", "svc-6", 0)).body).To(Equal(registered("10.0.0.1/32")))
}

func TestBigContainerAllocatesThousandsInOrder(t *testing.T) {
	g := NewWithT(t)
	s := sim.New(sim.Config{})
	seen := map[string]bool{}
	for i := range 1000 {
		a := serve(s, http.MethodPost, "/v2/address", body(secretA, "hnet-private", "ipv4", "", fmt.Sprintf("svc-%d", i), 0))
		want := fmt.Sprintf("10.0.%d.%d/32", i/256, i%256)
		if a.body != registered(want) {
			t.Fatalf("allocation %d: got %s, want %s", i, a.body, want)
		}
		seen[want] = true
	}
	g.Expect(seen).To(HaveLen(1000))
	g.Expect(s.Registrations()).To(HaveLen(1000))
}

func TestZoneFileYAMLAndJSON(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	js := filepath.Join(dir, "zones.json")
	g.Expect(os.WriteFile(js, []byte(`{"zones":[{"name":"lab","ipv4":["192.0.2.0/24"],"ipv6":["2001:db8::/64"]},{"name":"edge","ipv4":["198.51.100.0/24"]}]}`), 0o600)).To(Succeed())
	yml := filepath.Join(dir, "zones.yaml")
	g.Expect(os.WriteFile(yml, []byte("zones:\n- name: lab\n  ipv4: [192.0.2.0/24]\n  ipv6: [\"2001:db8::/64\"]\n- name: edge\n  ipv4: [198.51.100.0/24]\n"), 0o600)).To(Succeed())
	for _, p := range []string{js, yml} {
		zones, err := sim.LoadZonesFile(p)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(zones).To(Equal([]sim.Zone{{Name: "lab", IPv4: []string{"192.0.2.0/24"}, IPv6: []string{"2001:db8::/64"}}, {Name: "edge", IPv4: []string{"198.51.100.0/24"}}}))
	}
	bad := filepath.Join(dir, "bad.json")
	g.Expect(os.WriteFile(bad, []byte(`{"zones":[{"name":"x","ipv4":["2001:db8::/64"]}]}`), 0o600)).To(Succeed())
	_, err := sim.LoadZonesFile(bad)
	g.Expect(err).To(MatchError(ContainSubstring("is not ipv4")))
}

func TestReregistrationDropsDenyExternalCleanupLikeTheRealServer(t *testing.T) {
	g := NewWithT(t)
	s := sim.New(sim.Config{})
	b := strings.Replace(body(secretA, "inet", "ipv4", "", "a", 0), `"retention_period_days":0`, `"retention_period_days":0,"deny_external_cleanup":true`, 1)
	serve(s, http.MethodPost, "/v2/address", b)
	g.Expect(s.Holders("83.118.168.0/32")[0].DenyExternalCleanup).To(BeTrue())
	g.Expect(serve(s, http.MethodPost, "/v2/address", b).body).To(Equal(updated("83.118.168.0/32")))
	g.Expect(s.Holders("83.118.168.0/32")[0].DenyExternalCleanup).To(BeFalse())
}

func TestResetForgetsEverything(t *testing.T) {
	g := NewWithT(t)
	s := sim.New(sim.Config{})
	serve(s, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", "", "a", 0))
	s.SetExhausted("inet", "ipv4", true)
	s.Reset()
	g.Expect(s.Registrations()).To(BeEmpty())
	g.Expect(s.Stats().Total(sim.RouteRegister)).To(Equal(0))
	g.Expect(serve(s, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", "", "a", 0)).body).To(Equal(registered("83.118.168.0/32")))
}

func TestDebugHandler(t *testing.T) {
	g := NewWithT(t)
	s := sim.New(sim.Config{})
	dbg := httptest.NewServer(s.DebugHandler())
	t.Cleanup(dbg.Close)

	a := call(t, http.MethodGet, dbg.URL+"/registrations", "")
	g.Expect(a.body).To(MatchJSON(`[]`))
	serve(s, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", "", "a", 0))
	a = call(t, http.MethodGet, dbg.URL+"/registrations", "")
	g.Expect(a.body).To(MatchJSON(`[{"address":"83.118.168.0/32","zone":"inet","ip_family":"ipv4","secret_fingerprint":"` + sim.Fingerprint(secretA) + `",
		"holders":[{"service_name":"a","namespace_id":"ns-1","cluster_id":"cluster-1","retention_period_days":0,"deny_external_cleanup":false,"state":"live"}],
		"state":"live"}]`))
	g.Expect(a.body).NotTo(ContainSubstring(secretA))

	a = call(t, http.MethodPut, dbg.URL+"/faults", `{"latency":"5ms","error_rate":1,"error_status":503,"error_body":"x"}`)
	g.Expect(a.status).To(Equal(http.StatusOK))
	g.Expect(s.Faults()).To(Equal(sim.Faults{Latency: 5 * time.Millisecond, ErrorRate: 1, ErrorStatus: 503, ErrorBody: "x"}))
	g.Expect(serve(s, http.MethodPost, "/v2/address", "{}").status).To(Equal(http.StatusServiceUnavailable))
	g.Expect(call(t, http.MethodPut, dbg.URL+"/faults", `{"error_rate":2}`).status).To(Equal(http.StatusBadRequest))

	a = call(t, http.MethodGet, dbg.URL+"/stats", "")
	var st sim.Stats
	g.Expect(json.Unmarshal([]byte(a.body), &st)).To(Succeed())
	g.Expect(st.Count(sim.RouteRegister, 503)).To(Equal(1))

	g.Expect(call(t, http.MethodPut, dbg.URL+"/exhausted", `{"zone":"inet","ip_family":"ipv6","exhausted":true}`).status).To(Equal(http.StatusOK))
	s.ClearFaults()
	g.Expect(serve(s, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv6", "", "a", 0)).body).
		To(Equal(`{"message":"Could not register address: no available prefix found for zone inet_v6"}`))

	serve(s, http.MethodDelete, "/v2/service", body(secretA, "inet", "ipv4", "83.118.168.0/32", "a", 0))
	a = call(t, http.MethodPost, dbg.URL+"/sweep", "")
	g.Expect(a.body).To(MatchJSON(`{"expired_holders":1,"freed_addresses":1}`))
}

// compactJSON drops the indentation of a debug answer, so tests can look for
// "state":"live" whatever the layout.
func compactJSON(g Gomega, s string) string {
	var buf bytes.Buffer
	g.Expect(json.Compact(&buf, []byte(s))).To(Succeed(), s)
	return buf.String()
}

// A holder is "live" while registered, "expiring" (with expires_at) after DELETE with
// retention, gone after the sweeper passes expires_at, and "live" again when it
// registers before that. The registration summarises its holders the same way. Both
// the Go inspection API and GET /registrations say so.
func TestHolderStateLiveExpiringGoneAndLiveAgain(t *testing.T) {
	g := NewWithT(t)
	clk := clocktesting.NewFakeClock(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC))
	s := sim.New(sim.Config{Clock: clk})
	dbg := httptest.NewServer(s.DebugHandler())
	t.Cleanup(dbg.Close)
	const addr = "83.118.168.0/32"
	registrations := func() string {
		a := call(t, http.MethodGet, dbg.URL+"/registrations", "")
		g.Expect(a.err).NotTo(HaveOccurred())
		g.Expect(a.status).To(Equal(http.StatusOK))
		return compactJSON(g, a.body)
	}

	// Registered: live, no expiry (the retention of a POST body only counts on DELETE).
	g.Expect(serve(s, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", "", "a", 1)).body).To(Equal(registered(addr)))
	hs := s.Holders(addr)
	g.Expect(hs).To(HaveLen(1))
	g.Expect(hs[0].State).To(Equal(sim.HoldLive))
	g.Expect(hs[0].ExpiresAt).To(BeNil())
	reg, ok := s.Registration(addr)
	g.Expect(ok).To(BeTrue())
	g.Expect(reg.State).To(Equal(sim.HoldLive))
	g.Expect(reg.ExpiresAt).To(BeNil())
	g.Expect(s.HeldBy(ref("a"))[0].Holders[0].State).To(Equal(sim.HoldLive))
	got := registrations()
	g.Expect(got).To(ContainSubstring(`"state":"live"`))
	g.Expect(got).NotTo(ContainSubstring(`"expiring"`))
	g.Expect(got).NotTo(ContainSubstring(`"expires_at"`))

	// Released with one day of retention: expiring until expires_at, on the holder and
	// on the registration (its only holder is expiring).
	g.Expect(serve(s, http.MethodDelete, "/v2/service", body(secretA, "inet", "ipv4", addr, "a", 1)).status).To(Equal(http.StatusOK))
	exp := clk.Now().AddDate(0, 0, 1)
	hs = s.Holders(addr)
	g.Expect(hs).To(HaveLen(1))
	g.Expect(hs[0].State).To(Equal(sim.HoldExpiring))
	g.Expect(hs[0].ExpiresAt).To(HaveValue(Equal(exp)))
	reg, _ = s.Registration(addr)
	g.Expect(reg.State).To(Equal(sim.HoldExpiring))
	g.Expect(reg.ExpiresAt).To(HaveValue(Equal(exp)))
	g.Expect(s.Registrations()[0].State).To(Equal(sim.HoldExpiring))
	g.Expect(registrations()).To(MatchJSON(`[{"address":"` + addr + `","zone":"inet","ip_family":"ipv4","secret_fingerprint":"` + sim.Fingerprint(secretA) + `",
		"holders":[{"service_name":"a","namespace_id":"ns-1","cluster_id":"cluster-1","retention_period_days":1,"deny_external_cleanup":false,
			"expires_at":"2025-06-02T12:00:00Z","state":"expiring"}],
		"state":"expiring","expires_at":"2025-06-02T12:00:00Z"}]`))

	// The copy handed out is not the registry: changing it changes nothing.
	hs[0].State = sim.HoldLive
	*hs[0].ExpiresAt = exp.Add(time.Hour)
	g.Expect(s.Holders(addr)[0].State).To(Equal(sim.HoldExpiring))
	g.Expect(s.Holders(addr)[0].ExpiresAt).To(HaveValue(Equal(exp)))

	// Before expires_at the sweeper keeps it; at expires_at it drops the holder and frees
	// the address.
	clk.Step(24*time.Hour - time.Second)
	expired, freed := s.Sweep()
	g.Expect([]int{expired, freed}).To(Equal([]int{0, 0}))
	g.Expect(s.Holders(addr)[0].State).To(Equal(sim.HoldExpiring))
	clk.Step(time.Second)
	expired, freed = s.Sweep()
	g.Expect([]int{expired, freed}).To(Equal([]int{1, 1}))
	g.Expect(s.Holders(addr)).To(BeNil())
	_, ok = s.Registration(addr)
	g.Expect(ok).To(BeFalse())
	g.Expect(registrations()).To(Equal(`[]`))

	// Released again, then a re-POST of the same holder before expiry: live again, and the
	// sweeper leaves it alone past the old expires_at.
	g.Expect(serve(s, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", "", "a", 0)).body).To(Equal(registered(addr)))
	g.Expect(serve(s, http.MethodDelete, "/v2/service", body(secretA, "inet", "ipv4", addr, "a", 1)).status).To(Equal(http.StatusOK))
	g.Expect(s.Holders(addr)[0].State).To(Equal(sim.HoldExpiring))
	g.Expect(serve(s, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", "", "a", 0)).body).To(Equal(updated(addr)))
	hs = s.Holders(addr)
	g.Expect(hs).To(HaveLen(1))
	g.Expect(hs[0].State).To(Equal(sim.HoldLive))
	g.Expect(hs[0].ExpiresAt).To(BeNil())
	got = registrations()
	g.Expect(got).To(ContainSubstring(`"state":"live"`))
	g.Expect(got).NotTo(ContainSubstring(`"expiring"`))
	clk.Step(48 * time.Hour)
	expired, freed = s.Sweep()
	g.Expect([]int{expired, freed}).To(Equal([]int{0, 0}))
	g.Expect(s.Holders(addr)[0].State).To(Equal(sim.HoldLive))
}

// The registration is live while any holder is; once all are expiring it is expiring
// until the latest expires_at, when the sweeper frees the address.
func TestRegistrationStateSummarisesItsHolders(t *testing.T) {
	g := NewWithT(t)
	clk := clocktesting.NewFakeClock(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC))
	s := sim.New(sim.Config{Clock: clk})
	const addr = "83.118.168.0/32"
	g.Expect(serve(s, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", "", "a", 0)).body).To(Equal(registered(addr)))
	g.Expect(serve(s, http.MethodPost, "/v2/address", body(secretA, "inet", "ipv4", addr, "b", 0)).body).To(Equal(updated(addr)))

	// a releases for 3 days: a is expiring, b still live, so the address is live.
	g.Expect(serve(s, http.MethodDelete, "/v2/service", body(secretA, "inet", "ipv4", addr, "a", 3)).status).To(Equal(http.StatusOK))
	reg, _ := s.Registration(addr)
	states := map[string]sim.HoldState{}
	for _, h := range reg.Holders {
		states[h.ServiceName] = h.State
	}
	g.Expect(states).To(Equal(map[string]sim.HoldState{"a": sim.HoldExpiring, "b": sim.HoldLive}))
	g.Expect(reg.State).To(Equal(sim.HoldLive))
	g.Expect(reg.ExpiresAt).To(BeNil(), "a live address has no expiry")

	// b releases for 1 day: both expiring; the address lasts until a's later expiry.
	g.Expect(serve(s, http.MethodDelete, "/v2/service", body(secretA, "inet", "ipv4", addr, "b", 1)).status).To(Equal(http.StatusOK))
	reg, _ = s.Registration(addr)
	g.Expect(reg.State).To(Equal(sim.HoldExpiring))
	g.Expect(reg.ExpiresAt).To(HaveValue(Equal(clk.Now().AddDate(0, 0, 3))))
}
