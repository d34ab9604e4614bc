package sim_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

func TestLatencyDelaysTheAnswer(t *testing.T) {
	g := NewWithT(t)
	s, url := startSim(t, sim.Config{})
	g.Expect(s.SetLatency(150*time.Millisecond, 0)).To(Succeed())

	start := time.Now()
	a := call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "", "svc", 0))
	g.Expect(a.err).NotTo(HaveOccurred())
	g.Expect(a.body).To(Equal(registered("83.118.168.0/32")))
	g.Expect(time.Since(start)).To(BeNumerically(">=", 150*time.Millisecond))
}

func TestInjectedErrorsUseStatusAndBodyAndDoNotProcess(t *testing.T) {
	g := NewWithT(t)
	s, url := startSim(t, sim.Config{})
	g.Expect(s.SetErrorRate(1, http.StatusBadGateway, `{"message":"upstream down"}`)).To(Succeed())

	a := call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "", "svc", 0))
	g.Expect(a.status).To(Equal(http.StatusBadGateway))
	g.Expect(a.ctype).To(Equal("application/json; charset=utf-8"))
	g.Expect(a.body).To(Equal(`{"message":"upstream down"}`))
	g.Expect(s.Registrations()).To(BeEmpty())
	g.Expect(s.Stats().InjectedErrors).To(Equal(1))
	g.Expect(s.Stats().Count(sim.RouteRegister, http.StatusBadGateway)).To(Equal(1))

	g.Expect(s.SetErrorRate(0, 0, "")).To(Succeed())
	a = call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "", "svc", 0))
	g.Expect(a.body).To(Equal(registered("83.118.168.0/32")))
}

func TestFailNextAndRouteRestriction(t *testing.T) {
	g := NewWithT(t)
	s, url := startSim(t, sim.Config{})
	s.SetFaultRoutes(sim.RouteRelease)
	g.Expect(s.FailNext(1, 0, `boom`)).To(Succeed())

	// POST is not a faulted route.
	a := call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "", "svc", 0))
	g.Expect(a.body).To(Equal(registered("83.118.168.0/32")))

	del := body(secretA, "inet", "ipv4", "83.118.168.0/32", "svc", 0)
	a = call(t, http.MethodDelete, url+"/v2/service", del)
	g.Expect(a.status).To(Equal(http.StatusInternalServerError))
	g.Expect(a.body).To(Equal("boom"))
	g.Expect(s.Holders("83.118.168.0/32")[0].ExpiresAt).To(BeNil(), "a failed release must not be processed")

	a = call(t, http.MethodDelete, url+"/v2/service", del)
	g.Expect(a.status).To(Equal(http.StatusOK), "only one failure was ordered")
	g.Expect(s.Holders("83.118.168.0/32")[0].ExpiresAt).NotTo(BeNil())
}

func TestDropBeforeProcessingLeavesNoTrace(t *testing.T) {
	g := NewWithT(t)
	s, url := startSim(t, sim.Config{})
	g.Expect(s.DropNext(sim.DropBefore, 1)).To(Succeed())

	a := call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "", "svc", 0))
	g.Expect(a.err).To(HaveOccurred())
	g.Expect(s.Registrations()).To(BeEmpty())
	g.Expect(s.Stats().DroppedBefore).To(Equal(1))
	g.Expect(s.Stats().Count(sim.RouteRegister, 0)).To(Equal(1))

	a = call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "", "svc", 0))
	g.Expect(a.body).To(Equal(registered("83.118.168.0/32")))
}

func TestDropAfterProcessingCommitsButClientSeesError(t *testing.T) {
	g := NewWithT(t)
	s, url := startSim(t, sim.Config{})
	g.Expect(s.SetDropRate(sim.DropAfter, 1)).To(Succeed())

	a := call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "", "svc", 0))
	g.Expect(a.err).To(HaveOccurred())
	regs := s.Registrations()
	g.Expect(regs).To(HaveLen(1))
	g.Expect(regs[0].Address).To(Equal("83.118.168.0/32"))
	g.Expect(regs[0].Holders[0].ServiceRef).To(Equal(ref("svc")))
	g.Expect(regs[0].SecretFingerprint).To(Equal(sim.Fingerprint(secretA)))
	g.Expect(s.Stats().DroppedAfter).To(Equal(1))

	// The release is committed too, although its answer is lost.
	a = call(t, http.MethodDelete, url+"/v2/service", body(secretA, "inet", "ipv4", "83.118.168.0/32", "svc", 0))
	g.Expect(a.err).To(HaveOccurred())
	g.Expect(s.Holders("83.118.168.0/32")[0].ExpiresAt).NotTo(BeNil())

	// Retrying the registration finds it (case B) and cancels the expiry.
	g.Expect(s.SetDropRate(sim.DropAfter, 0)).To(Succeed())
	a = call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "", "svc", 0))
	g.Expect(a.body).To(Equal(updated("83.118.168.0/32")))
	g.Expect(s.Holders("83.118.168.0/32")[0].ExpiresAt).To(BeNil())
}

func TestDownClosesEveryConnection(t *testing.T) {
	g := NewWithT(t)
	s, url := startSim(t, sim.Config{})
	s.SetFaultRoutes(sim.RouteRelease) // Down ignores the route restriction
	s.SetDown(true)

	g.Expect(call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "", "svc", 0)).err).To(HaveOccurred())
	g.Expect(call(t, http.MethodGet, url+"/", "").err).To(HaveOccurred())
	g.Expect(s.Registrations()).To(BeEmpty())
	g.Expect(s.Stats().DownRejections).To(Equal(2))

	s.SetDown(false)
	a := call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "", "svc", 0))
	g.Expect(a.body).To(Equal(registered("83.118.168.0/32")))
}

func TestExhaustionSwitch(t *testing.T) {
	g := NewWithT(t)
	s, url := startSim(t, sim.Config{})
	s.SetExhausted("inet", "ipv4", true)

	a := call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "", "svc", 0))
	g.Expect(a.status).To(Equal(http.StatusInternalServerError))
	g.Expect(a.body).To(Equal(`{"message":"Could not register address: no available prefix found for zone inet_v4"}`))
	// Case C also asks NetBox for a container with room first.
	a = call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "83.118.169.7/32", "svc", 0))
	g.Expect(a.body).To(Equal(`{"message":"Could not register address: no available prefix found for zone inet_v4"}`))
	// The other family is unaffected.
	a = call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv6", "", "svc", 0))
	g.Expect(a.body).To(Equal(registered("2a05:1234::/128")))

	s.SetExhausted("inet", "ipv4", false)
	a = call(t, http.MethodPost, url+"/v2/address", body(secretA, "inet", "ipv4", "", "svc", 0))
	g.Expect(a.body).To(Equal(registered("83.118.168.0/32")))
}

func TestFaultsSettingValidatesAndRoundTripsJSON(t *testing.T) {
	g := NewWithT(t)
	s := sim.New(sim.Config{})
	g.Expect(s.SetErrorRate(1.5, 500, "")).NotTo(Succeed())

	var f sim.Faults
	g.Expect(json.Unmarshal([]byte(`{"latency":"150ms","latency_jitter":"1s","drop_after_next":2,"routes":["DELETE /v2/service"]}`), &f)).To(Succeed())
	g.Expect(f).To(Equal(sim.Faults{Latency: 150 * time.Millisecond, LatencyJitter: time.Second, DropAfterNext: 2, Routes: []sim.Route{sim.RouteRelease}}))
	g.Expect(s.SetFaults(f)).To(Succeed())
	b, err := json.Marshal(s.Faults())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(b)).To(MatchJSON(`{"latency":"150ms","latency_jitter":"1s","drop_after_next":2,"routes":["DELETE /v2/service"]}`))
}
