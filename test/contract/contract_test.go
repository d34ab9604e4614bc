package contract

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// Request bodies (literal JSON; {{var}} is filled per case: s1/s2 secrets, n1..n3
// service names, ns/cl namespace and cluster ids, zone, free/freebare an unused address
// of the zone, A/B captured addresses).
const (
	regN1S1   = `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`
	regN1S2   = `{"secret":"{{s2}}","zone":"{{zone}}","ip_family":"ipv4","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`
	regN2S1   = `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","service":{"service_name":"{{n2}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`
	regN2S2   = `{"secret":"{{s2}}","zone":"{{zone}}","ip_family":"ipv4","service":{"service_name":"{{n2}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`
	addrN1S1  = `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`
	addrN1S2  = `{"secret":"{{s2}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`
	addrN2S1  = `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n2}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`
	addrN2S2  = `{"secret":"{{s2}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n2}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`
	relN1S1   = `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}","retention_period_days":0}}`
	relN1S1d1 = `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}","retention_period_days":1}}`

	parseErr   = `{"message":"Could not parse incomming request"}`
	registered = `{"message":"Address registered successfully","address":"{{A?}}"}`
	updatedA   = `{"message":"Address updated successfully","address":"{{A}}"}`
	releasedA  = `{"message":"Service expiration set successfully","address":"{{A}}"}`
	noMatch    = `{"message":"Could not register address: no matching address found with the provided secret, zone and address"}`
	notFound   = `{"message":"Could not deregister service: no matching address found with the provivded secret, zone and address"}`
	noService  = `{"message":"Could not deregister service: service does not exist for this address"}`

	allRequired = `{"message":"Key: 'IpamAPIRequest.Secret' Error:Field validation for 'Secret' failed on the 'required' tag\n` +
		`Key: 'IpamAPIRequest.Zone' Error:Field validation for 'Zone' failed on the 'required' tag\n` +
		`Key: 'IpamAPIRequest.IPFamily' Error:Field validation for 'IPFamily' failed on the 'required' tag\n` +
		`Key: 'IpamAPIRequest.Service.ServiceName' Error:Field validation for 'ServiceName' failed on the 'required' tag\n` +
		`Key: 'IpamAPIRequest.Service.NamespaceID' Error:Field validation for 'NamespaceID' failed on the 'required' tag\n` +
		`Key: 'IpamAPIRequest.Service.ClusterID' Error:Field validation for 'ClusterID' failed on the 'required' tag"}`
	invalidZone = `{"message":"invalid zone 'nowhere', must be one of: 'inet', 'hnet-private', 'hnet-public'"}`
)

// first registers n1/s1 without an address and captures it as A (the lowest address
// of the zone on a fresh stand-in).
var first = step{body: regN1S1, status: 200, want: registered, sim: map[string]string{"A": "10.0.0.0/32"}}

// holders asserts the stand-in's holder list of A by service name.
func holders(names ...string) func(g Gomega, c *caseRun) {
	return func(g Gomega, c *caseRun) {
		var got []string
		for _, h := range c.tg.sim.Holders(c.vars["A"]) {
			got = append(got, h.ServiceName)
		}
		want := make([]string, len(names))
		for i, n := range names {
			want[i] = c.vars[n]
		}
		g.Expect(got).To(Equal(want))
	}
}

func TestValidation(t *testing.T) {
	runCases(t, []contractCase{
		{name: "parse error: empty body", steps: []step{{body: "", status: 400, want: parseErr}}},
		{name: "parse error: not JSON", steps: []step{{body: `secret=x`, status: 400, want: parseErr}}},
		{name: "parse error: retention_period_days is a string", steps: []step{{
			body:   `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}","retention_period_days":"5"}}`,
			status: 400, want: parseErr}}},
		{name: "parse error: retention_period_days is not an integer", steps: []step{{
			body:   `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}","retention_period_days":1.5}}`,
			status: 400, want: parseErr}}},
		{name: "parse error: expires_at is not RFC 3339", steps: []step{{
			body:   `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}","expires_at":"tomorrow"}}`,
			status: 400, want: parseErr}}},
		{name: "parse error on DELETE and on the legacy route", steps: []step{
			{method: "DELETE", body: `[`, status: 400, want: parseErr},
			{path: "/", body: ``, status: 400, want: parseErr},
			{method: "DELETE", path: "/", body: `{"secret":`, status: 400, want: parseErr},
		}},
		{name: "validator: every required field missing, joined by newlines", steps: []step{{body: `{}`, status: 400, want: allRequired}}},
		{name: "validator: null body decodes to an empty request", steps: []step{{body: `null`, status: 400, want: allRequired}}},
		{name: "validator: same errors on DELETE and legacy routes", steps: []step{
			{method: "DELETE", body: `{}`, status: 400, want: allRequired},
			{path: "/", body: `{}`, status: 400, want: allRequired},
			{method: "DELETE", path: "/", body: `{}`, status: 400, want: allRequired},
		}},
		{name: "validator: secret shorter than 8", steps: []step{{
			body:   `{"secret":"short","zone":"{{zone}}","ip_family":"ipv4","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
			status: 400, want: `{"message":"Key: 'IpamAPIRequest.Secret' Error:Field validation for 'Secret' failed on the 'min' tag"}`}}},
		{name: "validator: secret longer than 64", steps: []step{{
			body:   `{"secret":"` + strings.Repeat("x", 65) + `","zone":"{{zone}}","ip_family":"ipv4","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
			status: 400, want: `{"message":"Key: 'IpamAPIRequest.Secret' Error:Field validation for 'Secret' failed on the 'max' tag"}`}}},
		{name: "validator: secret length counts characters, not bytes", steps: []step{{
			method: "DELETE", body: `{"secret":"øøøøøøøø","zone":"{{zone}}","ip_family":"ipv4","address":"{{free}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
			status: 404, want: notFound}}},
		{name: "validator: ip_family dual is rejected", steps: []step{{
			body:   `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"dual","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
			status: 400, want: `{"message":"Key: 'IpamAPIRequest.IPFamily' Error:Field validation for 'IPFamily' failed on the 'oneof' tag"}`}}},
		{name: "validator: several errors in field order", steps: []step{{
			body: `{"secret":"{{s1}}","zone":"{{zone}}","service":{"namespace_id":"{{ns}}"}}`, status: 400,
			want: `{"message":"Key: 'IpamAPIRequest.IPFamily' Error:Field validation for 'IPFamily' failed on the 'required' tag\n` +
				`Key: 'IpamAPIRequest.Service.ServiceName' Error:Field validation for 'ServiceName' failed on the 'required' tag\n` +
				`Key: 'IpamAPIRequest.Service.ClusterID' Error:Field validation for 'ClusterID' failed on the 'required' tag"}`}}},
		{name: "validator errors come before the retention check", steps: []step{{
			body:   `{"secret":"short","zone":"{{zone}}","ip_family":"ipv4","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}","retention_period_days":31}}`,
			status: 400, want: `{"message":"Key: 'IpamAPIRequest.Secret' Error:Field validation for 'Secret' failed on the 'min' tag"}`}}},
		{name: "retention over 30 days", steps: []step{
			{body: `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}","retention_period_days":31}}`,
				status: 400, want: `{"message":"retention period cannot be more than 30 days"}`},
			{method: "DELETE", body: `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{free}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}","retention_period_days":31}}`,
				status: 400, want: `{"message":"retention period cannot be more than 30 days"}`},
		}},
		{name: "retention check comes before the zone check", steps: []step{{
			body:   `{"secret":"{{s1}}","zone":"nowhere","ip_family":"ipv4","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}","retention_period_days":99}}`,
			status: 400, want: `{"message":"retention period cannot be more than 30 days"}`}}},
		{name: "negative retention is accepted", steps: []step{{
			method: "DELETE", body: `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{free}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}","retention_period_days":-3}}`,
			status: 404, want: notFound}}},
		{name: "invalid zone (unknown fields are ignored)", steps: []step{
			{body: `{"secret":"{{s1}}","zone":"nowhere","ip_family":"ipv4","colour":"blue","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}","owner":"me"}}`,
				status: 400, want: invalidZone},
			{method: "DELETE", body: `{"secret":"{{s1}}","zone":"nowhere","ip_family":"ipv4","address":"{{free}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 400, want: invalidZone},
		}},
		{name: "invalid zone: HTML characters are escaped like gin does", steps: []step{{
			body:   `{"secret":"{{s1}}","zone":"<b>&","ip_family":"ipv4","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
			status: 400, want: `{"message":"invalid zone '\u003cb\u003e\u0026', must be one of: 'inet', 'hnet-private', 'hnet-public'"}`}}},
		{name: "invalid ip prefix", steps: []step{{
			body:   `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"not-an-ip/32","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
			status: 400, want: `{"message":"invalid ip prefix: not-an-ip/32"}`}}},
		{name: "address of the other family", steps: []step{
			{body: `{"secret":"{{s1}}","zone":"inet","ip_family":"ipv6","address":"83.118.168.10/32","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 400, want: `{"message":"invalid ip familiy for the provided address"}`},
			{method: "DELETE", body: `{"secret":"{{s1}}","zone":"inet","ip_family":"ipv4","address":"2a05:1234::10/128","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 400, want: `{"message":"invalid ip familiy for the provided address"}`},
		}},
		{name: "no prefixes for the zone and family", steps: []step{
			{body: `{"secret":"{{s1}}","zone":"hnet-private","ip_family":"ipv6","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 400, want: `{"message":"no prefixes found for zone hnet-private with IP family ipv6"}`},
			{method: "DELETE", body: `{"secret":"{{s1}}","zone":"hnet-public","ip_family":"ipv6","address":"2a05:1234::10/128","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 400, want: `{"message":"no prefixes found for zone hnet-public with IP family ipv6"}`},
		}},
	})
}

func TestDecisionTable(t *testing.T) {
	runCases(t, []contractCase{
		{name: "A: no address, nothing held: lowest free address of the zone", steps: []step{
			{body: `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","unknown":1,"service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}","retention_period_days":0,"deny_external_cleanup":false}}`,
				status: 200, want: registered, sim: map[string]string{"A": "10.0.0.0/32"},
				simCheck: func(g Gomega, c *caseRun) {
					r, ok := c.tg.sim.Registration(c.vars["A"])
					g.Expect(ok).To(BeTrue())
					g.Expect(r.Zone).To(Equal("hnet-private"))
					g.Expect(r.Family).To(Equal("ipv4"))
					g.Expect(r.SecretFingerprint).To(Equal(sim.Fingerprint(c.vars["s1"])))
					holders("n1")(g, c)
				}},
		}},
		{name: "A: IPv6 allocates a /128", simOnly: ipv6Skip(), steps: []step{
			{body: `{"secret":"{{s1}}","zone":"inet","ip_family":"ipv6","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 200, want: registered, sim: map[string]string{"A": "2a05:1234::/128"}},
		}},
		{name: "B: same triple, secret, zone and family: same address", steps: []step{
			first,
			{body: regN1S1, status: 200, want: updatedA, simCheck: holders("n1")},
		}},
		{name: "C: explicit free address is claimed", steps: []step{
			{body: `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{free}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 200, want: `{"message":"Address registered successfully","address":"{{free}}"}`,
				simCheck: func(g Gomega, c *caseRun) { g.Expect(c.tg.sim.Holders(c.vars["free"])).To(HaveLen(1)) }},
			{body: `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{free}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 200, want: `{"message":"Address updated successfully","address":"{{free}}"}`},
			{body: regN1S1, status: 200, want: `{"message":"Address updated successfully","address":"{{free}}"}`},
		}},
		{name: "C: address outside every container of the zone", steps: []step{
			{body: `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{out}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 500, want: `{"message":"Could not register address: the requested address is not valid for the provided zone"}`},
		}},
		{name: "D: another triple with the secret shares the address", steps: []step{
			first,
			{body: addrN2S1, status: 200, want: updatedA, simCheck: holders("n1", "n2")},
			{method: "DELETE", body: `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n2}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 200, want: releasedA},
			{body: regN1S1, status: 200, want: updatedA, simCheck: func(g Gomega, c *caseRun) {
				hs := c.tg.sim.Holders(c.vars["A"])
				g.Expect(hs).To(HaveLen(2))
				g.Expect(hs[0].ServiceName).To(Equal(c.vars["n2"]))
				g.Expect(hs[0].ExpiresAt).NotTo(BeNil(), "the released sharer keeps its expiry")
			}},
		}},
	})
}

func ipv6Skip() string {
	if envOr("IPAM_API_IPV6", "") != "" {
		return ""
	}
	return "set IPAM_API_IPV6=1 to allocate IPv6 on a real server"
}

func TestIdempotency(t *testing.T) {
	runCases(t, []contractCase{
		{name: "same triple, same secret, no address: same address", steps: []step{
			first, {body: regN1S1, status: 200, want: updatedA}, {body: regN1S1, status: 200, want: updatedA},
		}},
		{name: "same triple, different secret: a new address", steps: []step{
			first,
			{body: regN1S2, status: 200, want: `{"message":"Address registered successfully","address":"{{B?}}"}`,
				sim: map[string]string{"B": "10.0.0.1/32"}, differ: [][2]string{{"A", "B"}}},
		}},
		{name: "different triple, same secret, no address: a new address", steps: []step{
			first,
			{body: regN2S1, status: 200, want: `{"message":"Address registered successfully","address":"{{B?}}"}`,
				sim: map[string]string{"B": "10.0.0.1/32"}, differ: [][2]string{{"A", "B"}}},
		}},
		{name: "different triple, same secret, explicit taken address: shared", steps: []step{
			first, {body: addrN2S1, status: 200, want: updatedA, simCheck: holders("n1", "n2")},
		}},
		{name: "any triple, wrong secret, explicit taken address: no match", steps: []step{
			first,
			{body: addrN2S2, status: 500, want: noMatch},
			{body: addrN1S2, status: 500, want: noMatch, simCheck: holders("n1")},
		}},
	})
}

func TestSecretRotation(t *testing.T) {
	rotate := `{"secret":"{{s1}}","new_secret":"{{s2}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`
	runCases(t, []contractCase{
		{name: "rotation by the only holder", steps: []step{
			first,
			{body: rotate, status: 200, want: updatedA, simCheck: func(g Gomega, c *caseRun) {
				r, _ := c.tg.sim.Registration(c.vars["A"])
				g.Expect(r.SecretFingerprint).To(Equal(sim.Fingerprint(c.vars["s2"])))
			}},
			{body: addrN1S1, status: 500, want: noMatch},
			{body: addrN1S2, status: 200, want: updatedA},
			{body: regN1S2, status: 200, want: updatedA},
		}},
		{name: "rotation refused: several holders", steps: []step{
			first,
			{body: addrN2S1, status: 200, want: updatedA},
			{body: rotate, status: 500, want: `{"message":"Could not register address: multiple services registered. unable to change secret"}`},
			{body: addrN1S1, status: 200, want: updatedA},
		}},
		{name: "rotation refused: requester is not the holder", steps: []step{
			first,
			{body: `{"secret":"{{s1}}","new_secret":"{{s2}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n2}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 500, want: `{"message":"Could not register address: service mismatch. unable to change secret"}`},
			{body: addrN1S1, status: 200, want: updatedA},
		}},
		{name: "new_secret equal to secret is a plain update", steps: []step{
			first,
			{body: addrN2S1, status: 200, want: updatedA},
			{body: `{"secret":"{{s1}}","new_secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 200, want: updatedA, simCheck: holders("n2", "n1")},
		}},
	})
}

func TestRelease(t *testing.T) {
	runCases(t, []contractCase{
		{name: "release sets the holder's expiry", steps: []step{
			first,
			{method: "DELETE", body: relN1S1d1, status: 200, want: releasedA, simCheck: func(g Gomega, c *caseRun) {
				hs := c.tg.sim.Holders(c.vars["A"])
				g.Expect(hs).To(HaveLen(1))
				g.Expect(hs[0].ExpiresAt).To(HaveValue(Equal(simEpoch.AddDate(0, 0, 1))))
			}},
			{method: "DELETE", body: relN1S1, status: 200, want: releasedA, simCheck: func(g Gomega, c *caseRun) {
				g.Expect(c.tg.sim.Holders(c.vars["A"])[0].ExpiresAt).To(HaveValue(Equal(simEpoch)), "the DELETE's retention counts")
			}},
		}},
		{name: "release with the wrong secret: 404", steps: []step{
			first,
			{method: "DELETE", body: `{"secret":"{{s2}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 404, want: notFound},
		}},
		{name: "release in the wrong zone: 404", steps: []step{
			first,
			{method: "DELETE", body: `{"secret":"{{s1}}","zone":"hnet-public","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 404, want: notFound},
		}},
		{name: "release by a triple that does not hold it: 404", steps: []step{
			first,
			{method: "DELETE", body: `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n2}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 404, want: noService, simCheck: holders("n1")},
		}},
		{name: "release of an address nobody holds: 404 (reachability probe)", steps: []step{
			{method: "DELETE", body: `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{free}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 404, want: notFound},
			{method: "DELETE", body: `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 404, want: notFound},
		}},
		{name: "legacy POST / and DELETE / behave like the v2 routes", steps: []step{
			{path: "/", body: regN1S1, status: 200, want: registered, sim: map[string]string{"A": "10.0.0.0/32"}},
			{path: "/", body: regN1S1, status: 200, want: updatedA},
			{method: "DELETE", path: "/", body: relN1S1, status: 200, want: releasedA},
			{method: "DELETE", path: "/", body: `{"secret":"{{s2}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 404, want: notFound},
		}},
	})
}

func TestBareAddressTrap(t *testing.T) {
	bare := `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{freebare}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`
	cidr := `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{free}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`
	runCases(t, []contractCase{
		{name: "C with a bare address answers bare but stores ip/32", steps: []step{
			{body: bare, status: 200, want: `{"message":"Address registered successfully","address":"{{freebare}}"}`,
				simCheck: func(g Gomega, c *caseRun) {
					g.Expect(c.tg.sim.Holders(c.vars["free"])).To(HaveLen(1))
					g.Expect(c.tg.sim.Holders(c.vars["freebare"])).To(BeEmpty())
				}},
			{method: "DELETE", body: bare, status: 404, want: notFound},
			{body: bare, status: 500, want: noMatch},
			{body: regN1S1, status: 200, want: `{"message":"Address updated successfully","address":"{{free}}"}`},
			{method: "DELETE", body: cidr, status: 200, want: `{"message":"Service expiration set successfully","address":"{{free}}"}`},
		}},
	})
}

func TestRetentionAndExpiry(t *testing.T) {
	sweep := step{do: func(g Gomega, c *caseRun) { c.tg.sim.Sweep() }}
	advance := func(d time.Duration) step {
		return step{do: func(g Gomega, c *caseRun) { c.tg.clock.Step(d); c.tg.sim.Sweep() }}
	}
	runCases(t, []contractCase{
		{name: "re-claim before expiry with the address (D) cancels it", steps: []step{
			first,
			{method: "DELETE", body: relN1S1d1, status: 200, want: releasedA},
			{body: addrN1S1, status: 200, want: updatedA, simCheck: func(g Gomega, c *caseRun) {
				g.Expect(c.tg.sim.Holders(c.vars["A"])[0].ExpiresAt).To(BeNil())
			}},
		}},
		{name: "re-claim before expiry without the address (B) cancels it", steps: []step{
			first,
			{method: "DELETE", body: relN1S1d1, status: 200, want: releasedA},
			{body: regN1S1, status: 200, want: updatedA, simCheck: func(g Gomega, c *caseRun) {
				g.Expect(c.tg.sim.Holders(c.vars["A"])[0].ExpiresAt).To(BeNil())
			}},
		}},
		{name: "an expiry that has passed still counts until the sweep", simOnly: "needs clock control and a sweep", steps: []step{
			first,
			{method: "DELETE", body: relN1S1, status: 200, want: releasedA},
			advance(0), // expires_at == now: swept
			{method: "DELETE", body: relN1S1, status: 404, want: notFound},
		}},
		{name: "after expiry and sweep: a new owner gets it, the old one is locked out", simOnly: "needs clock control and a sweep", steps: []step{
			first,
			{method: "DELETE", body: relN1S1d1, status: 200, want: releasedA},
			advance(24*time.Hour - time.Second),
			{body: regN2S2, status: 200, want: `{"message":"Address registered successfully","address":"{{B?}}"}`, sim: map[string]string{"B": "10.0.0.1/32"}},
			advance(time.Second),
			{method: "DELETE", body: relN1S1, status: 404, want: notFound},
			{path: "/v2/address", body: `{"secret":"{{s2}}","zone":"{{zone}}","ip_family":"ipv4","service":{"service_name":"{{n3}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 200, want: registered, sim: map[string]string{"A": "10.0.0.0/32"}},
			{body: `{"secret":"{{s1}}","zone":"{{zone}}","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 500, want: noMatch},
		}},
		{name: "after the sweep a free address can be claimed again by anyone (case C)", simOnly: "needs a sweep", steps: []step{
			first,
			{method: "DELETE", body: relN1S1, status: 200, want: releasedA},
			sweep,
			{body: addrN1S1, status: 200, want: `{"message":"Address registered successfully","address":"{{A}}"}`},
		}},
	})
}

func TestExhaustion(t *testing.T) {
	runCases(t, []contractCase{
		{name: "exhausted zone", simOnly: "cannot exhaust a production zone", steps: []step{
			{do: func(g Gomega, c *caseRun) { c.tg.sim.SetExhausted(c.vars["zone"], "ipv4", true) }},
			{body: regN1S1, status: 500, want: `{"message":"Could not register address: no available prefix found for zone hnet-private_v4"}`},
			{do: func(g Gomega, c *caseRun) { c.tg.sim.SetExhausted(c.vars["zone"], "ipv4", false) }},
			first,
		}},
	})
}

func TestCatchAll(t *testing.T) {
	html := func(method, path, body string) step {
		return step{method: method, path: path, body: body, status: 200, ctype: htmlCT, want: sim.CatchAllHTML}
	}
	runCases(t, []contractCase{
		{name: "GET /v2/address", steps: []step{html("GET", "/v2/address", "")}},
		{name: "GET /", steps: []step{html("GET", "/", "")}},
		{name: "DELETE /v2/cluster is disabled", steps: []step{html("DELETE", "/v2/cluster", regN1S1)}},
		{name: "PUT /v2/address", steps: []step{html("PUT", "/v2/address", regN1S1)}},
		{name: "POST to an unknown path", steps: []step{html("POST", "/v2/addresses", regN1S1)}},
		{name: "DELETE /v2/address is not the release route", steps: []step{html("DELETE", "/v2/address", regN1S1)}},
		{name: "trailing slash: gin redirects with 307", steps: []step{
			{path: "/v2/address/", body: regN1S1, status: 307, ctype: noCT, want: "", header: map[string]string{"Location": "/v2/address"}},
		}},
	})
}

func TestConcurrencyTrap(t *testing.T) {
	runCases(t, []contractCase{
		{name: "overlapping first registrations of one triple get two addresses", simOnly: "would leak addresses on a real server", steps: []step{
			{do: func(g Gomega, c *caseRun) {
				g.Expect(c.tg.sim.SetLatency(300*time.Millisecond, 0)).To(Succeed())
				body := c.subst(regN1S1)
				var wg sync.WaitGroup
				got := make([]string, 2)
				for i := range got {
					wg.Add(1)
					go func() {
						defer wg.Done()
						req, _ := http.NewRequest(http.MethodPost, c.tg.base+"/v2/address", strings.NewReader(body))
						resp, err := client.Do(req)
						if err != nil {
							return
						}
						defer resp.Body.Close()
						b, _ := io.ReadAll(resp.Body)
						got[i] = string(b)
					}()
				}
				wg.Wait()
				g.Expect(got).To(ConsistOf(
					`{"message":"Address registered successfully","address":"10.0.0.0/32"}`,
					`{"message":"Address registered successfully","address":"10.0.0.1/32"}`))
				g.Expect(c.tg.sim.Stats().OverlappingRegistrations).To(Equal(1))
			}},
		}},
	})
}

// Answers of the real server while its own dependencies fail (docs/ipam-api.md, "When
// its own dependencies fail"), byte-exact as the stand-in gives them with its default
// texts.
const (
	netboxDown = `{"message":"failed to fetch zones: \u003chtml\u003e\r\n\u003chead\u003e\u003ctitle\u003e503 Service Temporarily Unavailable\u003c/title\u003e\u003c/head\u003e\r\n` +
		`\u003cbody\u003e\r\n\u003ccenter\u003e\u003ch1\u003e503 Service Temporarily Unavailable\u003c/h1\u003e\u003c/center\u003e\r\n\u003chr\u003e\u003ccenter\u003enginx\u003c/center\u003e\r\n\u003c/body\u003e\r\n\u003c/html\u003e"}`
	noPrefixesLoading = `{"message":"no prefixes found for zone hnet-private with IP family ipv4"}`
	mongoDownPOST     = `{"message":"failed to query address documents: server selection error: server selection timeout, current topology: { Type: Unknown, Servers: [{ Addr: ipam-system-mongodb:27017, Type: Unknown, Last error: dial tcp 10.96.112.34:27017: connect: connection refused }, ] }"}`
	mongoDownDELETE   = `{"message":"Could not deregister service: failed to read address document: server selection error: server selection timeout, current topology: { Type: Unknown, Servers: [{ Addr: ipam-system-mongodb:27017, Type: Unknown, Last error: dial tcp 10.96.112.34:27017: connect: connection refused }, ] }"}`
)

func TestBackendFailures(t *testing.T) {
	set := func(fn func(s *sim.Server)) step {
		return step{do: func(g Gomega, c *caseRun) { fn(c.tg.sim) }}
	}
	unchanged := holders("n1")
	notReleased := func(g Gomega, c *caseRun) {
		holders("n1")(g, c)
		g.Expect(c.tg.sim.Holders(c.vars["A"])[0].ExpiresAt).To(BeNil())
		g.Expect(c.tg.sim.Registrations()).To(HaveLen(1))
	}
	runCases(t, []contractCase{
		{name: "NetBox down: every POST and DELETE answers 400 failed to fetch zones", simOnly: "needs a failing NetBox", steps: []step{
			first,
			set(func(s *sim.Server) { s.SetNetBoxDown(true, "") }),
			{body: regN1S1, status: 400, want: netboxDown},
			{body: regN2S1, status: 400, want: netboxDown},
			{body: addrN2S1, status: 400, want: netboxDown, simCheck: unchanged},
			{method: "DELETE", body: relN1S1, status: 400, want: netboxDown, simCheck: notReleased},
			{path: "/", body: regN2S2, status: 400, want: netboxDown},
			{method: "DELETE", path: "/", body: relN1S1, status: 400, want: netboxDown, simCheck: notReleased},
			{body: `{}`, status: 400, want: netboxDown},
			{method: "DELETE", body: `{"secret":"{{s1}}","zone":"nowhere","ip_family":"ipv4","address":"{{A}}","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 400, want: netboxDown},
			{body: `[`, status: 400, want: parseErr},
			{method: "GET", path: "/v2/address", status: 200, ctype: htmlCT, want: sim.CatchAllHTML},
			set(func(s *sim.Server) { s.SetNetBoxDown(false, "") }),
			{body: regN1S1, status: 200, want: updatedA},
		}},
		{name: "NetBox down: the body is NetBox's answer", simOnly: "needs a failing NetBox", steps: []step{
			set(func(s *sim.Server) { s.SetNetBoxDown(true, `{"detail":"Invalid token"}`) }),
			{body: regN1S1, status: 400, want: `{"message":"failed to fetch zones: {\"detail\":\"Invalid token\"}"}`},
		}},
		{name: "prefixes not loaded yet: 400 no prefixes found for a zone that exists", simOnly: "needs a restarting IPAM-API", steps: []step{
			first,
			set(func(s *sim.Server) { s.SetPrefixesLoading(true) }),
			{body: regN1S1, status: 400, want: noPrefixesLoading},
			{body: addrN2S1, status: 400, want: noPrefixesLoading, simCheck: unchanged},
			{method: "DELETE", body: relN1S1, status: 400, want: noPrefixesLoading, simCheck: notReleased},
			{path: "/", body: `{"secret":"{{s1}}","zone":"inet","ip_family":"ipv6","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 400, want: `{"message":"no prefixes found for zone inet with IP family ipv6"}`},
			{body: `{"secret":"{{s1}}","zone":"nowhere","ip_family":"ipv4","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 400, want: invalidZone},
			set(func(s *sim.Server) { s.SetPrefixesLoading(false) }),
			{method: "DELETE", body: relN1S1, status: 200, want: releasedA},
		}},
		{name: "MongoDB down: POST 500, DELETE 404, nothing done", simOnly: "needs a failing MongoDB", steps: []step{
			first,
			set(func(s *sim.Server) { _ = s.SetMongoDown(true, 0) }),
			{body: regN1S1, status: 500, want: mongoDownPOST},
			{body: regN2S1, status: 500, want: mongoDownPOST},
			{body: addrN2S1, status: 500, want: mongoDownPOST, simCheck: unchanged},
			{method: "DELETE", body: relN1S1, status: 404, want: mongoDownDELETE, simCheck: notReleased},
			{method: "DELETE", path: "/", body: relN1S1, status: 404, want: mongoDownDELETE, simCheck: notReleased},
			{body: `{"secret":"{{s1}}","zone":"nowhere","ip_family":"ipv4","service":{"service_name":"{{n1}}","namespace_id":"{{ns}}","cluster_id":"{{cl}}"}}`,
				status: 400, want: invalidZone},
			set(func(s *sim.Server) { s.ClearFaults() }),
			{body: regN1S1, status: 200, want: updatedA},
			{method: "DELETE", body: relN1S1, status: 200, want: releasedA},
		}},
	})
}
