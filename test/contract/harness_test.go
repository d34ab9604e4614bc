package contract

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// Environment of the suite:
//
//	IPAM_API_URL        root of a real deployment (a trailing "/v2" is stripped; routes
//	                    /v2/address, /v2/service and / are appended). Unset: a fresh
//	                    stand-in per case, default configuration, fake clock.
//	IPAM_API_ZONE       IPv4 zone used against a real server (default hnet-private).
//	IPAM_API_ZONE_CIDR  a container of that zone, for random explicit addresses (default 10.0.0.0/8).
//	IPAM_API_IPV6=1     also run the IPv6 allocation case against a real server.
const (
	jsonCT = "application/json; charset=utf-8"
	htmlCT = "text/html; charset=utf-8"
	noCT   = "-" // do not check the Content-Type
)

// target is where a case runs.
type target struct {
	base  string
	sim   *sim.Server // nil against a real server
	clock *clocktesting.FakeClock
	zone  string
	cidr  netip.Prefix
}

func (tg *target) real() bool { return tg.sim == nil }

var simEpoch = time.Date(2025, 6, 2, 10, 0, 0, 0, time.UTC)

func newTarget(t *testing.T) *target {
	t.Helper()
	if u := os.Getenv("IPAM_API_URL"); u != "" {
		u = strings.TrimSuffix(strings.TrimSuffix(u, "/"), "/v2")
		zone := envOr("IPAM_API_ZONE", "hnet-private")
		cidr, err := netip.ParsePrefix(envOr("IPAM_API_ZONE_CIDR", "10.0.0.0/8"))
		if err != nil || !cidr.Addr().Is4() {
			t.Fatalf("IPAM_API_ZONE_CIDR must be an IPv4 prefix: %v", err)
		}
		return &target{base: u, zone: zone, cidr: cidr.Masked()}
	}
	clk := clocktesting.NewFakeClock(simEpoch)
	s := sim.New(sim.Config{Clock: clk})
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return &target{base: ts.URL, sim: s, clock: clk, zone: "hnet-private", cidr: netip.MustParsePrefix("10.0.0.0/8")}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// step is one HTTP exchange (or, with do, one action on the stand-in).
type step struct {
	method string // default POST
	path   string // default /v2/address for POST, /v2/service for DELETE
	body   string // literal JSON with {{var}} placeholders
	status int
	ctype  string // expected Content-Type; default application/json; charset=utf-8
	// want is the exact body; {{var}} is substituted, {{var?}} captures a value.
	want string
	// sim gives the exact value a capture must have on the stand-in (whose state is fresh per case).
	sim map[string]string
	// differ lists pairs of variables that must differ (e.g. two allocations).
	differ [][2]string
	// header checks exact response header values.
	header map[string]string
	// simCheck inspects the stand-in after the step; skipped against a real server.
	simCheck func(g Gomega, c *caseRun)
	// do replaces the request by an action; such steps need the stand-in.
	do func(g Gomega, c *caseRun)
}

type contractCase struct {
	name    string
	simOnly string // why the case cannot run against a real server
	steps   []step
}

// caseRun is the state of one case: variables and registrations to clean up.
type caseRun struct {
	t    *testing.T
	tg   *target
	vars map[string]string
	regs []map[string]any
}

var placeholder = regexp.MustCompile(`\{\{([A-Za-z0-9_]+)(\?)?\}\}`)

func (c *caseRun) subst(s string) string {
	return placeholder.ReplaceAllStringFunc(s, func(m string) string {
		sub := placeholder.FindStringSubmatch(m)
		if sub[2] == "?" {
			return m
		}
		v, ok := c.vars[sub[1]]
		if !ok {
			c.t.Fatalf("undefined variable %s", sub[1])
		}
		return v
	})
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func newCaseRun(t *testing.T, tg *target) *caseRun {
	id := randHex(4)
	c := &caseRun{t: t, tg: tg, vars: map[string]string{
		"s1": "ct-s1-" + randHex(12), "s2": "ct-s2-" + randHex(12),
		"n1": "contract-" + id + "-1", "n2": "contract-" + id + "-2", "n3": "contract-" + id + "-3",
		"ns": "ns-" + randHex(8), "cl": "cl-" + randHex(8),
		"zone": tg.zone, "out": "192.0.2.10/32",
	}}
	free := netip.MustParseAddr("10.20.30.40")
	if tg.real() {
		free = randomHost(tg.cidr)
	}
	c.vars["free"] = free.String() + "/32"
	c.vars["freebare"] = free.String()
	t.Cleanup(c.cleanup)
	return c
}

// randomHost picks a random address of p (not its first), for claims on a shared server.
func randomHost(p netip.Prefix) netip.Addr {
	hostBits := 32 - p.Bits()
	span := new(big.Int).Lsh(big.NewInt(1), uint(hostBits))
	n, err := rand.Int(rand.Reader, new(big.Int).Sub(span, big.NewInt(1)))
	if err != nil {
		panic(err)
	}
	base := p.Addr().As4()
	v := new(big.Int).SetBytes(base[:])
	v.Add(v, n.Add(n, big.NewInt(1)))
	var out [4]byte
	v.FillBytes(out[:])
	return netip.AddrFrom4(out)
}

var client = &http.Client{
	Timeout:       30 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

func (c *caseRun) send(method, path, body string) (int, http.Header, string) {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.tg.base+path, rd)
	if err != nil {
		c.t.Fatalf("request: %v", err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("reading body: %v", err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

func (c *caseRun) runStep(i int, st step) {
	t := c.t
	t.Helper()
	g := NewWithT(t)
	if st.do != nil {
		st.do(g, c)
		return
	}
	method := st.method
	if method == "" {
		method = http.MethodPost
	}
	path := st.path
	if path == "" {
		path = map[string]string{http.MethodPost: "/v2/address", http.MethodDelete: "/v2/service"}[method]
	}
	reqBody := c.subst(st.body)
	status, hdr, got := c.send(method, path, reqBody)
	if status == http.StatusOK && method == http.MethodPost && strings.HasPrefix(got, "{") {
		c.track(reqBody, got)
	}
	where := func() string { return "step " + strconv.Itoa(i+1) + " " + method + " " + path + " " + reqBody }
	g.Expect(status).To(Equal(st.status), "%s\nbody: %s", where(), got)
	ctype := st.ctype
	if ctype == "" {
		ctype = jsonCT
	}
	if ctype != noCT {
		g.Expect(hdr.Get("Content-Type")).To(Equal(ctype), where())
	}
	for k, v := range st.header {
		g.Expect(hdr.Get(k)).To(Equal(v), where())
	}
	c.match(g, st, c.subst(st.want), got, where())
	for _, d := range st.differ {
		g.Expect(c.vars[d[0]]).NotTo(Equal(c.vars[d[1]]), "%s: %s and %s must differ", where(), d[0], d[1])
	}
	if st.simCheck != nil && !c.tg.real() {
		st.simCheck(g, c)
	}
}

// match compares got with want exactly, capturing {{var?}} parts.
func (c *caseRun) match(g Gomega, st step, want, got, where string) {
	locs := placeholder.FindAllStringSubmatchIndex(want, -1)
	if len(locs) == 0 {
		g.Expect(got).To(Equal(want), where)
		return
	}
	var re strings.Builder
	var names []string
	last := 0
	re.WriteString("^")
	for _, l := range locs {
		re.WriteString(regexp.QuoteMeta(want[last:l[0]]))
		re.WriteString(`([^"]+)`)
		names = append(names, want[l[2]:l[3]])
		last = l[1]
	}
	re.WriteString(regexp.QuoteMeta(want[last:]) + "$")
	m := regexp.MustCompile(re.String()).FindStringSubmatch(got)
	g.Expect(m).NotTo(BeNil(), "%s\nbody %q does not match %q", where, got, want)
	for i, name := range names {
		c.vars[name] = m[i+1]
		if exp, ok := st.sim[name]; ok && !c.tg.real() {
			g.Expect(m[i+1]).To(Equal(exp), "%s: captured %s", where, name)
		}
	}
}

// track remembers a successful registration so that cleanup can release it.
func (c *caseRun) track(reqBody, respBody string) {
	var req map[string]any
	var resp struct{ Address string }
	if json.Unmarshal([]byte(reqBody), &req) != nil || json.Unmarshal([]byte(respBody), &resp) != nil || resp.Address == "" {
		return
	}
	req["address"] = resp.Address
	c.regs = append(c.regs, req)
}

// cleanup releases (retention 0) everything the case registered, trying every secret
// and address form the case may have left it under. Failures are ignored.
func (c *caseRun) cleanup() {
	for _, reg := range c.regs {
		addr, _ := reg["address"].(string)
		addrs := []string{addr}
		if !strings.Contains(addr, "/") {
			if a, err := netip.ParseAddr(addr); err == nil {
				addrs = append(addrs, a.String()+"/"+map[bool]string{true: "32", false: "128"}[a.Is4()])
			}
		}
		secrets := []any{reg["secret"]}
		if ns, ok := reg["new_secret"]; ok {
			secrets = append(secrets, ns)
		}
		svc, _ := reg["service"].(map[string]any)
		if svc == nil {
			continue
		}
		svc["retention_period_days"] = 0
		for _, s := range secrets {
			for _, a := range addrs {
				b, _ := json.Marshal(map[string]any{"secret": s, "zone": reg["zone"], "ip_family": reg["ip_family"], "address": a, "service": svc})
				req, err := http.NewRequest(http.MethodDelete, c.tg.base+"/v2/service", bytes.NewReader(b))
				if err != nil {
					continue
				}
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			}
		}
	}
}

func runCases(t *testing.T, cases []contractCase) {
	t.Helper()
	names := map[string]bool{}
	for _, cc := range cases {
		if names[cc.name] {
			t.Fatalf("duplicate case name %q", cc.name)
		}
		names[cc.name] = true
		t.Run(cc.name, func(t *testing.T) {
			tg := newTarget(t)
			if tg.real() && cc.simOnly != "" {
				t.Skip("needs the stand-in: " + cc.simOnly)
			}
			c := newCaseRun(t, tg)
			for i, st := range cc.steps {
				c.runStep(i, st)
				if t.Failed() {
					return
				}
			}
		})
	}
}
