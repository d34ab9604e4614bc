package sim_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clocktesting "k8s.io/utils/clock/testing"

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

// Byte-exact answers of the real server while its own dependencies fail
// (docs/ipam-api.md, "When its own dependencies fail").
const (
	netboxDownDefault = `{"message":"failed to fetch zones: \u003chtml\u003e\r\n\u003chead\u003e\u003ctitle\u003e503 Service Temporarily Unavailable\u003c/title\u003e\u003c/head\u003e\r\n` +
		`\u003cbody\u003e\r\n\u003ccenter\u003e\u003ch1\u003e503 Service Temporarily Unavailable\u003c/h1\u003e\u003c/center\u003e\r\n\u003chr\u003e\u003ccenter\u003enginx\u003c/center\u003e\r\n\u003c/body\u003e\r\n\u003c/html\u003e"}`
	netboxRefusedBody = `Get "https://netbox.example/api/extras/custom-field-choice-sets/?q=k8s_zone_choices": dial tcp 10.0.0.7:443: connect: connection refused`
	netboxDownRefused = `{"message":"failed to fetch zones: Get \"https://netbox.example/api/extras/custom-field-choice-sets/?q=k8s_zone_choices\": dial tcp 10.0.0.7:443: connect: connection refused"}`
	mongoDownPOST     = `{"message":"failed to query address documents: server selection error: server selection timeout, current topology: { Type: Unknown, Servers: [{ Addr: ipam-system-mongodb:27017, Type: Unknown, Last error: dial tcp 10.96.112.34:27017: connect: connection refused }, ] }"}`
	mongoDownDELETE   = `{"message":"Could not deregister service: failed to read address document: server selection error: server selection timeout, current topology: { Type: Unknown, Servers: [{ Addr: ipam-system-mongodb:27017, Type: Unknown, Last error: dial tcp 10.96.112.34:27017: connect: connection refused }, ] }"}`
)

func TestBackendFailures(t *testing.T) {
	const held = "83.118.168.0/32"
	netbox := sim.Faults{NetBoxDown: true}
	loading := sim.Faults{PrefixesLoading: true}
	mongo := sim.Faults{MongoDown: true}
	newReg := body(secretA, "inet", "ipv4", "", "new", 0)
	reReg := body(secretA, "inet", "ipv4", "", "svc", 0)
	release := body(secretA, "inet", "ipv4", held, "svc", 0)
	invalidZone := `{"message":"invalid zone 'nowhere', must be one of: 'inet', 'hnet-private', 'hnet-public'"}`
	for _, tc := range []struct {
		name         string
		faults       sim.Faults
		method, path string
		body         string
		status       int
		want         string
		ctype        string // default application/json; charset=utf-8
		backend      int    // Stats.BackendFailures after the request
		// invalid: without the fault the request fails validation (else it succeeds).
		invalid bool
	}{
		{name: "NetBox down: POST /v2/address, default body", faults: netbox, method: "POST", path: "/v2/address", body: newReg, status: 400, want: netboxDownDefault, backend: 1},
		{name: "NetBox down: re-registration", faults: netbox, method: "POST", path: "/v2/address", body: reReg, status: 400, want: netboxDownDefault, backend: 1},
		{name: "NetBox down: DELETE /v2/service, configured body", faults: sim.Faults{NetBoxDown: true, NetBoxBody: netboxRefusedBody},
			method: "DELETE", path: "/v2/service", body: release, status: 400, want: netboxDownRefused, backend: 1},
		{name: "NetBox down: legacy POST /", faults: netbox, method: "POST", path: "/", body: newReg, status: 400, want: netboxDownDefault, backend: 1},
		{name: "NetBox down: legacy DELETE /", faults: netbox, method: "DELETE", path: "/", body: release, status: 400, want: netboxDownDefault, backend: 1},
		{name: "NetBox down: before struct validation", faults: netbox, method: "POST", path: "/v2/address", body: `{}`, status: 400, want: netboxDownDefault, backend: 1, invalid: true},
		{name: "NetBox down: before the zone check", faults: netbox, method: "DELETE", path: "/v2/service",
			body: body(secretA, "nowhere", "ipv4", held, "svc", 0), status: 400, want: netboxDownDefault, backend: 1, invalid: true},
		{name: "NetBox down: an undecodable body still gets the parse error", faults: netbox, method: "POST", path: "/v2/address", body: `[`,
			status: 400, want: `{"message":"Could not parse incomming request"}`},
		{name: "NetBox down: the catch-all is not an API route", faults: netbox, method: "GET", path: "/v2/address",
			status: 200, want: sim.CatchAllHTML, ctype: "text/html; charset=utf-8"},
		{name: "NetBox down wins over MongoDB down", faults: sim.Faults{NetBoxDown: true, MongoDown: true}, method: "POST", path: "/v2/address", body: newReg, status: 400, want: netboxDownDefault, backend: 1},
		{name: "NetBox down ignores the route restriction", faults: sim.Faults{NetBoxDown: true, Routes: []sim.Route{sim.RouteRelease}},
			method: "POST", path: "/v2/address", body: newReg, status: 400, want: netboxDownDefault, backend: 1},

		{name: "prefixes loading: POST for a zone with containers", faults: loading, method: "POST", path: "/v2/address", body: reReg,
			status: 400, want: `{"message":"no prefixes found for zone inet with IP family ipv4"}`, backend: 1},
		{name: "prefixes loading: DELETE", faults: loading, method: "DELETE", path: "/v2/service", body: release,
			status: 400, want: `{"message":"no prefixes found for zone inet with IP family ipv4"}`, backend: 1},
		{name: "prefixes loading: IPv6 of inet", faults: loading, method: "POST", path: "/", body: body(secretA, "inet", "ipv6", "", "svc", 0),
			status: 400, want: `{"message":"no prefixes found for zone inet with IP family ipv6"}`, backend: 1},
		{name: "prefixes loading: a zone without the family is no backend failure", faults: loading, method: "POST", path: "/v2/address",
			body: body(secretA, "hnet-private", "ipv6", "", "svc", 0), status: 400, want: `{"message":"no prefixes found for zone hnet-private with IP family ipv6"}`},
		{name: "prefixes loading: an unknown zone is still refused as such", faults: loading, method: "POST", path: "/v2/address",
			body: body(secretA, "nowhere", "ipv4", "", "svc", 0), status: 400, want: invalidZone},
		{name: "prefixes loading wins over MongoDB down", faults: sim.Faults{PrefixesLoading: true, MongoDown: true}, method: "DELETE", path: "/v2/service", body: release,
			status: 400, want: `{"message":"no prefixes found for zone inet with IP family ipv4"}`, backend: 1},

		{name: "MongoDB down: POST allocation", faults: mongo, method: "POST", path: "/v2/address", body: newReg, status: 500, want: mongoDownPOST, backend: 1},
		{name: "MongoDB down: POST re-registration", faults: mongo, method: "POST", path: "/v2/address", body: reReg, status: 500, want: mongoDownPOST, backend: 1},
		{name: "MongoDB down: POST claim", faults: mongo, method: "POST", path: "/",
			body: body(secretA, "inet", "ipv4", "83.118.169.9/32", "new", 0), status: 500, want: mongoDownPOST, backend: 1},
		{name: "MongoDB down: DELETE", faults: mongo, method: "DELETE", path: "/v2/service", body: release, status: 404, want: mongoDownDELETE, backend: 1},
		{name: "MongoDB down: legacy DELETE /", faults: mongo, method: "DELETE", path: "/", body: release, status: 404, want: mongoDownDELETE, backend: 1},
		{name: "MongoDB down: validation comes first", faults: mongo, method: "POST", path: "/v2/address",
			body: body(secretA, "nowhere", "ipv4", "", "svc", 0), status: 400, want: invalidZone},
		{name: "MongoDB down ignores the route restriction", faults: sim.Faults{MongoDown: true, Routes: []sim.Route{sim.RouteRegister}},
			method: "DELETE", path: "/v2/service", body: release, status: 404, want: mongoDownDELETE, backend: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			s := sim.New(sim.Config{})
			g.Expect(serve(s, http.MethodPost, "/v2/address", reReg).body).To(Equal(registered(held)))
			before := s.Registrations()
			g.Expect(s.SetFaults(tc.faults)).To(Succeed())

			a := serve(s, tc.method, tc.path, tc.body)
			g.Expect(a.status).To(Equal(tc.status))
			ctype := tc.ctype
			if ctype == "" {
				ctype = "application/json; charset=utf-8"
			}
			g.Expect(a.ctype).To(Equal(ctype))
			g.Expect(a.body).To(Equal(tc.want))
			g.Expect(s.Registrations()).To(Equal(before), "nothing is committed")
			g.Expect(s.Stats().BackendFailures).To(Equal(tc.backend))

			// Once the backend is back, the same request is processed.
			s.ClearFaults()
			g.Expect(s.Faults()).To(Equal(sim.Faults{}))
			if tc.backend > 0 {
				want := http.StatusOK
				if tc.invalid {
					want = http.StatusBadRequest
				}
				g.Expect(serve(s, tc.method, tc.path, tc.body).status).To(Equal(want))
			}
		})
	}
}

func TestBackendFaultSetters(t *testing.T) {
	g := NewWithT(t)
	s, url := startSim(t, sim.Config{})
	reg := body(secretA, "inet", "ipv4", "", "svc", 0)

	s.SetNetBoxDown(true, "")
	g.Expect(call(t, http.MethodPost, url+"/v2/address", reg).body).To(Equal(netboxDownDefault))
	s.SetNetBoxDown(true, netboxRefusedBody)
	g.Expect(call(t, http.MethodPost, url+"/v2/address", reg).body).To(Equal(netboxDownRefused))
	s.SetNetBoxDown(false, "")

	s.SetPrefixesLoading(true)
	g.Expect(s.PrefixesLoaded()).To(BeFalse())
	g.Expect(call(t, http.MethodPost, url+"/v2/address", reg).body).To(Equal(`{"message":"no prefixes found for zone inet with IP family ipv4"}`))
	s.SetPrefixesLoading(false)
	g.Expect(s.PrefixesLoaded()).To(BeTrue())

	g.Expect(s.SetMongoDown(true, -time.Second)).NotTo(Succeed())
	g.Expect(s.SetMongoDown(true, 150*time.Millisecond)).To(Succeed())
	start := time.Now()
	a := call(t, http.MethodPost, url+"/v2/address", reg)
	g.Expect(time.Since(start)).To(BeNumerically(">=", 150*time.Millisecond), "MongoHang delays the answer")
	g.Expect(a.status).To(Equal(http.StatusInternalServerError))
	g.Expect(a.body).To(Equal(mongoDownPOST))
	start = time.Now()
	a = call(t, http.MethodDelete, url+"/v2/service", body(secretA, "inet", "ipv4", "83.118.168.0/32", "svc", 0))
	g.Expect(time.Since(start)).To(BeNumerically(">=", 150*time.Millisecond))
	g.Expect(a.status).To(Equal(http.StatusNotFound))
	g.Expect(a.body).To(Equal(mongoDownDELETE))
	g.Expect(s.Registrations()).To(BeEmpty())
	g.Expect(s.Stats().BackendFailures).To(Equal(5))

	g.Expect(s.SetMongoDown(false, 0)).To(Succeed())
	g.Expect(call(t, http.MethodPost, url+"/v2/address", reg).body).To(Equal(registered("83.118.168.0/32")))
}

func TestPrefixLoadDelayAfterStartAndReset(t *testing.T) {
	g := NewWithT(t)
	clk := clocktesting.NewFakeClock(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC))
	s := sim.New(sim.Config{Clock: clk, PrefixLoadDelay: 10 * time.Second})
	reg := body(secretA, "hnet-private", "ipv4", "", "svc", 0)
	loading := `{"message":"no prefixes found for zone hnet-private with IP family ipv4"}`

	g.Expect(s.PrefixesLoaded()).To(BeFalse())
	a := serve(s, http.MethodPost, "/v2/address", reg)
	g.Expect(a.status).To(Equal(http.StatusBadRequest))
	g.Expect(a.body).To(Equal(loading))
	g.Expect(serve(s, http.MethodDelete, "/v2/service", body(secretA, "hnet-private", "ipv4", "10.0.0.0/32", "svc", 0)).body).To(Equal(loading))
	g.Expect(s.Faults()).To(Equal(sim.Faults{}), "the delay is configuration, not a fault")
	s.ClearFaults()
	g.Expect(s.PrefixesLoaded()).To(BeFalse(), "ClearFaults does not end the delay")

	clk.Step(10*time.Second - time.Nanosecond)
	g.Expect(serve(s, http.MethodPost, "/v2/address", reg).body).To(Equal(loading))
	clk.Step(time.Nanosecond)
	g.Expect(s.PrefixesLoaded()).To(BeTrue())
	g.Expect(serve(s, http.MethodPost, "/v2/address", reg).body).To(Equal(registered("10.0.0.0/32")))
	g.Expect(s.Stats().BackendFailures).To(Equal(3))

	// Reset is a restart: the containers are loading again.
	s.Reset()
	g.Expect(serve(s, http.MethodPost, "/v2/address", reg).body).To(Equal(loading))
	clk.Step(10 * time.Second)
	g.Expect(serve(s, http.MethodPost, "/v2/address", reg).body).To(Equal(registered("10.0.0.0/32")))

	_, err := sim.NewServer(sim.Config{PrefixLoadDelay: -time.Second})
	g.Expect(err).To(MatchError(ContainSubstring("negative prefix load delay")))
}

func TestBackendFaultsThroughTheDebugAPI(t *testing.T) {
	g := NewWithT(t)
	s := sim.New(sim.Config{})
	dbg := httptest.NewServer(s.DebugHandler())
	t.Cleanup(dbg.Close)
	reg := body(secretA, "inet", "ipv4", "", "svc", 0)

	set := `{"netbox_down":true,"netbox_body":"` + strings.ReplaceAll(netboxRefusedBody, `"`, `\"`) + `","prefixes_loading":true,"mongo_down":true,"mongo_hang":"20ms","routes":["POST /v2/address"]}`
	a := call(t, http.MethodPut, dbg.URL+"/faults", set)
	g.Expect(a.status).To(Equal(http.StatusOK), a.body)
	g.Expect(a.body).To(MatchJSON(set))
	g.Expect(s.Faults()).To(Equal(sim.Faults{NetBoxDown: true, NetBoxBody: netboxRefusedBody, PrefixesLoading: true,
		MongoDown: true, MongoHang: 20 * time.Millisecond, Routes: []sim.Route{sim.RouteRegister}}))
	g.Expect(call(t, http.MethodGet, dbg.URL+"/faults", "").body).To(MatchJSON(set))
	g.Expect(serve(s, http.MethodPost, "/v2/address", reg).body).To(Equal(netboxDownRefused))

	// One at a time, through the same API.
	a = call(t, http.MethodPut, dbg.URL+"/faults", `{"prefixes_loading":true}`)
	g.Expect(a.status).To(Equal(http.StatusOK))
	g.Expect(serve(s, http.MethodPost, "/v2/address", reg).body).To(Equal(`{"message":"no prefixes found for zone inet with IP family ipv4"}`))
	g.Expect(call(t, http.MethodPut, dbg.URL+"/faults", `{"mongo_down":true}`).status).To(Equal(http.StatusOK))
	g.Expect(serve(s, http.MethodPost, "/v2/address", reg).body).To(Equal(mongoDownPOST))
	g.Expect(call(t, http.MethodPut, dbg.URL+"/faults", `{"netbox_down":true}`).status).To(Equal(http.StatusOK))
	g.Expect(serve(s, http.MethodDelete, "/v2/service", body(secretA, "inet", "ipv4", "83.118.168.0/32", "svc", 0)).body).To(Equal(netboxDownDefault))

	for _, bad := range []string{`{"mongo_hang":"-1s"}`, `{"mongo_hang":20}`, `{"mongo_hang":"soon"}`, `{"netbox_down":"yes"}`} {
		a = call(t, http.MethodPut, dbg.URL+"/faults", bad)
		g.Expect(a.status).To(Equal(http.StatusBadRequest), bad)
	}
	g.Expect(s.Faults()).To(Equal(sim.Faults{NetBoxDown: true}), "a refused setting changes nothing")

	// POST /reset clears them; so does PUT /faults {}.
	g.Expect(call(t, http.MethodPost, dbg.URL+"/reset", "").status).To(Equal(http.StatusOK))
	g.Expect(s.Faults()).To(Equal(sim.Faults{}))
	g.Expect(call(t, http.MethodPut, dbg.URL+"/faults", `{"mongo_down":true}`).status).To(Equal(http.StatusOK))
	g.Expect(call(t, http.MethodPut, dbg.URL+"/faults", `{}`).body).To(MatchJSON(`{}`))
	g.Expect(serve(s, http.MethodPost, "/v2/address", reg).body).To(Equal(registered("83.118.168.0/32")))
}

// FaultFields names every field a full Faults setting encodes to, and nothing else.
func TestFaultFieldsMatchTheJSONEncoding(t *testing.T) {
	g := NewWithT(t)
	full := sim.Faults{Latency: 1, LatencyJitter: 1, ErrorRate: 1, ErrorNext: 1, ErrorStatus: 500, ErrorBody: "x", ErrorContentType: "x",
		DropBeforeRate: 1, DropBeforeNext: 1, DropAfterRate: 1, DropAfterNext: 1, Down: true, NetBoxDown: true, NetBoxBody: "x",
		PrefixesLoading: true, MongoDown: true, MongoHang: 1, MongoRecovers: true, Routes: []sim.Route{sim.RouteRegister}}
	b, err := json.Marshal(full)
	g.Expect(err).NotTo(HaveOccurred())
	var m map[string]any
	g.Expect(json.Unmarshal(b, &m)).To(Succeed())
	g.Expect(slices.Sorted(maps.Keys(m))).To(Equal(sim.FaultFields()))
	var back sim.Faults
	g.Expect(json.Unmarshal(b, &back)).To(Succeed())
	g.Expect(back).To(Equal(full))
}

func TestDebugHandlerServesExactlyDebugRoutes(t *testing.T) {
	g := NewWithT(t)
	s := sim.New(sim.Config{})
	h := s.DebugHandler()
	for _, rt := range sim.DebugRoutes() {
		body := ""
		switch rt.Path {
		case "/faults":
			body = `{}`
		case "/exhausted":
			body = `{"zone":"inet","ip_family":"ipv4","exhausted":false}`
		}
		a := serve(h, rt.Method, rt.Path, body)
		g.Expect(a.status).To(Equal(http.StatusOK), rt.Method+" "+rt.Path)
		g.Expect(a.ctype).To(Equal("application/json"), rt.Method+" "+rt.Path)
		g.Expect(rt.Doc).NotTo(BeEmpty())
	}
	g.Expect(serve(h, http.MethodGet, "/nothing", "").status).To(Equal(http.StatusNotFound))
}

// With MongoRecovers, a request that hangs on MongoDB down is carried out once MongoDB is
// back within its hang: a late success, answered 200 long after a client would have given
// up. Without it, it fails after the hang, and nothing is registered.
func TestMongoDownThatRecoversCarriesTheRequestOutLate(t *testing.T) {
	s := sim.New(sim.Config{})
	if err := s.SetFaults(sim.Faults{MongoDown: true, MongoHang: 5 * time.Second, MongoRecovers: true}); err != nil {
		t.Fatal(err)
	}
	done := make(chan answer, 1)
	start := time.Now()
	go func() {
		done <- serve(s, http.MethodPost, "/v2/address", body("0123456789", "inet", "ipv4", "", "late", 0))
	}()
	time.Sleep(200 * time.Millisecond)
	if held := s.HeldBy(ref("late")); len(held) != 0 {
		t.Fatalf("registered while MongoDB is down: %v", held)
	}
	s.SetMongoDown(false, 5*time.Second)
	a := <-done
	if a.status != http.StatusOK || len(s.HeldBy(ref("late"))) != 1 {
		t.Fatalf("once MongoDB is back the hanging request should be carried out: %d %s, held %v", a.status, a.body, s.HeldBy(ref("late")))
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 4*time.Second {
		t.Errorf("answered after %s: want once MongoDB came back", d)
	}

	// Without MongoRecovers: it fails after the hang, whatever happens meanwhile.
	if err := s.SetFaults(sim.Faults{MongoDown: true, MongoHang: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	a = serve(s, http.MethodPost, "/v2/address", body("0123456789", "inet", "ipv4", "", "never", 0))
	if a.status != http.StatusInternalServerError || len(s.HeldBy(ref("never"))) != 0 {
		t.Errorf("got %d %s, held %v; want 500 and nothing held", a.status, a.body, s.HeldBy(ref("never")))
	}
}
